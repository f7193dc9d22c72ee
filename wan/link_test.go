package wan

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/portlock"
)

// stampServer answers each 8-byte request with the time it arrived (unix
// nanoseconds), then the request's own 8 bytes: the test measures each
// direction separately (same process, same clock).
func stampServer(c net.Conn) {
	buf := make([]byte, 8)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		arrived := time.Now().UnixNano()
		var out [16]byte
		for i := 0; i < 8; i++ {
			out[i] = byte(arrived >> (8 * i))
		}
		copy(out[8:], buf)
		if _, err := c.Write(out[:]); err != nil {
			return
		}
	}
}

// oneWay sends one request and returns the delay to the server and back.
func oneWay(t *testing.T, c net.Conn) (there, back time.Duration) {
	t.Helper()
	var req [8]byte
	sent := time.Now()
	for i := range req {
		req[i] = byte(i)
	}
	if _, err := c.Write(req[:]); err != nil {
		t.Fatal(err)
	}
	var resp [16]byte
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	var arrived int64
	for i := 0; i < 8; i++ {
		arrived |= int64(resp[i]) << (8 * i)
	}
	at := time.Unix(0, arrived)
	return at.Sub(sent), got.Sub(at)
}

// TestLatencyBothDirections: each direction of a link delays every byte by
// at least its latency, and SetLatency applies at once to both directions
// of a live connection. How little a request is late (timer slack and
// scheduling) is logged here and measured by BenchmarkRTT: on a busy
// machine it can be anything.
func TestLatencyBothDirections(t *testing.T) {
	up := startUpstream(t, stampServer)
	const latency = 200 * time.Millisecond
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), Latency: latency})
	c := dial(t, l.Addr())
	sample := func(n int) (theres, backs []time.Duration) {
		for i := 0; i < n; i++ {
			there, back := oneWay(t, c)
			theres, backs = append(theres, there), append(backs, back)
		}
		return theres, backs
	}
	// check: never early; with a faster-than limit, at least one request
	// beat it (the old latency no longer applies).
	check := func(dir string, ds []time.Duration, want, fasterThan time.Duration) {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("%s: min %s median %s max %s (want %s)", dir, ds[0], ds[len(ds)/2], ds[len(ds)-1], want)
		if ds[0] < want {
			t.Errorf("%s: a request took %s, less than the latency %s", dir, ds[0], want)
		}
		if fasterThan > 0 && ds[0] >= fasterThan {
			t.Errorf("%s: every request took %s or more, as under the old latency %s", dir, ds[0], fasterThan)
		}
	}
	theres, backs := sample(4)
	check("to upstream", theres, latency, 0)
	check("from upstream", backs, latency, 0)

	if err := l.SetLatency(10*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	theres, backs = sample(8)
	check("to upstream after SetLatency", theres, 10*time.Millisecond, latency)
	check("from upstream after SetLatency", backs, 10*time.Millisecond, latency)
	// Counters move just after the bytes are written: poll.
	waitFor(t, "byte counters", time.Minute, func() bool {
		s := l.Stats()
		return s.Latency == 10*time.Millisecond && s.BytesToUpstream == 12*8 && s.BytesFromUpstream == 12*16 && s.BytesHeld == 0
	})
}

