package replicator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	testStream = "chat"
	testRange  = uint32(3)
	homeRegion = "eu"
	dstRegion  = "us"
)

// testLogger routes logs to t.Log.
func testLogger(t testing.TB, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: testWriter{t}})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitFor polls cond every 5 ms until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// words is the vocabulary of the generated chat messages.
var words = strings.Fields(`the a to and of in is it you that he was for on are with as
his they be at one have this from or had by hot word but what some we can out other were all
there when up use your how said an each she which do their time if will way about many then
them write would like so these her long make thing see him two has look more day could go come
did number sound no most people my over know water than call first who may down side been now
find any new work part take get place made live where after back little only round man year
came show every good me give our under name very through just form sentence great think say
help low line differ turn cause much mean before move right boy old too same tell does set
three want air well also play small end put home read hand port large spell add even land here
must big high such follow act why ask men change went light kind off need house picture try us
again animal point mother world near build self earth father meeting deploy release tonight
tomorrow lunch coffee review merge branch ticket customer invoice shipping order refund`)

// chatValue returns a realistic record value of about size bytes: a JSON
// chat message with ids, a timestamp and text drawn from a vocabulary.
func chatValue(rng *rand.Rand, size int, seq int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"room":"room-%d","user":"user-%04d","msg_id":"%016x","seq":%d,"ts":%d,"lang":"en","text":"`,
		rng.IntN(50), rng.IntN(5000), rng.Uint64(), seq, 1_700_000_000_000+int64(seq)*37)
	for b.Len() < size-2 {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(' ')
	}
	s := b.String()[:size-2] + `"}`
	return []byte(s)
}

// logGen generates a home range's log: data frames with dense offsets,
// increasing append times, Raft terms and indexes, idempotent producers.
type logGen struct {
	rng        *rand.Rand
	next       uint64
	index      uint64
	appendTime int64
	seqs       map[uint64]uint64
	valueBytes int
	epoch      uint64
}

func newLogGen(seed uint64, valueBytes int) *logGen {
	return &logGen{
		rng:        rand.New(rand.NewPCG(seed, 1)),
		appendTime: 1_700_000_000_000_000_000,
		seqs:       make(map[uint64]uint64),
		valueBytes: valueBytes,
		epoch:      1,
	}
}

// frame returns the next data frame, of n records.
func (g *logGen) frame(n int) []byte {
	pid := uint64(1 + g.rng.IntN(4))
	recs := make([]batch.Record, n)
	for i := range recs {
		recs[i] = batch.Record{
			Key:                   fmt.Appendf(nil, "room-%d", g.rng.IntN(50)),
			Value:                 chatValue(g.rng, g.valueBytes, int(g.next)+i),
			Headers:               []batch.RecordHeader{{Key: "content-type", Value: []byte("application/json")}},
			ProducerTimeUnixNanos: g.appendTime - 1000,
		}
	}
	g.index++
	g.appendTime += int64(g.rng.IntN(1_000_000))
	h := batch.Header{
		Type: batch.TypeData, BaseOffset: g.next, Epoch: g.epoch,
		Term: 2, Index: g.index, AppendTimeUnixNanos: g.appendTime,
		ProducerID: pid, BaseSequence: g.seqs[pid],
	}
	g.seqs[pid] += uint64(n)
	f := batch.Encode(nil, h, recs)
	g.next += uint64(n)
	return f
}

// fill appends count frames of 1..maxRecs records to src, committed.
func (g *logGen) fill(t testing.TB, src *MemSource, count, maxRecs int) {
	t.Helper()
	for range count {
		if err := src.AppendCommitted(g.frame(1 + g.rng.IntN(maxRecs))); err != nil {
			t.Fatal(err)
		}
	}
}

// mirrorNode is a Server for a MemMirrorStore on loopback.
type mirrorNode struct {
	store *MemMirrorStore
	srv   *Server
	gs    *grpc.Server
	addr  string
}

// fakeClock is a settable clock without a monotonic reading.
type fakeClock struct{ nanos atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.nanos.Store(1_800_000_000_000_000_000)
	return c
}

func (c *fakeClock) Now() time.Time            { return time.Unix(0, c.nanos.Load()) }
func (c *fakeClock) Advance(d time.Duration)   { c.nanos.Add(int64(d)) }
func (c *fakeClock) Set(t time.Time)           { c.nanos.Store(t.UnixNano()) }
func (c *fakeClock) Since(t time.Time) float64 { return c.Now().Sub(t).Seconds() }

// startMirror serves a Server over store on an ephemeral loopback port
// until the test ends.
func startMirror(t testing.TB, store *MemMirrorStore, mod func(*ServerConfig)) *mirrorNode {
	t.Helper()
	cfg := ServerConfig{Region: dstRegion, Store: store, Logger: testLogger(t, "mirror")}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(srv.ServerOptions(), grpc.ChainStreamInterceptor(rpcerr.StreamServerInterceptor(nil)))...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return &mirrorNode{store: store, srv: srv, gs: gs, addr: lis.Addr().String()}
}

