package portlock

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

func defaultRange(t *testing.T) Range {
	t.Helper()
	r, err := DefaultRange()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDefaultRangeAvoidsEphemeralPorts(t *testing.T) {
	t.Setenv("GEOLOG_TEST_PORTS", "")
	r := defaultRange(t)
	lo, hi := ephemeralRange()
	if r.Min <= hi && r.Max >= lo && (r != Range{10000, 65535}) {
		t.Fatalf("default range %s overlaps the ephemeral range %d-%d", r, lo, hi)
	}
	if r.size() < rangeMinWidth {
		t.Fatalf("default range %s is narrower than %d ports", r, rangeMinWidth)
	}
	t.Setenv("GEOLOG_TEST_PORTS", "20000-20099")
	if r := defaultRange(t); (r != Range{20000, 20099}) {
		t.Fatalf("GEOLOG_TEST_PORTS=20000-20099 gave %s", r)
	}
	t.Setenv("GEOLOG_TEST_PORTS", "7000")
	if _, err := DefaultRange(); err == nil {
		t.Fatal("GEOLOG_TEST_PORTS=7000 accepted")
	}
}

func TestParseRange(t *testing.T) {
	for _, bad := range []string{"", "1-", "-5", "80-90", "5000-4000", "60000-70000", "a-b", "1024:2048"} {
		if _, err := ParseRange(bad); err == nil {
			t.Errorf("ParseRange(%q) accepted", bad)
		}
	}
	if r, err := ParseRange(" 1024-65535 "); err != nil || (r != Range{1024, 65535}) {
		t.Fatalf("ParseRange: %v %v", r, err)
	}
}

// TestHeldPortIsNotHandedOutAgain: while one holder has a port, another
// Take of a range made of that port alone finds nothing; after Release it
// gets it.
func TestHeldPortIsNotHandedOutAgain(t *testing.T) {
	p, err := Take(defaultRange(t))
	if err != nil {
		t.Fatal(err)
	}
	only := Range{p.Number(), p.Number()}
	if q, err := Take(only); !errors.Is(err, ErrExhausted) {
		t.Fatalf("took held port %d again: %v %v", p.Number(), q, err)
	}
	p.Release()
	p.Release() // twice is fine
	q, err := Take(only)
	if err != nil {
		t.Fatalf("released port %d: %v", p.Number(), err)
	}
	q.Release()
}

// TestBusyPortIsSkipped: a port someone listens on without a lock is not
// handed out.
func TestBusyPortIsSkipped(t *testing.T) {
	p, err := Take(defaultRange(t))
	if err != nil {
		t.Fatal(err)
	}
	port := p.Number()
	p.Release()
	l, err := net.Listen("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if q, err := Take(Range{port, port}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("handed out port %d while it is listened on: %v %v", port, q, err)
	}
	// The block around it skips it.
	if port > 1024 && port < 65535 {
		ps, err := TakeBlock(Range{port - 1, port + 1}, 2)
		if err == nil {
			defer release(ps)
			t.Fatalf("block %d-%d includes busy port %d", ps[0].Number(), ps[1].Number(), port)
		}
	}
}

func release(ps []*Port) {
	for _, p := range ps {
		p.Release()
	}
}

func TestTakeBlockIsConsecutiveAndDistinct(t *testing.T) {
	r := defaultRange(t)
	a, err := TakeBlock(r, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer release(a)
	b, err := TakeBlock(r, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer release(b)
	seen := map[int]bool{}
	for _, block := range [][]*Port{a, b} {
		for i, p := range block {
			if p.Number() != block[0].Number()+i {
				t.Fatalf("block not consecutive: port %d at %d after %d", p.Number(), i, block[0].Number())
			}
			if p.Number() < r.Min || p.Number() > r.Max {
				t.Fatalf("port %d outside %s", p.Number(), r)
			}
			if seen[p.Number()] {
				t.Fatalf("port %d handed out twice", p.Number())
			}
			seen[p.Number()] = true
		}
	}
	if _, err := TakeBlock(Range{2000, 2001}, 3); err == nil {
		t.Fatal("3 ports from a range of 2")
	}
}

// TestLockHoldsAcrossProcesses: another process (this test binary again)
// cannot take a port this one holds.
func TestLockHoldsAcrossProcesses(t *testing.T) {
	if s := os.Getenv("GEOLOG_PORTLOCK_CHILD"); s != "" {
		port, _ := strconv.Atoi(s)
		if _, err := Take(Range{port, port}); !errors.Is(err, ErrExhausted) {
			t.Fatalf("child took port %d held by its parent: %v", port, err)
		}
		return
	}
	p, err := Take(defaultRange(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHoldsAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GEOLOG_PORTLOCK_CHILD="+strconv.Itoa(p.Number()))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