// TestOrderUnderJitter pushes a large random stream through a link whose
// jitter is far larger than its latency, while the latency changes under
// it, and checks the echo by hash.
func TestOrderUnderJitter(t *testing.T) {
	up := startUpstream(t, nil)
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), Latency: time.Millisecond, Jitter: 20 * time.Millisecond, Seed: 42})
	c := dial(t, l.Addr())
	const total = 24 << 20
	rng := rand.New(rand.NewPCG(42, 1))
	data := make([]byte, total)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	want := sha256.Sum256(data)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // flip the latency while bytes flow
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(7 * time.Millisecond):
			}
			lat := time.Duration(i%3) * 15 * time.Millisecond
			if err := l.SetLatency(lat, 20*time.Millisecond); err != nil {
				t.Error(err)
			}
		}
	}()
	go func() { // write in random-sized pieces
		defer wg.Done()
		wrng := rand.New(rand.NewPCG(42, 2))
		for off := 0; off < total; {
			n := min(1+wrng.IntN(256<<10), total-off)
			if _, err := c.Write(data[off : off+n]); err != nil {
				t.Error(err)
				return
			}
			off += n
		}
		_ = c.CloseWrite()
	}()
	h := sha256.New()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, err := io.Copy(h, c)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("after %d bytes: %v", n, err)
	}
	if n != total {
		t.Fatalf("echoed %d bytes, want %d", n, total)
	}
	if got := h.Sum(nil); string(got) != string(want[:]) {
		t.Fatal("echoed stream differs from the stream sent (order or content)")
	}
	// Both ends closed: the connection goes away.
	waitFor(t, "connection to close", time.Minute, func() bool { return l.Stats().ConnsOpen == 0 })
	if s := l.Stats(); s.BytesToUpstream != total || s.BytesFromUpstream != total || s.BytesHeld != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCutBlackholeStallsThenHealResumes(t *testing.T) {
	up := startUpstream(t, nil)
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), Latency: 5 * time.Millisecond})
	old := dial(t, l.Addr())
	roundTrip(t, old, []byte("before"))

	if err := l.Cut(CutBlackhole); err != nil {
		t.Fatal(err)
	}
	// An existing connection: writes are accepted (they fill buffers),
	// nothing comes back, and nothing breaks.
	if _, err := old.Write([]byte("held-1")); err != nil {
		t.Fatal(err)
	}
	// A new connection: the TCP handshake completes (the kernel answers
	// for the proxy) but it is not dialled upstream while cut.
	fresh := dial(t, l.Addr())
	if _, err := fresh.Write([]byte("fresh")); err != nil {
		t.Fatal(err)
	}
	expectSilence(t, old, 150*time.Millisecond)
	expectSilence(t, fresh, 50*time.Millisecond)
	if _, err := old.Write([]byte("held-2")); err != nil {
		t.Fatal(err)
	}
	if n := up.accepted.Load(); n != 1 {
		t.Fatalf("upstream accepted %d connections during the cut, want 1 (the old one)", n)
	}
	s := l.Stats()
	if s.State != "blackhole" || s.ConnsOpen != 2 || s.Cuts != 1 {
		t.Fatalf("stats during the cut %+v", s)
	}

	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	// What was held is delivered, in order, and both connections carry on.
	got := make([]byte, len("held-1held-2"))
	_ = old.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(old, got); err != nil || string(got) != "held-1held-2" {
		t.Fatalf("after heal old conn read %q, %v", got, err)
	}
	got = make([]byte, len("fresh"))
	_ = fresh.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(fresh, got); err != nil || string(got) != "fresh" {
		t.Fatalf("after heal new conn read %q, %v", got, err)
	}
	roundTrip(t, old, []byte("after"))
	roundTrip(t, fresh, []byte("after"))
	if s := l.Stats(); s.State != "up" {
		t.Fatalf("stats after heal %+v", s)
	}
	waitFor(t, "nothing held", time.Minute, func() bool { return l.Stats().BytesHeld == 0 })
}

