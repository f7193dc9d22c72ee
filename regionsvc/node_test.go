package regionsvc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// testNode starts a node on an ephemeral port in dir and returns a client.
func testNode(t *testing.T, dir string, mut func(*Config)) (*Node, geologv1.LogClient) {
	t.Helper()
	cfg := Config{
		DataDir:    dir,
		ListenAddr: "127.0.0.1:0",
		Logger: hclog.New(&hclog.LoggerOptions{
			Output: tWriter{t}, Level: hclog.Warn,
		}),
	}
	if mut != nil {
		mut(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); n.Close() })
	return n, geologv1.NewLogClient(conn)
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func createStream(t *testing.T, c geologv1.LogClient, name string, ranges uint32) {
	t.Helper()
	if _, err := c.CreateStream(ctxT(t), &geologv1.CreateStreamRequest{Name: name, RangeCount: ranges}); err != nil {
		t.Fatal(err)
	}
}

// recs builds n keyless records (a key must belong to the range it is
// appended to; a keyless record goes anywhere).
func recs(prefix string, n int) []*geologv1.Record {
	out := make([]*geologv1.Record, n)
	for i := range out {
		out[i] = &geologv1.Record{
			Value:   []byte(fmt.Sprintf("%s-%d", prefix, i)),
			Headers: []*geologv1.Header{{Key: "i", Value: []byte{byte(i)}}},
		}
	}
	return out
}

// wantCode asserts err is a gRPC status with an ErrorDetail of code.
func wantCode(t *testing.T, err error, code apierr.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %v, got success", code)
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("want a gRPC status, got %T %v", err, err)
	}
	if len(st.Details()) == 0 {
		t.Fatalf("status %v carries no ErrorDetail", st)
	}
	if got := rpcerr.FromError(err).Code; got != code {
		t.Fatalf("code %v, want %v (%v)", got, code, err)
	}
}

func TestAppendReadRoundTrip(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 2)
	ctx := ctxT(t)
	r1, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 1, Records: recs("a", 3)})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 1, Records: recs("b", 2)})
	if err != nil {
		t.Fatal(err)
	}
	if r1.BaseOffset != 0 || r1.RecordCount != 3 || r2.BaseOffset != 3 || r1.Epoch != 1 {
		t.Fatalf("offsets: %+v %+v", r1, r2)
	}
	if r2.AppendTimeUnixNanos < r1.AppendTimeUnixNanos {
		t.Fatal("append time went backwards")
	}
	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Range: 1, FromOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rr.Records) != 4 || rr.NextOffset != 5 || rr.TailOffset != 5 {
		t.Fatalf("read: %d records next %d tail %d", len(rr.Records), rr.NextOffset, rr.TailOffset)
	}
	for i, r := range rr.Records {
		if r.Offset != uint64(i+1) {
			t.Fatalf("record %d has offset %d", i, r.Offset)
		}
	}
	if string(rr.Records[0].Value) != "a-1" || string(rr.Records[2].Value) != "b-0" || rr.Records[0].Headers[0].Key != "i" {
		t.Fatalf("content: %v", rr.Records)
	}
	// max_records and max_bytes bound the reply, but one record always comes.
	rr, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Range: 1, FromOffset: 0, MaxRecords: 2})
	if err != nil || len(rr.Records) != 2 || rr.NextOffset != 2 {
		t.Fatalf("max_records: %v %v", rr, err)
	}
	rr, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Range: 1, FromOffset: 0, MaxBytes: 1})
	if err != nil || len(rr.Records) != 1 {
		t.Fatalf("max_bytes: %v %v", rr, err)
	}
	// Reading at the tail returns nothing; the other range is empty.
	rr, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Range: 1, FromOffset: 5})
	if err != nil || len(rr.Records) != 0 {
		t.Fatalf("tail read: %v %v", rr, err)
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "s"})
	if err != nil || len(d.Ranges) != 2 || d.Ranges[1].TailOffset != 5 || d.Ranges[0].TailOffset != 0 || d.Ranges[1].Status != "ok" {
		t.Fatalf("describe: %v %v", d, err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), func(cfg *Config) { cfg.RecordBytesMax = 1000 })
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: []*geologv1.Record{{Value: make([]byte, 1001)}}})
	wantCode(t, err, apierr.RecordTooLarge)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "s"})
	wantCode(t, err, apierr.EmptyBatch)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "nope", Records: recs("a", 1)})
	wantCode(t, err, apierr.StreamNotFound)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "", Records: recs("a", 1)})
	wantCode(t, err, apierr.InvalidArgument)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 9, Records: recs("a", 1)})
	wantCode(t, err, apierr.RangeNotFound)
	_, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "s", FromOffset: 1})
	wantCode(t, err, apierr.OffsetOutOfRange)
	_, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Consistency: 77})
	wantCode(t, err, apierr.InvalidArgument)
	// Creating it again is answered with the stream; another definition
	// is refused, naming what differs.
	if resp, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "s", RangeCount: 1}); err != nil || resp.GetStream().GetRangeCount() != 1 {
		t.Fatalf("the same create again: %v %v", resp, err)
	}
	_, err = c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "s", RangeCount: 2})
	wantCode(t, err, apierr.StreamExists)
	if !strings.Contains(err.Error(), "range_count 2 (the stream has 1)") {
		t.Fatalf("STREAM_EXISTS does not name the difference: %v", err)
	}
	for _, bad := range []*geologv1.CreateStreamRequest{
		{Name: "", RangeCount: 1},
		{Name: "../etc", RangeCount: 1},
		{Name: "ok", RangeCount: 0},
		{Name: "ok", RangeCount: rangeCountMax + 1},
		{Name: "ok", RangeCount: 1, Regions: []string{"a", "a"}},
		{Name: "ok", RangeCount: 1, Retention: &geologv1.RetentionPolicy{MaxBytes: -1}},
	} {
		_, err = c.CreateStream(ctx, bad)
		wantCode(t, err, apierr.InvalidArgument)
	}
	_, err = c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "nope"})
	wantCode(t, err, apierr.StreamNotFound)
	// Nothing was lost or appended by any of that.
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("ok", 1)})
	if err != nil {
		t.Fatal(err)
	}
	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s"})
	if err != nil || len(rr.Records) != 1 || rr.TailOffset != 1 {
		t.Fatalf("after bad input: %v %v", rr, err)
	}
}

