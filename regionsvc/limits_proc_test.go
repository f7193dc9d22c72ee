package regionsvc_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/regionsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The memory probes, against a real geologd: each gets INVALID_ARGUMENT
// or RESOURCE_EXHAUSTED (OVERLOADED), the node stays alive, and its peak
// resident memory (VmHWM) stays under 1 GiB. The node runs as an operator
// would run it, with a memory limit below that (--memory-limit).

const rssMax = 1 << 30

// probeNode starts a one-node region with a memory limit, and a stream.
func probeNode(t *testing.T, extra ...string) (*nodeproc.Proc, *grpc.ClientConn) {
	t.Helper()
	if testing.Short() {
		t.Skip("real-process test")
	}
	p := nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), append([]string{"--memory-limit", "700MiB"}, extra...)...)
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, ctx, "the node answers", func() bool {
		_, err := geologv1.NewLogClient(conn).ListStreams(ctx, &geologv1.ListStreamsRequest{})
		return err == nil
	})
	return p, conn
}

// peakRSS is the process's peak resident memory (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// checkAlive checks that the node answers an append and a read, and that
// its peak memory stayed under rssMax.
func checkAlive(t *testing.T, p *nodeproc.Proc, conn *grpc.ClientConn, stream string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := geologv1.NewLogClient(conn)
	waitFor(t, ctx, "an append after the probe", func() bool {
		_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: stream, Records: []*geologv1.Record{{Value: []byte("after")}}})
		return err == nil
	})
	// A read may be shed (OVERLOADED, retriable) while the probe's
	// subscribers or reads still hold the node's read budget: it must be
	// answered once the node has cut them off.
	var readErr error
	waitFor(t, ctx, "a read after the probe", func() bool {
		_, readErr = c.Read(ctx, &geologv1.ReadRequest{Stream: stream, MaxRecords: 1})
		if readErr != nil && !rpcerr.IsRetriable(readErr) {
			t.Fatalf("read after the probe: %v", readErr)
		}
		return readErr == nil
	})
	rss := peakRSS(t, p.Pid())
	t.Logf("peak resident memory %d MiB", rss>>20)
	if rss >= rssMax {
		t.Fatalf("peak resident memory %d MiB, over %d MiB", rss>>20, rssMax>>20)
	}
}

// rawCodec sends []byte messages as they are (requests built on the wire
// by the test, which would not fit in its memory as structs) and decodes
// replies as protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// rawAppend sends an encoded AppendRequest.
func rawAppend(ctx context.Context, conn *grpc.ClientConn, wire []byte) error {
	return conn.Invoke(ctx, "/geolog.v1.Log/Append", wire, new(geologv1.AppendResponse), grpc.ForceCodecV2(rawCodec{}))
}

// appendWire encodes an AppendRequest to stream of n records, each with a
// value of valueBytes (0: empty records, two bytes each on the wire).
func appendWire(stream string, n, valueBytes int) []byte {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, stream)
	var rec []byte
	if valueBytes > 0 {
		rec = protowire.AppendTag(nil, 2, protowire.BytesType)
		rec = protowire.AppendBytes(rec, make([]byte, valueBytes))
	}
	for range n {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, rec)
	}
	return b
}

func createProbeStream(t *testing.T, conn *grpc.ClientConn, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := geologv1.NewLogClient(conn).CreateStream(ctx, &geologv1.CreateStreamRequest{Name: name, RangeCount: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestProbeEmptyRecords: appends of ten million empty records (20 MB, over
// the receive limit) and of eight million (16 MB, within it), four at a
// time each: RESOURCE_EXHAUSTED for the first (refused on their length,
// unread), INVALID_ARGUMENT for the second (refused on their record count,
// counted on the wire: no record decoded); none is appended.
func TestProbeEmptyRecords(t *testing.T) {
	t.Parallel()
	p, conn := probeNode(t)
	createProbeStream(t, conn, "e")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		records int
		want    codes.Code
	}{{10_000_000, codes.ResourceExhausted}, {8_000_000, codes.InvalidArgument}} {
		wire := appendWire("e", tc.records, 0)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = rawAppend(ctx, conn, wire) }()
		}
		wg.Wait()
		for i, err := range errs {
			if status.Code(err) != tc.want {
				t.Fatalf("%d empty records (%d MB), append %d: %v, want %s", tc.records, len(wire)/1e6, i, err, tc.want)
			}
		}
		t.Logf("%d empty records (%d MB) x4: %v", tc.records, len(wire)/1_000_000, errs[0])
	}
	rr, err := geologv1.NewLogClient(conn).Read(ctx, &geologv1.ReadRequest{Stream: "e"})
	if err != nil || rr.GetTailOffset() != 0 {
		t.Fatalf("the stream holds %d records (%v)", rr.GetTailOffset(), err)
	}
	checkAlive(t, p, conn, "e")
}

// TestProbeLargeBatches: 150 producers each send a 15 MiB batch at once.
// The node takes what its budgets hold and refuses the rest with
// OVERLOADED (RESOURCE_EXHAUSTED, a retry-after), answering every one.
func TestProbeLargeBatches(t *testing.T) {
	t.Parallel()
	p, conn := probeNode(t)
	createProbeStream(t, conn, "l")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wire := appendWire("l", 15, 1<<20-64) // 15 records of just under the 1 MiB record bound
	conns := probeConns(t, p.Addr, 10)
	var wg sync.WaitGroup
	errs := make([]error, 150)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = rawAppend(ctx, conns[i%len(conns)], wire) }()
	}
	wg.Wait()
	ok, overloaded := appendOutcomes(t, errs)
	t.Logf("150 batches of %d MiB: %d appended, %d refused with OVERLOADED", len(wire)>>20, ok, overloaded)
	if overloaded == 0 {
		t.Fatal("no batch was refused: the probe did not reach the budgets")
	}
	checkAlive(t, p, conn, "l")
}