// TestBlackholeBackpressure: a sender into a blackhole is eventually
// blocked (its writes stop completing), as in a real partition, and the
// proxy stops reading at the cut: it holds at most the one read in
// progress, however large its buffer.
func TestBlackholeBackpressure(t *testing.T) {
	up := startUpstream(t, discard)
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr()})
	c := dial(t, l.Addr())
	roundTripDiscard := func() {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	roundTripDiscard()
	waitFor(t, "first byte delivered", time.Minute, func() bool { return l.Stats().BytesToUpstream == 1 })
	if err := l.Cut(CutBlackhole); err != nil {
		t.Fatal(err)
	}
	// Write until writes block (the kernel buffers on both sides fill);
	// a write deadline tells us when.
	chunk := make([]byte, 64<<10)
	var written int64
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	for {
		n, err := c.Write(chunk)
		written += int64(n)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatal(err)
			}
			break
		}
		if written > 1<<30 {
			t.Fatal("a blackholed link absorbed 1 GiB")
		}
	}
	_ = c.SetWriteDeadline(time.Time{})
	s := l.Stats()
	t.Logf("blocked after %d bytes; proxy holds %d", written, s.BytesHeld)
	if s.BytesHeld > blockBytes {
		t.Fatalf("proxy holds %d bytes after a cut, want at most one read (%d)", s.BytesHeld, blockBytes)
	}
	if written > 64<<20 {
		t.Fatalf("a blackholed link absorbed %d bytes before blocking the sender", written)
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "held bytes delivered", time.Minute, func() bool { return l.Stats().BytesToUpstream == 1+uint64(written) })
}

func TestCutReset(t *testing.T) {
	up := startUpstream(t, nil)
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), Latency: 2 * time.Millisecond})
	old := dial(t, l.Addr())
	roundTrip(t, old, []byte("before"))
	if err := l.Cut(CutReset); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, old)
	expectRefused(t, l.Addr()) // the handshake completes; the reset follows
	waitFor(t, "conns to close", time.Minute, func() bool { return l.Stats().ConnsOpen == 0 })
	if s := l.Stats(); s.State != "reset" || s.ConnsRefused < 1 {
		t.Fatalf("stats %+v", s)
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, dial(t, l.Addr()), []byte("after"))
}

// TestBlackholeThenReset: switching a blackhole to reset drops what was
// held; healing afterwards gives a clean link.
//
// The held bytes are put in place before the cut: a long latency keeps
// "lost" in the proxy's queue. (Written after the cut, they would be read
// only if the reader happened to be inside its read when the cut came,
// which the link does not promise: at most one read per direction.)
func TestBlackholeThenReset(t *testing.T) {
	up := startUpstream(t, nil)
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr()})
	c := dial(t, l.Addr())
	roundTrip(t, c, []byte("x"))
	if err := l.SetLatency(LatencyMax, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bytes held", time.Minute, func() bool { return l.Stats().BytesHeld == int64(len("lost")) })
	if err := l.Cut(CutBlackhole); err != nil {
		t.Fatal(err)
	}
	if err := l.Cut(CutReset); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, c)
	waitFor(t, "held bytes dropped", time.Minute, func() bool { return l.Stats().BytesHeld == 0 })
	if err := l.SetLatency(0, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, dial(t, l.Addr()), []byte("clean"))
	if got, want := l.Stats().BytesToUpstream, uint64(len("x")+len("clean")); got != want {
		t.Fatalf("upstream got %d bytes, want %d: the held bytes were delivered after the reset", got, want)
	}
	if s := l.Stats(); s.Cuts != 2 {
		t.Fatalf("cuts = %d, want 2 (blackhole, then reset)", s.Cuts)
	}
}

func TestConcurrentConnections(t *testing.T) {
	up := startUpstream(t, nil)
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), Latency: 10 * time.Millisecond, Jitter: 3 * time.Millisecond, Seed: 9})
	const conns, size = 24, 384 << 10
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs <- func() error {
				c, err := net.Dial("tcp", l.Addr())
				if err != nil {
					return err
				}
				defer c.Close()
				rng := rand.New(rand.NewPCG(uint64(i), 3))
				data := make([]byte, size)
				for j := range data {
					data[j] = byte(rng.Uint32())
				}
				go func() {
					_, _ = c.Write(data)
					_ = c.(*net.TCPConn).CloseWrite()
				}()
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				got, err := io.ReadAll(c)
				if err != nil {
					return fmt.Errorf("conn %d: %w", i, err)
				}
				if sha256.Sum256(got) != sha256.Sum256(data) {
					return fmt.Errorf("conn %d: echo differs (%d bytes of %d)", i, len(got), size)
				}
				return nil
			}()
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	waitFor(t, "conns to close", time.Minute, func() bool { return l.Stats().ConnsOpen == 0 })
	if s := l.Stats(); s.ConnsAccepted != conns || s.BytesToUpstream != conns*size || s.BytesFromUpstream != conns*size {
		t.Fatalf("stats %+v", s)
	}
}