// TestMalformedWire sends bytes that are not a valid AppendRequest: gRPC
// must answer with a status, and the server must stay up.
func TestMalformedWire(t *testing.T) {
	t.Parallel()
	n, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 1)
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	garbage := rawBytes{0xff, 0xff, 0xff, 0x0f, 0x01}
	var out rawBytes
	err = conn.Invoke(ctxT(t), "/geolog.v1.Log/Append", &garbage, &out, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) == codes.OK {
		t.Fatalf("garbage accepted: %v", err)
	}
	if _, err := c.ListStreams(ctxT(t), &geologv1.ListStreamsRequest{}); err != nil {
		t.Fatalf("server down after garbage: %v", err)
	}
}

func TestIdempotentAppend(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, nil)
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	app := func(seq uint64, k int) (*geologv1.AppendResponse, error) {
		return c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("p", k), ProducerId: 42, BaseSequence: seq})
	}
	r, err := app(0, 2)
	if err != nil || r.BaseOffset != 0 || r.Duplicate {
		t.Fatalf("%v %v", r, err)
	}
	if r, err = app(2, 3); err != nil || r.BaseOffset != 2 {
		t.Fatalf("%v %v", r, err)
	}
	// A retry gets the original offsets back and appends nothing.
	if r, err = app(0, 2); err != nil || !r.Duplicate || r.BaseOffset != 0 {
		t.Fatalf("duplicate: %v %v", r, err)
	}
	_, err = app(9, 1)
	wantCode(t, err, apierr.SequenceGap)
	if rpcerr.FromError(err).ExpectedSequence != 5 {
		t.Fatalf("gap detail: %v", rpcerr.FromError(err))
	}

	// After a restart the dedup state is rebuilt from the log.
	n.Close()
	_, c = testNode(t, dir, nil)
	ctx = ctxT(t)
	if r, err = app(2, 3); err != nil || !r.Duplicate || r.BaseOffset != 2 {
		t.Fatalf("duplicate after restart: %v %v", r, err)
	}
	_, err = app(6, 1)
	wantCode(t, err, apierr.SequenceGap)
	if r, err = app(5, 1); err != nil || r.BaseOffset != 5 || r.Duplicate {
		t.Fatalf("next after restart: %v %v", r, err)
	}
	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s"})
	if err != nil || len(rr.Records) != 6 {
		t.Fatalf("log after retries: %v %v", rr, err)
	}
}

