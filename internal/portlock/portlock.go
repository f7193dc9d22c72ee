// Package portlock hands out loopback TCP ports to tests and test harnesses
// that must name a port before a server binds it: a PostgreSQL, a geologd
// or a geolog-wan in another process, an in-process node restarted on the
// address its peers know.
//
// Binding 127.0.0.1:0 and closing the listener is not enough on a busy
// machine. Between that close and the server's bind, the kernel may give
// the port to an outgoing connection of any process (it is an ephemeral
// port), and a second test run probing the same way may pick it too; a
// node killed and restarted leaves the same window open each time.
// portlock closes those windows:
//
//  1. Ports come from outside the kernel's ephemeral range
//     (net.ipv4.ip_local_port_range), which neither outgoing connections
//     nor bind to port 0 ever use: no one takes them by accident.
//  2. A port is held by an exclusive flock on a file named for it in one
//     folder shared by every process on the machine (/tmp/geolog-ports):
//     two runs, of one clone or of two, never hold the same port. The
//     kernel drops the lock when its holder exits, however it exits, so
//     no lock goes stale.
//  3. A port is handed out only if binding 127.0.0.1 on it works now: a
//     server someone started without asking keeps its port.
//
// What remains is a program that binds a fixed port without asking, after
// the probe; the caller's bind then fails and it may take another port.
//
// Lock files are never removed (removing one while another process opens
// it would let two processes lock different files for one port): the
// folder holds one empty file per port ever handed out, at most the
// range's size.
//
// GEOLOG_TEST_PORTS=LOW-HIGH overrides the range (DefaultRange).
package portlock

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ErrExhausted means every port of the range is held or busy.
var ErrExhausted = errors.New("portlock: no free port left in the range")

// Range is an inclusive range of TCP ports.
type Range struct {
	Min, Max int
}

// String formats r as LOW-HIGH.
func (r Range) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

func (r Range) size() int { return r.Max - r.Min + 1 }

// ParseRange parses LOW-HIGH, both in [1024, 65535], LOW <= HIGH.
func ParseRange(s string) (Range, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil || a < 1024 || b > 65535 || a > b {
		return Range{}, fmt.Errorf("portlock: port range %q: want LOW-HIGH within 1024-65535", s)
	}
	return Range{a, b}, nil
}

// rangeMinWidth is the narrowest stretch outside the ephemeral range worth
// using on its own: a 3×3 chaos cluster takes about 60 ports.
const rangeMinWidth = 1000

// DefaultRange is GEOLOG_TEST_PORTS if set, else the ports above the
// kernel's ephemeral range (61000-65535 with Linux's default
// 32768-60999), else those below it from 10000, else 10000-65535 (the
// locks and the probe still apply). An unparsable GEOLOG_TEST_PORTS is an
// error.
func DefaultRange() (Range, error) {
	if s := os.Getenv("GEOLOG_TEST_PORTS"); s != "" {
		return ParseRange(s)
	}
	lo, hi := ephemeralRange()
	if above := (Range{hi + 1, 65535}); above.size() >= rangeMinWidth {
		return above, nil
	}
	if below := (Range{10000, lo - 1}); below.size() >= rangeMinWidth {
		return below, nil
	}
	return Range{10000, 65535}, nil
}

// ephemeralRange reads the kernel's ephemeral port range; Linux's default
// when it cannot.
func ephemeralRange() (int, int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768, 60999
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768, 60999
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo > hi {
		return 32768, 60999
	}
	return lo, hi
}

// lockDir is the folder of the lock files, shared by every process on the
// machine. /tmp rather than $TMPDIR: two runs with different TMPDIRs still
// share the ports.
func lockDir() (string, error) {
	base := "/tmp"
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "geolog-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", fmt.Errorf("portlock: %w", err)
	}
	// Any user's runs share the folder (the umask may have narrowed it);
	// sticky, so no one removes another's files. Best effort: a folder
	// made by another user is theirs to set.
	_ = os.Chmod(dir, 0o777|os.ModeSticky)
	return dir, nil
}

// Port is a port held by this process until Release (or until the process
// exits).
type Port struct {
	number int
	mu     sync.Mutex
	lock   *os.File // nil once released
}

// Number is the port number.
func (p *Port) Number() int { return p.number }

// Addr is the port on 127.0.0.1, host:port.
func (p *Port) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.number)) }

// Release gives the port back. Safe to call more than once.
func (p *Port) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lock != nil {
		p.lock.Close() // closing the only descriptor drops the flock
		p.lock = nil
	}
}

// Take holds a free port of r, starting the search at a random port so that
// concurrent runs rarely contend for the same lock.
func Take(r Range) (*Port, error) {
	ports, err := TakeBlock(r, 1)
	if err != nil {
		return nil, err
	}
	return ports[0], nil
}

// TakeBlock holds n consecutive free ports of r (a port plan that is a base
// plus offsets), lowest first.
func TakeBlock(r Range, n int) ([]*Port, error) {
	if n <= 0 || r.Min < 1 || r.Max > 65535 || n > r.size() {
		return nil, fmt.Errorf("portlock: %d ports from %s", n, r)
	}
	dir, err := lockDir()
	if err != nil {
		return nil, err
	}
	bases := r.size() - n + 1
	start := rand.IntN(bases)
	for i := 0; i < bases; {
		base := r.Min + (start+i)%bases
		held, busy, err := tryBlock(dir, base, n)
		if err != nil {
			return nil, err
		}
		if held != nil {
			return held, nil
		}
		// The block starting at any port up to the busy one overlaps it.
		i += busy - base + 1
	}
	return nil, fmt.Errorf("%w (%d consecutive from %s)", ErrExhausted, n, r)
}

// tryBlock holds base..base+n-1, or none of them and the first port that
// could not be had.
func tryBlock(dir string, base, n int) ([]*Port, int, error) {
	var held []*Port
	for port := base; port < base+n; port++ {
		p, err := tryPort(dir, port)
		if err != nil || p == nil {
			for _, h := range held {
				h.Release()
			}
			return nil, port, err
		}
		held = append(held, p)
	}
	return held, 0, nil
}

// tryPort holds port if no one holds its lock and it can be bound now; nil
// (and no error) when it cannot be had.
func tryPort(dir string, port int) (*Port, error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, fmt.Errorf("portlock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil // another run holds it
		}
		return nil, fmt.Errorf("portlock: lock port %d: %w", port, err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		f.Close() // bound by someone who did not ask
		return nil, nil
	}
	l.Close()
	return &Port{number: port, lock: f}, nil
}

// TB is the part of testing.TB that Addr uses (this package does not import
// testing: the chaos harness's binary uses it too).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Addr holds a free port of DefaultRange for the rest of t and returns it
// as 127.0.0.1:port. It fails t if none can be had.
func Addr(t TB) string {
	t.Helper()
	r, err := DefaultRange()
	if err != nil {
		t.Fatalf("%v", err)
	}
	p, err := Take(r)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(p.Release)
	return p.Addr()
}