// taskConfig returns a fast task config towards addrs.
func taskConfig(t testing.TB, src Source, dialer Dialer, addrs ...string) TaskConfig {
	return TaskConfig{
		Stream: testStream, Range: testRange,
		SourceRegion: homeRegion, DestinationRegion: dstRegion,
		Epoch: 1, Source: src, Dialer: dialer,
		Addrs:             func() []string { return addrs },
		Seed:              42,
		HeartbeatInterval: 20 * time.Millisecond,
		HandshakeTimeout:  2 * time.Second,
		BackoffMin:        5 * time.Millisecond,
		BackoffMax:        50 * time.Millisecond,
		Logger:            testLogger(t, "source"),
	}
}

// runningTask is a Task running in the background.
type runningTask struct {
	task   *Task
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // what Run returned, once done
}

// startTask runs a task built from cfg until stop or the test's end.
func startTask(t testing.TB, cfg TaskConfig) *runningTask {
	t.Helper()
	task, err := NewTask(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &runningTask{task: task, cancel: cancel, done: make(chan struct{})}
	go func() {
		rt.err = task.Run(ctx)
		close(rt.done)
	}()
	t.Cleanup(func() { rt.stop(t) })
	return rt
}

// stop cancels the task and waits for Run to return; it returns Run's
// error (context.Canceled when stopped here).
func (rt *runningTask) stop(t testing.TB) error {
	rt.cancel()
	return rt.wait(t, 10*time.Second)
}

// wait waits for Run to return and returns its error.
func (rt *runningTask) wait(t testing.TB, d time.Duration) error {
	select {
	case <-rt.done:
		return rt.err
	case <-time.After(d):
		t.Errorf("task still running after %s", d)
		return nil
	}
}

// newDialer returns a GRPCDialer closed at the test's end.
func newDialer(t testing.TB) *GRPCDialer {
	d := NewGRPCDialer(DialerConfig{})
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// assertMirrored checks that the mirror holds exactly the source's frames,
// equal in every data field.
func assertMirrored(t testing.TB, src *MemSource, m *MemMirror) {
	t.Helper()
	want, got := src.Frames(), m.Frames()
	if len(got) != len(want) {
		t.Fatalf("mirror has %d frames, source %d", len(got), len(want))
	}
	for i := range want {
		if !SameData(want[i], got[i]) {
			t.Fatalf("frame %d differs: source [%d, %d), mirror [%d, %d)", i,
				frameBase(want[i]), frameNext(want[i]), frameBase(got[i]), frameNext(got[i]))
		}
	}
	if m.AppliedEnd() != src.CommittedEnd() {
		t.Fatalf("mirror applied end %d, source committed %d", m.AppliedEnd(), src.CommittedEnd())
	}
}

// rawClient speaks the protocol by hand, for the server's tests.
type rawClient struct {
	t      testing.TB
	stream ReplicateStream
	cancel context.CancelFunc
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(96<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := geologinternalv1.NewMirrorClient(conn).Replicate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &rawClient{t: t, stream: s, cancel: cancel}
}

// roundTrip sends req and returns the answer (or the stream's error).
func (c *rawClient) roundTrip(req *geologinternalv1.ReplicateRequest) (*geologinternalv1.ReplicateResponse, error) {
	if err := c.stream.Send(req); err != nil {
		_, rerr := c.stream.Recv()
		return nil, errors.Join(err, rerr)
	}
	return c.stream.Recv()
}

// mustAnswer round-trips req and fails the test on a stream error.
func (c *rawClient) mustAnswer(req *geologinternalv1.ReplicateRequest) *geologinternalv1.ReplicateResponse {
	c.t.Helper()
	resp, err := c.roundTrip(req)
	if err != nil {
		c.t.Fatalf("stream failed: %v", err)
	}
	return resp
}

func heartbeatPB(epoch, tail uint64) *geologinternalv1.HomeHeartbeat {
	return &geologinternalv1.HomeHeartbeat{CommittedEndOffset: tail, HomeTimeUnixNanos: 1_700_000_000_000_000_000, HomeEpoch: epoch}
}

func openReq(epoch uint64) *geologinternalv1.ReplicateRequest {
	return &geologinternalv1.ReplicateRequest{
		Open: &geologinternalv1.ReplicateOpen{
			Stream: testStream, Range: testRange,
			SourceRegion: homeRegion, DestinationRegion: dstRegion, HomeEpoch: epoch,
		},
		Heartbeat: heartbeatPB(epoch, 0),
	}
}

// batchReq builds a batch request of frames, compressed as asked.
func batchReq(epoch uint64, comp Compression, frames ...[]byte) *geologinternalv1.ReplicateRequest {
	var buf []byte
	for _, f := range frames {
		buf = append(buf, f...)
	}
	enc, err := sharedEncoder(3)
	if err != nil {
		panic(err)
	}
	b := &geologinternalv1.MirrorBatch{
		FirstOffset:       frameBase(frames[0]),
		EndOffset:         frameNext(frames[len(frames)-1]),
		FrameCount:        uint32(len(frames)),
		Compression:       comp,
		Payload:           buf,
		UncompressedBytes: uint64(len(buf)),
	}
	if comp == CompressionZstd {
		b.Payload = enc.EncodeAll(buf, nil)
	}
	return &geologinternalv1.ReplicateRequest{Heartbeat: heartbeatPB(epoch, b.EndOffset), Batch: b}
}

// openStreams counts the streams a server is serving.
func openStreams(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.ranges {
		n += st.streams
	}
	return n
}