// TestBandwidthCap: a capped link never delivers faster than its rate
// (minus the one block a read may take ahead); once the cap is removed the
// next bytes go faster than the cap allows. How close to the rate a
// capped link comes is a figure (BenchmarkBandwidthCap): on a busy
// machine it may be slower, which says nothing about the cap.
func TestBandwidthCap(t *testing.T) {
	up := startUpstream(t, discard)
	const rate = 1 << 20 // bytes per second
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), BandwidthBytesPerSecond: rate, BufferBytesMax: 256 << 10})
	c := dial(t, l.Addr())
	const total = 256 << 10
	start := time.Now()
	if _, err := c.Write(make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bytes delivered", time.Minute, func() bool { return l.Stats().BytesToUpstream == total })
	elapsed := time.Since(start)
	want := time.Duration(total) * time.Second / rate // 250 ms
	t.Logf("256 KiB at 1 MiB/s took %s (want ≈ %s)", elapsed, want)
	if floor := want - blockBytes*time.Second/rate; elapsed < floor {
		t.Fatalf("took %s, faster than the cap allows (%s)", elapsed, floor)
	}
	// Removing the cap takes effect for the next bytes: 8 MiB arrive
	// sooner than the 7.7 s the cap would take for them (less the link's
	// buffer and a block), a margin a busy machine does not use up.
	if err := l.SetBandwidth(0); err != nil {
		t.Fatal(err)
	}
	const more = 8 << 20
	start = time.Now()
	if _, err := c.Write(make([]byte, more)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bytes delivered", time.Minute, func() bool { return l.Stats().BytesToUpstream == total+more })
	elapsed = time.Since(start)
	t.Logf("8 MiB uncapped took %s", elapsed)
	if capped := time.Duration(more-(256<<10)-blockBytes) * time.Second / rate; elapsed >= capped {
		t.Fatalf("uncapped 8 MiB took %s, as long as the cap would (%s)", elapsed, capped)
	}
}

func TestHalfCloseTravels(t *testing.T) {
	// The upstream reads to EOF, then answers and closes: the client's
	// half-close must reach it, and its answer and EOF come back.
	up := startUpstream(t, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "got %d", n)
	})
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), Latency: 5 * time.Millisecond})
	c := dial(t, l.Addr())
	if _, err := c.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "got 1000" {
		t.Fatalf("read %q, %v", got, err)
	}
}

func TestUpstreamDownResetsClient(t *testing.T) {
	dead := portlock.Addr(t) // held, and nothing listens on it
	l := startLink(t, Config{Name: "a->b", Upstream: dead})
	expectRefused(t, l.Addr())
	waitFor(t, "dial error counted", time.Minute, func() bool { return l.Stats().DialErrors == 1 })
}

func TestConnsMax(t *testing.T) {
	up := startUpstream(t, nil)
	l := startLink(t, Config{Name: "a->b", Upstream: up.addr(), ConnsMax: 2})
	a, b := dial(t, l.Addr()), dial(t, l.Addr())
	roundTrip(t, a, []byte("a"))
	roundTrip(t, b, []byte("b"))
	expectRefused(t, l.Addr())
	if s := l.Stats(); s.ConnsRefused != 1 || s.ConnsOpen != 2 {
		t.Fatalf("stats %+v", s)
	}
	a.Close()
	waitFor(t, "a slot to free", time.Minute, func() bool { return l.Stats().ConnsOpen < 2 })
	roundTrip(t, dial(t, l.Addr()), []byte("c"))
}

