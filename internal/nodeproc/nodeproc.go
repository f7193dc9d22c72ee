// Package nodeproc runs geologd as a real process for tests: build the
// binary once, start it on a free loopback port, kill it with SIGKILL or stop
// it with SIGTERM, and restart it on the same data.
package nodeproc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/portlock"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary builds cmd/geologd once per test process and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		dir, err := os.MkdirTemp("", "geologd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "geologd")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/geologd")
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build geologd: %v\n%s", err, b)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// FreeAddr holds a free loopback port for the rest of the test and returns
// its address (internal/portlock: no other run takes it, and a process
// restarted on it finds it free).
func FreeAddr(t testing.TB) string {
	t.Helper()
	return portlock.Addr(t)
}

// Proc is one geologd process.
type Proc struct {
	t    testing.TB
	Bin  string
	Args []string
	Addr string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	log    *bytes.Buffer
}

// syncBuffer guards a bytes.Buffer written by the process's output copier.
type syncBuffer struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (s syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// Start runs geologd with dataDir and addr plus extra flags. The process is
// killed at the end of the test. Without a TLS flag among extra (see
// TLSFlags) it runs with --insecure, which geologd wants said explicitly.
func Start(t testing.TB, dataDir, addr string, extra ...string) *Proc {
	t.Helper()
	if !hasTLSFlag(extra) {
		extra = append([]string{"--insecure"}, extra...)
	}
	p := &Proc{
		t:    t,
		Bin:  Binary(t),
		Args: append([]string{"--data-dir", dataDir, "--listen", addr, "--log-level", "warn"}, extra...),
		Addr: addr,
		log:  &bytes.Buffer{},
	}
	p.start()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("geologd %s output:\n%s", addr, p.Output())
		}
	})
	return p
}

// hasTLSFlag reports whether args choose geologd's transport security.
func hasTLSFlag(args []string) bool {
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch name {
		case "certs-dir", "tls-ca", "tls-cert", "tls-key", "insecure":
			if strings.HasPrefix(a, "-") {
				return true
			}
		}
	}
	return false
}

func (p *Proc) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.Bin, p.Args...)
	w := syncBuffer{&p.mu, p.log}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start geologd: %v", err)
	}
	p.cmd = cmd
	exited := make(chan struct{})
	p.exited = exited
	go func() { cmd.Wait(); close(exited) }()
}

// Output returns what the process (all its incarnations) printed.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() { p.signal(syscall.SIGKILL) }

// Stop sends SIGTERM and waits up to 10 s, then SIGKILL.
func (p *Proc) Stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

func (p *Proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	<-exited
}

// Restart starts the process again with the same flags (after Kill/Stop).
func (p *Proc) Restart() {
	select {
	case <-p.exited:
	default:
		p.t.Fatal("nodeproc: Restart while the process runs")
	}
	p.start()
}

// Signal sends sig to the current process without waiting (SIGHUP makes
// geologd reload its TLS files).
func (p *Proc) Signal(sig syscall.Signal) { p.send(sig) }

// Pause sends SIGSTOP; Resume sends SIGCONT.
func (p *Proc) Pause()  { p.send(syscall.SIGSTOP) }
func (p *Proc) Resume() { p.send(syscall.SIGCONT) }

// send signals the current process without waiting.
func (p *Proc) send(sig syscall.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	cmd.Process.Signal(sig)
}

// Region starts size geologd processes forming one replicated region on
// free loopback ports; extra flags go to every node.
func Region(t testing.TB, size int, extra ...string) []*Proc {
	t.Helper()
	addrs := make([]string, size)
	var peers []string
	for i := range addrs {
		addrs[i] = FreeAddr(t)
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, addrs[i]))
	}
	procs := make([]*Proc, size)
	for i := range procs {
		args := append([]string{"--node-id", fmt.Sprint(i + 1), "--peers", strings.Join(peers, ",")}, extra...)
		procs[i] = Start(t, t.TempDir(), addrs[i], args...)
	}
	return procs
}

// Pid returns the current process id.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}
