package wan

// Benchmarks run the proxy in a child process (this test binary, re-executed
// with WAN_BENCH_CHILD set), so that its CPU time, read from the child's
// getrusage, is the proxy's alone: the load generator and the sink stay in
// the parent. The same harness ran toxiproxy v2.5.0 (in-process library,
// latency toxic on both streams) for comparison; doc.go keeps the figures.
// That comparison was dropped with the dependency, which only this
// benchmark used:
//
//	go test -run '^$' -bench . -benchtime 3s ./wan/

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if kind := os.Getenv("WAN_BENCH_CHILD"); kind != "" {
		os.Exit(benchChild(kind))
	}
	os.Exit(m.Run())
}

// benchChild runs one proxy (kind "own") to
// WAN_BENCH_UPSTREAM with WAN_BENCH_LATENCY_MS each way, prints its address,
// answers "cpu" lines on stdin with its CPU time in microseconds, and exits
// when stdin closes.
func benchChild(kind string) int {
	upstreamAddr := os.Getenv("WAN_BENCH_UPSTREAM")
	latencyMs, err := strconv.Atoi(os.Getenv("WAN_BENCH_LATENCY_MS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad WAN_BENCH_LATENCY_MS:", err)
		return 2
	}
	var addr string
	switch kind {
	case "own":
		l, err := NewLink(Config{Name: "bench", Upstream: upstreamAddr, Latency: time.Duration(latencyMs) * time.Millisecond})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer l.Close()
		addr = l.Addr()
	default:
		fmt.Fprintln(os.Stderr, "unknown proxy kind", kind)
		return 2
	}
	fmt.Println(addr)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		fmt.Println(cpu.Microseconds())
	}
	return 0
}

type childProxy struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	addr  string
}

func startChildProxy(tb testing.TB, kind, upstreamAddr string, latency time.Duration) *childProxy {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"WAN_BENCH_CHILD="+kind,
		"WAN_BENCH_UPSTREAM="+upstreamAddr,
		"WAN_BENCH_LATENCY_MS="+strconv.Itoa(int(latency/time.Millisecond)))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &childProxy{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	tb.Cleanup(func() {
		c.stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := c.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("child proxy: %v", err)
	}
	c.addr = strings.TrimSpace(line)
	return c
}

// cpu returns the child's CPU time (user + system) so far.
func (c *childProxy) cpu(tb testing.TB) time.Duration {
	tb.Helper()
	if _, err := io.WriteString(c.stdin, "cpu\n"); err != nil {
		tb.Fatal(err)
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		tb.Fatal(err)
	}
	us, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return time.Duration(us) * time.Microsecond
}

// countingSink is an upstream that discards what it reads and counts it.
func countingSink(tb testing.TB) (*upstream, *atomic.Int64) {
	var n atomic.Int64
	up := startUpstream(tb, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		for {
			k, err := c.Read(buf)
			n.Add(int64(k))
			if err != nil {
				return
			}
		}
	})
	return up, &n
}

var proxyKinds = []string{"own"}

// BenchmarkThroughput streams 1 MiB writes as fast as the link takes them
// through a 40 ms link on one connection. Metrics: MB/s (from SetBytes),
// the proxy's CPU per GB, and its CPU use in % of one core.
func BenchmarkThroughput(b *testing.B) {
	for _, kind := range proxyKinds {
		b.Run(kind, func(b *testing.B) { benchStream(b, kind, 0) })
	}
}

// BenchmarkPaced80MBps offers 80 MB/s (the top of the replication range)
// through a 40 ms link: the proxy's CPU at that load, and whether it keeps
// up (MB/s achieved).
func BenchmarkPaced80MBps(b *testing.B) {
	for _, kind := range proxyKinds {
		b.Run(kind, func(b *testing.B) { benchStream(b, kind, 80e6) })
	}
}