func TestCloseResetsEverything(t *testing.T) {
	up := startUpstream(t, nil)
	goroutines := runtime.NumGoroutine()
	l, err := NewLink(Config{Name: "a->b", Upstream: up.addr(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, l.Addr())
	roundTrip(t, c, []byte("x"))
	if err := l.Cut(CutBlackhole); err != nil {
		t.Fatal(err)
	}
	held := dial(t, l.Addr())
	waitFor(t, "held conn", time.Minute, func() bool { return l.Stats().ConnsOpen == 2 })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, c)
	expectBroken(t, held)
	if _, err := net.DialTimeout("tcp", l.Addr(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded")
	}
	// Every goroutine of the link is gone (the upstream's handlers end
	// with the reset too).
	waitFor(t, "goroutines to exit", time.Minute, func() bool { return runtime.NumGoroutine() <= goroutines })
	for name, err := range map[string]error{"Close": l.Close(), "Cut": l.Cut(CutBlackhole), "Heal": l.Heal()} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func TestBadConfig(t *testing.T) {
	good := func() Config { return Config{Name: "a->b", Upstream: "127.0.0.1:9"} }
	for _, tc := range []struct {
		field  string
		modify func(*Config)
	}{
		{"Name", func(c *Config) { c.Name = "" }},
		{"Name", func(c *Config) { c.Name = "has space" }},
		{"Name", func(c *Config) { c.Name = "a/b" }},
		{"From", func(c *Config) { c.From = "x y" }},
		{"Upstream", func(c *Config) { c.Upstream = "" }},
		{"Upstream", func(c *Config) { c.Upstream = "nohostport" }},
		{"Upstream", func(c *Config) { c.Upstream = "127.0.0.1:0" }},
		{"Upstream", func(c *Config) { c.Upstream = ":80" }},
		{"Listen", func(c *Config) { c.Listen = "127.0.0.1:99999" }},
		{"Latency", func(c *Config) { c.Latency = -time.Millisecond }},
		{"Latency", func(c *Config) { c.Latency = LatencyMax + 1 }},
		{"Latency", func(c *Config) { c.Jitter = -1 }},
		{"BandwidthBytesPerSecond", func(c *Config) { c.BandwidthBytesPerSecond = -5 }},
		{"BufferBytesMax", func(c *Config) { c.BufferBytesMax = 100 }},
		{"BufferBytesMax", func(c *Config) { c.BufferBytesMax = 2 << 30 }},
		{"ConnsMax", func(c *Config) { c.ConnsMax = -1 }},
		{"DialTimeout", func(c *Config) { c.DialTimeout = -time.Second }},
	} {
		cfg := good()
		tc.modify(&cfg)
		l, err := NewLink(cfg)
		var ce *ConfigError
		if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: NewLink(%+v) = %v, want a ConfigError on %s", tc.field, cfg, err, tc.field)
		}
		if l != nil {
			l.Close()
		}
	}
	// Defaults: a name from the regions, regions from a name.
	l := startLink(t, Config{From: "x", To: "y", Upstream: "127.0.0.1:9"})
	if l.Name() != "x->y" {
		t.Errorf("name %q", l.Name())
	}
	l = startLink(t, Config{Name: "p->q.2", Upstream: "127.0.0.1:9"})
	if l.From() != "p" || l.To() != "q" {
		t.Errorf("regions %q %q", l.From(), l.To())
	}
	// Run-time arguments.
	for name, err := range map[string]error{
		"SetLatency":   l.SetLatency(-1, 0),
		"SetJitter":    l.SetLatency(0, LatencyMax+1),
		"SetBandwidth": l.SetBandwidth(-1),
		"Cut(0)":       l.Cut(0),
		"Cut(9)":       l.Cut(9),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := ParseCutMode("partition"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("ParseCutMode: %v", err)
	}
	// A taken listen address is an error, not a panic.
	if _, err := NewLink(Config{Name: "dup", Listen: l.Addr(), Upstream: "127.0.0.1:9"}); err == nil {
		t.Error("listening on a taken address succeeded")
	}
}