// TestProbeLargeReads: 60 reads of 32 MiB at once from a range that holds
// more: the node sends what its read budget holds and refuses the rest
// with OVERLOADED.
func TestProbeLargeReads(t *testing.T) {
	t.Parallel()
	p, conn := probeNode(t)
	createProbeStream(t, conn, "r")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wire := appendWire("r", 8, 1<<20-64)
	for range 6 { // 48 MiB
		if err := rawAppend(ctx, conn, wire); err != nil {
			t.Fatal(err)
		}
	}
	c := geologv1.NewLogClient(conn)
	var wg sync.WaitGroup
	errs := make([]error, 60)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.Read(ctx, &geologv1.ReadRequest{Stream: "r", MaxBytes: 32 << 20, MaxRecords: 100_000})
		}()
	}
	wg.Wait()
	ok, overloaded := 0, 0
	for i, err := range errs {
		switch e := rpcerr.FromError(err); {
		case err == nil:
			ok++
		case e.Code == apierr.Overloaded && e.Retriable && e.RetryAfter > 0:
			overloaded++
		default:
			t.Fatalf("read %d: %v", i, err)
		}
	}
	t.Logf("60 reads of 32 MiB: %d answered, %d refused with OVERLOADED", ok, overloaded)
	if ok == 0 || overloaded == 0 {
		t.Fatal("the probe did not reach the read budget")
	}
	checkAlive(t, p, conn, "r")
}