func TestAppendStreamPipelined(t *testing.T) {
	t.Parallel()
	// The subject is order within a pipeline, not shedding: on a busy
	// machine 300 requests queue past the 100 ms target and the node
	// would answer OVERLOADED (shed_test.go covers that).
	_, c := testNode(t, t.TempDir(), func(cfg *Config) { cfg.AppendQueueDelayTarget = -1 })
	createStream(t, c, "s", 3)
	ctx := ctxT(t)
	st, err := c.AppendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const reqs = 300
	seq := map[uint32]uint64{}
	for i := 0; i < reqs; i++ {
		rg := uint32(i % 3)
		req := &geologv1.AppendRequest{Stream: "s", Range: rg, Records: recs(fmt.Sprint(i), 2), ProducerId: 7, BaseSequence: seq[rg], RequestId: uint64(i)}
		seq[rg] += 2
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	// A bad request in the middle of the pipeline fails alone.
	if err := st.Send(&geologv1.AppendRequest{Stream: "s", Range: 0, RequestId: 9999}); err != nil {
		t.Fatal(err)
	}
	st.CloseSend()
	lastBase := map[uint32]int64{0: -1, 1: -1, 2: -1}
	got := 0
	for {
		r, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.RequestId == 9999 {
			if rpcerr.FromDetail(r.Error).Code != apierr.EmptyBatch {
				t.Fatalf("bad request reply: %v", r)
			}
			continue
		}
		if r.Error != nil {
			t.Fatalf("request %d failed: %v", r.RequestId, r.Error)
		}
		rg := uint32(r.RequestId % 3)
		// Within a range, replies come in request order with dense offsets.
		if int64(r.BaseOffset) != lastBase[rg]+1 && !(lastBase[rg] == -1 && r.BaseOffset == 0) {
			if int64(r.BaseOffset) != lastBase[rg]+2 {
				t.Fatalf("range %d: base %d after %d", rg, r.BaseOffset, lastBase[rg])
			}
		}
		lastBase[rg] = int64(r.BaseOffset)
		got++
	}
	if got != reqs {
		t.Fatalf("%d replies, want %d", got, reqs)
	}
}

func TestSubscribeFollowsTail(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("a", 5)}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub, err := c.Subscribe(sctx, &geologv1.SubscribeRequest{Stream: "s", Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: 3}})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	go func() {
		for i := 0; i < 4; i++ {
			c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("b", 1)})
		}
	}()
	for len(got) < 6 {
		r, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range r.Records {
			got = append(got, rec.Offset)
		}
	}
	for i, off := range got {
		if off != uint64(3+i) {
			t.Fatalf("subscription offsets %v", got)
		}
	}
}

func TestSubscribeFromTime(t *testing.T) {
	t.Parallel()
	var nowSec atomic.Int64 // the driver reads the clock too (the commit mark's linger)
	nowSec.Store(1000)
	_, c := testNode(t, t.TempDir(), func(cfg *Config) { cfg.Now = func() time.Time { return time.Unix(nowSec.Load(), 0) } })
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	for i := 0; i < 5; i++ {
		nowSec.Store(1000 + int64(i)*10)
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("t", 2)}); err != nil {
			t.Fatal(err)
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// 1025 s falls after the batch at 1020 s: the first record at or after
	// it is the batch appended at 1030 s, offset 6.
	sub, err := c.Subscribe(sctx, &geologv1.SubscribeRequest{Stream: "s", Start: &geologv1.SubscribeRequest_FromTimeUnixNanos{FromTimeUnixNanos: time.Unix(1025, 0).UnixNano()}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := sub.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r.Records[0].Offset != 6 || r.Records[0].AppendTimeUnixNanos != time.Unix(1030, 0).UnixNano() {
		t.Fatalf("from time: first offset %d at %d", r.Records[0].Offset, r.Records[0].AppendTimeUnixNanos)
	}
}

func TestMinOffsetRead(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	done := make(chan *geologv1.ReadResponse, 1)
	go func() {
		r, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: 3})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	for i := 0; i < 3; i++ {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("m", 1)}); err != nil {
			t.Fatal(err)
		}
	}
	r := <-done
	if r == nil || r.TailOffset < 3 {
		t.Fatalf("min_offset read returned before offset 3: %v", r)
	}
	// A min_offset that never arrives ends with a typed timeout.
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := c.Read(sctx, &geologv1.ReadRequest{Stream: "s", Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: 100})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("want deadline exceeded, got %v", err)
	}
}

func TestStreamsSurviveRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, nil)
	createStream(t, c, "a", 2)
	createStream(t, c, "b", 3)
	if _, err := c.Append(ctxT(t), &geologv1.AppendRequest{Stream: "b", Range: 2, Records: recs("x", 4)}); err != nil {
		t.Fatal(err)
	}
	n.Close()
	_, c = testNode(t, dir, nil)
	ls, err := c.ListStreams(ctxT(t), &geologv1.ListStreamsRequest{})
	if err != nil || len(ls.Streams) != 2 || ls.Streams[0].Name != "a" || ls.Streams[1].RangeCount != 3 {
		t.Fatalf("list after restart: %v %v", ls, err)
	}
	rr, err := c.Read(ctxT(t), &geologv1.ReadRequest{Stream: "b", Range: 2})
	if err != nil || len(rr.Records) != 4 {
		t.Fatalf("read after restart: %v %v", rr, err)
	}
}