func benchStream(b *testing.B, kind string, rateBytesPerSecond float64) {
	up, received := countingSink(b)
	child := startChildProxy(b, kind, up.addr(), 40*time.Millisecond)
	c := dial(b, child.addr)
	const chunk = 1 << 20
	buf := make([]byte, chunk)
	// Warm up: the first bytes pay the latency and TCP's window growth.
	for i := 0; i < 8; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	waitFor(b, "warm-up delivered", 30*time.Second, func() bool { return received.Load() == 8*chunk })
	b.SetBytes(chunk)
	cpu0 := child.cpu(b)
	start := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if rateBytesPerSecond > 0 {
			if wait := time.Until(start.Add(time.Duration(float64(i*chunk) / rateBytesPerSecond * 1e9))); wait > 0 {
				time.Sleep(wait) // pacing the offered load, not waiting for a condition
			}
		}
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	want := int64(8*chunk) + int64(b.N)*chunk
	deadline := time.Now().Add(60 * time.Second)
	for received.Load() < want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	elapsed := time.Since(start)
	if got := received.Load(); got != want {
		b.Fatalf("received %d bytes, want %d", got, want)
	}
	cpu := child.cpu(b) - cpu0
	bytes := float64(b.N) * chunk
	b.ReportMetric(cpu.Seconds()/(bytes/1e9), "cpu-s/GB")
	b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds(), "cpu-%")
}

// BenchmarkRTT measures the round trip of a 64-byte request through a link
// of 40 ms each way (want 80 ms), alone and while another connection of the
// same link streams at 50 MB/s. Metrics: p50 and max in ms.
func BenchmarkRTT(b *testing.B) {
	for _, kind := range proxyKinds {
		for _, loaded := range []bool{false, true} {
			name := kind + "/idle"
			if loaded {
				name = kind + "/loaded-50MBps"
			}
			b.Run(name, func(b *testing.B) { benchRTT(b, kind, loaded) })
		}
	}
}

func benchRTT(b *testing.B, kind string, loaded bool) {
	// One upstream: echo for the pings, discard for the bulk connection
	// (which announces itself with a first byte 'B').
	up := startUpstream(b, func(c net.Conn) {
		var first [1]byte
		if _, err := io.ReadFull(c, first[:]); err != nil {
			return
		}
		if first[0] == 'B' {
			discard(c)
			return
		}
		if _, err := c.Write(first[:]); err != nil {
			return
		}
		echo(c)
	})
	child := startChildProxy(b, kind, up.addr(), 40*time.Millisecond)
	if loaded {
		bulk := dial(b, child.addr)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 256<<10)
			buf[0] = 'B'
			start := time.Now()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if wait := time.Until(start.Add(time.Duration(float64(i*len(buf)) / 50e6 * 1e9))); wait > 0 {
					time.Sleep(wait) // pacing
				}
				if _, err := bulk.Write(buf); err != nil {
					return
				}
			}
		}()
		b.Cleanup(func() { close(stop); bulk.Close(); <-done })
		time.Sleep(200 * time.Millisecond) // let the bulk stream reach its rate
	}
	c := dial(b, child.addr)
	msg := make([]byte, 64)
	roundTrip(b, c, msg)
	rtts := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rtts = append(rtts, roundTrip(b, c, msg))
	}
	b.StopTimer()
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(rtts[len(rtts)/2]), "p50-ms")
	b.ReportMetric(ms(rtts[len(rtts)-1]), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkBandwidthCap sends 2 MiB through a link capped at 8 MiB/s per
// iteration and reports the rate achieved as a share of the cap (want
// close to 100%; TestBandwidthCap only checks that it is never above).
func BenchmarkBandwidthCap(b *testing.B) {
	up, received := countingSink(b)
	const rate = 8 << 20
	l := startLink(b, Config{Name: "a->b", Upstream: up.addr(), BandwidthBytesPerSecond: rate, BufferBytesMax: 256 << 10})
	c := dial(b, l.Addr())
	const chunk = 2 << 20
	buf := make([]byte, chunk)
	b.SetBytes(chunk)
	start := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		want := int64(i+1) * chunk
		waitFor(b, "bytes delivered", time.Minute, func() bool { return received.Load() == want })
	}
	b.StopTimer()
	achieved := float64(b.N) * chunk / time.Since(start).Seconds()
	b.ReportMetric(100*achieved/rate, "%-of-cap")
}