// TestProbeIdleSubscribers: 100 subscribers that never read: each holds
// one message of the read budget until it is cut off with SLOW_CONSUMER;
// the node serves other subscribers meanwhile and after.
func TestProbeIdleSubscribers(t *testing.T) {
	t.Parallel()
	p, conn := probeNode(t, "--subscriber-send-timeout", "3s")
	createProbeStream(t, conn, "s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wire := appendWire("s", 8, 1<<20-64)
	for range 4 { // 32 MiB: more than a subscriber's window
		if err := rawAppend(ctx, conn, wire); err != nil {
			t.Fatal(err)
		}
	}
	subs := make([]geologv1.Log_SubscribeClient, 100)
	for i := range subs {
		c, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if subs[i], err = geologv1.NewLogClient(c).Subscribe(ctx, &geologv1.SubscribeRequest{Stream: "s",
			Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: 0}}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Second) // the subscribers take nothing meanwhile
	checkAlive(t, p, conn, "s")
	// Which subscribers are cut depends on when the node's memory crosses
	// its budget: one that was not cut may read the whole log (32 records)
	// and then waits at the tail. Either is fine; none may fail otherwise.
	const records = 4 * 8
	cut, caughtUp := 0, 0
	for i, s := range subs {
		var err error
		for err == nil {
			var m *geologv1.SubscribeResponse
			if m, err = s.Recv(); err == nil && m.GetNextOffset() >= records {
				break
			}
		}
		switch {
		case err == nil:
			caughtUp++
		case rpcerr.CodeOf(err) == apierr.SlowConsumer, rpcerr.CodeOf(err) == apierr.Overloaded:
			cut++
		default:
			t.Fatalf("subscriber %d ended with %v", i, err)
		}
	}
	if cut == 0 {
		t.Fatal("no idle subscriber was cut off")
	}
	t.Logf("100 idle subscribers: %d cut off, %d read everything", cut, caughtUp)
	checkAlive(t, p, conn, "s")
}

// TestProbeIdleConnections: as many idle connections as this process can
// open (the 20,000 where the limit allows) neither exhaust the
// node's file descriptors nor stop it serving a client from another
// address; those past its bounds are closed at once, and the rest once
// their handshake times out.
func TestProbeIdleConnections(t *testing.T) {
	t.Parallel()
	limit, err := regionsvc.RaiseFileLimit()
	if err != nil {
		t.Fatal(err)
	}
	p, conn := probeNode(t, "--handshake-timeout", "5s")
	createProbeStream(t, conn, "c")
	n := min(20_000, int(limit)-1024)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for len(conns) < n {
		c, err := net.DialTimeout("tcp", p.Addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	fds := openFDs(t, p.Pid())
	t.Logf("%d idle connections open from 127.0.0.1; the node holds %d file descriptors", n, fds)
	if fds >= nodeFileLimit(t, p.Pid()) {
		t.Fatalf("the node holds %d descriptors, its limit", fds)
	}
	// A client from another address is served.
	other, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	checkAlive(t, p, other, "c")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFor(t, ctx, "idle connections closed after the handshake timeout", func() bool { return openFDs(t, p.Pid()) < 1000 })
}

func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// nodeFileLimit is the process's soft RLIMIT_NOFILE.
func nodeFileLimit(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 5 && strings.HasPrefix(line, "Max open files") {
			n, err := strconv.Atoi(f[3])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no open files limit")
	return 0
}

// TestProbeRangeCap: six creates of 4,000 ranges (creates like these all
// returned OK while their ranges could not open: "too many open files") on
// a node with the default bounds: those past the node's range bound are
// refused up front with LIMIT_EXCEEDED, and every range of those accepted
// serves. A retention that would overflow is refused, and leaves the name
// free: the accepted creates leave room below the bound for its one range.
func TestProbeRangeCap(t *testing.T) {
	t.Parallel()
	p, conn := probeNode(t)
	c := geologv1.NewLogClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const bigRanges = 4000
	accepted := 0
	for i := range 6 {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: fmt.Sprintf("big%d", i), RangeCount: bigRanges})
		switch rpcerr.CodeOf(err) {
		case apierr.Code(0):
			accepted++
		case apierr.LimitExceeded:
			t.Logf("create %d: %v", i, err)
		default:
			t.Fatalf("create %d: %v", i, err)
		}
	}
	if accepted == 0 || accepted == 6 {
		t.Fatalf("%d of 6 creates accepted", accepted)
	}
	for i := range accepted {
		d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: fmt.Sprintf("big%d", i)}, grpc.MaxCallRecvMsgSize(64<<20))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range d.GetRanges() {
			if r.GetStatus() != "ok" {
				t.Fatalf("big%d range %d: %s", i, r.GetRange(), r.GetStatus())
			}
		}
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: d.GetStream().GetName(), Range: bigRanges - 1, Records: []*geologv1.Record{{Value: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d of 6 creates of %d ranges accepted; the node holds %d file descriptors of %d", accepted, bigRanges, openFDs(t, p.Pid()), nodeFileLimit(t, p.Pid()))
	_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "age", RangeCount: 1, Retention: &geologv1.RetentionPolicy{MaxAgeMs: 9_300_000_000_000}})
	if rpcerr.CodeOf(err) != apierr.InvalidArgument {
		t.Fatalf("retention overflow: %v", err)
	}
	if _, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "age", RangeCount: 1, Retention: &geologv1.RetentionPolicy{MaxAgeMs: 86_400_000}}); err != nil {
		t.Fatalf("the name after the refused create: %v", err)
	}
	checkAlive(t, p, conn, "age")
}

// TestProbeWaitingLargeRequests: 256 appends of about 15 MiB at once on
// 16 connections, more than the node reads at once: each waits for a
// receive slot holding at most its stream's flow-control window, the
// node reads a few at a time, refuses the rest with OVERLOADED, and its
// peak memory stays under rssMax.
func TestProbeWaitingLargeRequests(t *testing.T) {
	t.Parallel()
	p, conn := probeNode(t)
	createProbeStream(t, conn, "w")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	wire := appendWire("w", 15, 1<<20-64)
	conns := probeConns(t, p.Addr, 16)
	var wg sync.WaitGroup
	errs := make([]error, 256)
	for i := range errs {
		wg.Go(func() { errs[i] = rawAppend(ctx, conns[i%len(conns)], wire) })
	}
	wg.Wait()
	ok, overloaded := appendOutcomes(t, errs)
	t.Logf("256 batches of %d MiB: %d appended, %d refused with OVERLOADED", len(wire)>>20, ok, overloaded)
	checkAlive(t, p, conn, "w")
}

// appendOutcomes counts the appends of errs that succeeded and those
// refused with a retriable OVERLOADED, failing the test on any other
// answer.
func appendOutcomes(t *testing.T, errs []error) (ok, overloaded int) {
	t.Helper()
	for i, err := range errs {
		switch e := rpcerr.FromError(err); {
		case err == nil:
			ok++
		case e.Code == apierr.Overloaded && e.Retriable:
			overloaded++
		default:
			t.Fatalf("producer %d: %v", i, err)
		}
	}
	return ok, overloaded
}

// probeConns opens n client connections to addr, closed when the test
// ends: requests spread over them reach the node's per-connection and
// per-node bounds alike.
func probeConns(t *testing.T, addr string, n int) []*grpc.ClientConn {
	t.Helper()
	conns := make([]*grpc.ClientConn, n)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns
}