// rawBytes and rawCodec let a test put arbitrary bytes on the wire.
type rawBytes []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*rawBytes)), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*rawBytes)) = append(rawBytes(nil), data...)
	return nil
}

// TestCloseEndsAppendStreams: an open AppendStream does not hold shutdown
// up; it ends with a typed, retriable SHUTTING_DOWN.
func TestCloseEndsAppendStreams(t *testing.T) {
	t.Parallel()
	n, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 1)
	st, err := c.AppendStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&geologv1.AppendRequest{Stream: "s", Records: recs("a", 1), RequestId: 1}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.Error != nil {
		t.Fatalf("first reply: %v %v", r, err)
	}
	closed := make(chan struct{})
	go func() { n.Close(); close(closed) }()
	_, err = st.Recv()
	wantCode(t, err, apierr.ShuttingDown)
	if !rpcerr.IsRetriable(err) {
		t.Fatal("SHUTTING_DOWN must be retriable")
	}
	<-closed
}

// TestCorruptRangeIsNotServed: a flipped byte in the middle of a range's log
// stops that range with a typed CORRUPTION error after restart; the other
// ranges serve on, and nothing on disk is changed.
func TestCorruptRangeIsNotServed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, nil)
	createStream(t, c, "s", 2)
	ctx := ctxT(t)
	for r := uint32(0); r < 2; r++ {
		for i := 0; i < 3; i++ {
			if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: r, Records: recs("v", 10)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	n.Close()
	logPath := filepath.Join(dir, "streams", "s", "00001", "00000000000000000000.log")
	before, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte inside the first batch's records: two valid batches follow.
	corrupted := append([]byte(nil), before...)
	corrupted[150] ^= 0x40
	if err := os.WriteFile(logPath, corrupted, 0o644); err != nil {
		t.Fatal(err)
	}

	_, c = testNode(t, dir, nil)
	ctx = ctxT(t)
	_, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Range: 1})
	wantCode(t, err, apierr.Corruption)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 1, Records: recs("x", 1)})
	wantCode(t, err, apierr.Corruption)
	if rpcerr.IsRetriable(err) {
		t.Fatal("corruption must not be retriable")
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "s"})
	if err != nil || d.Ranges[0].Status != "ok" || !strings.Contains(d.Ranges[1].Status, "CORRUPTION") {
		t.Fatalf("describe: %v %v", d, err)
	}
	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Range: 0})
	if err != nil || len(rr.Records) != 30 {
		t.Fatalf("healthy range: %v %v", rr, err)
	}
	after, err := os.ReadFile(logPath)
	if err != nil || !bytes.Equal(after, corrupted) {
		t.Fatalf("the corrupt log was modified (%d bytes before, %d after): %v", len(corrupted), len(after), err)
	}
}

// TestSingleNodeDataDirRefused: a data directory of the old single-node
// layout (the catalogue in streams.json, no catalogue range) is refused
// with ErrSingleNodeDataDir, and left as it was; a directory this build
// wrote (streams.json beside meta/) opens.
func TestSingleNodeDataDirRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := []byte(`{"version": 1, "streams": [{"name": "s", "range_count": 1, "regions": ["local"]}]}`)
	if err := os.WriteFile(filepath.Join(dir, catalogFile), old, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "streams", "s", "00000"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{DataDir: dir, ListenAddr: "127.0.0.1:0", Logger: hclog.NewNullLogger()})
	if !errors.Is(err, ErrSingleNodeDataDir) {
		t.Fatalf("New on a single-node data directory = %v, want ErrSingleNodeDataDir", err)
	}
	t.Logf("refused: %v", err)
	if b, err := os.ReadFile(filepath.Join(dir, catalogFile)); err != nil || !bytes.Equal(b, old) {
		t.Fatalf("the refused directory's catalogue changed: %q %v", b, err)
	}
	if _, err := os.Stat(metaDir(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused directory got a catalogue range: %v", err)
	}

	dir = t.TempDir()
	n, c := testNode(t, dir, nil)
	createStream(t, c, "s", 1)
	n.Close()
	if _, err := os.Stat(filepath.Join(dir, catalogFile)); err != nil {
		t.Fatalf("no applied catalogue written: %v", err)
	}
	if n, err := New(Config{DataDir: dir, ListenAddr: "127.0.0.1:0", Logger: hclog.NewNullLogger()}); err != nil {
		t.Fatalf("New on this build's directory: %v", err)
	} else {
		n.Close()
	}
}
