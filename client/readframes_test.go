package client_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// replyForms counts the read replies a client gets, by form, and the
// read requests asking for frames, through gRPC interceptors.
type replyForms struct {
	mu                     sync.Mutex
	asked, frames, records int
}

func (f *replyForms) note(req, resp any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	type wants interface{ GetWantFrames() bool }
	if w, ok := req.(wants); ok && w.GetWantFrames() {
		f.asked++
	}
	type reply interface {
		GetFrames() []byte
		GetRecords() []*geologv1.StoredRecord
	}
	if r, ok := resp.(reply); ok {
		if len(r.GetFrames()) > 0 {
			f.frames++
		}
		if len(r.GetRecords()) > 0 {
			f.records++
		}
	}
}

func (f *replyForms) counts() (asked, frames, records int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked, f.frames, f.records
}

// opt is the client option that feeds f.
func (f *replyForms) opt() client.Opt {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		f.note(req, reply)
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		return &formStream{ClientStream: s, f: f}, err
	}
	return client.DialOptions(grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream))
}

// formStream notes each reply with the last request sent before it. A
// bidirectional stream (the producer's appends) sends and receives on two
// goroutines, so req is under mu.
type formStream struct {
	grpc.ClientStream
	f   *replyForms
	mu  sync.Mutex
	req any
}

func (s *formStream) SendMsg(m any) error {
	s.mu.Lock()
	s.req = m
	s.mu.Unlock()
	return s.ClientStream.SendMsg(m)
}

func (s *formStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.mu.Lock()
		req := s.req
		s.req = nil
		s.mu.Unlock()
		s.f.note(req, m)
	}
	return err
}

// readEach reads one record-bounded page from every offset below tail.
func readEach(t *testing.T, c *client.Client, tail uint64, maxRecords uint32) []*client.ReadResult {
	t.Helper()
	var out []*client.ReadResult
	for from := range tail {
		r, err := c.Read(testCtx(t), "s", 0, from, client.ReadOptions{MaxRecords: maxRecords})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// subscribeN collects n records of a subscription from offset from.
func subscribeN(t *testing.T, c *client.Client, from uint64, n int) []client.StoredRecord {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var out []client.StoredRecord
	for rec, err := range c.Subscribe(ctx, "s", 0, client.StartAt{Offset: from}) {
		if err != nil {
			t.Fatal(err)
		}
		if out = append(out, rec); len(out) == n {
			break
		}
	}
	return out
}

// groupConsumeN collects n records of stream s by a new member of group.
func groupConsumeN(t *testing.T, c *client.Client, group string, n int) []client.StoredRecord {
	t.Helper()
	g, err := c.NewGroupConsumer("s", group)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var out []client.StoredRecord
	for rec, err := range g.Records(testCtx(t)) {
		if err != nil {
			t.Fatal(err)
		}
		if out = append(out, rec); len(out) == n {
			break
		}
	}
	return out
}

// TestNodeReadFormsAgree: a real node answers a client's reads in the
// frame form, and they give the same records (offsets, keys, values,
// headers, times, epochs, tombstones) and next offsets as the records
// form (ReadRecordsForm), from every offset of a log of several batches
// (so from inside them), one record, three and all at a time, by
// subscription and by a group consumer's fetch. Fails if the node answered records to the default client
// (the form would not be used) or if a record differs.
func TestNodeReadFormsAgree(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	var forms, old replyForms
	c := newClient(t, n.Addr(), forms.opt())
	rc := newClient(t, n.Addr(), client.ReadRecordsForm(), old.opt())
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "s", RangeCount: 1}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, "s")
	for range 4 {
		if _, err := p.ProduceSync(ctx, formRecords(9)...); err != nil {
			t.Fatal(err)
		}
	}
	const tail = 36
	for _, maxRecords := range []uint32{1, 3, 0} {
		got, want := readEach(t, c, tail, maxRecords), readEach(t, rc, tail, maxRecords)
		for i := range got {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Fatalf("from %d max %d: frame form %+v, records form %+v", i, maxRecords, got[i], want[i])
			}
		}
	}
	if got, want := subscribeN(t, c, 5, tail-5), subscribeN(t, rc, 5, tail-5); !reflect.DeepEqual(got, want) {
		t.Fatalf("subscription: frame form %+v, records form %+v", got, want)
	}
	if got, want := groupConsumeN(t, c, "gf", tail), groupConsumeN(t, rc, "gr", tail); !reflect.DeepEqual(got, want) {
		t.Fatalf("group: frame form %+v, records form %+v", got, want)
	}
	if asked, frames, records := forms.counts(); asked == 0 || frames == 0 || records != 0 {
		t.Fatalf("default client: %d requests for frames, %d replies of frames, %d of records", asked, frames, records)
	}
	if asked, frames, records := old.counts(); asked != 0 || frames != 0 || records == 0 {
		t.Fatalf("ReadRecordsForm client: %d requests for frames, %d replies of frames, %d of records", asked, frames, records)
	}
}

// TestReadFallsBackToRecordsForm: a server that predates the frame form
// (the fake by default) ignores want_frames and answers records, which the
// client reads as before, by Read and by Subscribe.
func TestReadFallsBackToRecordsForm(t *testing.T) {
	for _, serveFrames := range []bool{false, true} {
		fake := startFake(t, clienttest.Config{ServeFrames: serveFrames})
		fake.MustCreateStream("s", 1)
		var forms replyForms
		c := newClient(t, fake.Addr(), forms.opt())
		p := newProducer(t, c, "s")
		in := formRecords(12)
		if _, err := p.ProduceSync(testCtx(t), in...); err != nil {
			t.Fatal(err)
		}
		got := readEach(t, c, 12, 5)
		subscribed := subscribeN(t, c, 2, 10)
		for i, r := range got {
			if len(r.Records) != min(5, 12-i) || r.NextOffset != uint64(i+len(r.Records)) || string(r.Records[0].Value) != string(in[i].Value) {
				t.Fatalf("serve frames %v: read at %d: %+v", serveFrames, i, r)
			}
		}
		for i, r := range subscribed {
			if r.Offset != uint64(i+2) || string(r.Value) != string(in[i+2].Value) || len(r.Headers) != 2 {
				t.Fatalf("serve frames %v: subscribed %+v at %d", serveFrames, r, i)
			}
		}
		asked, frames, records := forms.counts()
		if asked == 0 || (frames > 0) != serveFrames || (records > 0) == serveFrames {
			t.Fatalf("serve frames %v: %d requests for frames, %d replies of frames, %d of records", serveFrames, asked, frames, records)
		}
	}
}

// TestCorruptFramesRefused: frames that fail their CRC, are cut short, are
// not data frames, or hold records the read did not ask for (below its
// offset, at or past the next offset, twice) are refused with
// ErrCorruptFrames (wrapping batch.ErrCorrupt or batch.ErrShort where that
// is the cause), by Read and by Subscribe, never a panic nor a record.
func TestCorruptFramesRefused(t *testing.T) {
	damages := map[string]struct {
		damage func(f []byte) []byte
		cause  error
	}{
		"crc":       {func(f []byte) []byte { f[len(f)-1] ^= 1; return f }, batch.ErrCorrupt},
		"truncated": {func(f []byte) []byte { return f[:len(f)-3] }, batch.ErrShort},
		"length":    {func(f []byte) []byte { f[0], f[1], f[2], f[3] = 1, 0, 0, 0; return f }, batch.ErrCorrupt},
		"control":   {func([]byte) []byte { return batch.EncodeControl(nil, batch.Header{Type: batch.TypeNoop}, nil) }, nil},
		"below":     {func(f []byte) []byte { return rebase(f, -1) }, nil},
		"past next": {func(f []byte) []byte { return rebase(f, 1) }, nil},
		"twice":     {func(f []byte) []byte { return append(f, f...) }, nil},
	}
	for name, d := range damages {
		fake := startFake(t, clienttest.Config{ServeFrames: true, DamageFrames: d.damage})
		fake.MustCreateStream("s", 1)
		c := newClient(t, fake.Addr(), client.RetriesMax(0))
		if _, err := newProducer(t, c, "s").ProduceSync(testCtx(t), formRecords(6)...); err != nil {
			t.Fatal(err)
		}
		r, err := c.Read(testCtx(t), "s", 0, 1, client.ReadOptions{})
		if !errors.Is(err, client.ErrCorruptFrames) || (d.cause != nil && !errors.Is(err, d.cause)) || r != nil {
			t.Fatalf("%s: Read gave %v, %v", name, r, err)
		}
		for rec, err := range c.Subscribe(testCtx(t), "s", 0, client.StartAt{Offset: 1}) {
			if !errors.Is(err, client.ErrCorruptFrames) {
				t.Fatalf("%s: Subscribe gave %+v, %v", name, rec, err)
			}
			break
		}
	}
}

// rebase moves every frame of frames by delta offsets (CRC made right).
func rebase(frames []byte, delta int64) []byte {
	var out []byte
	for len(frames) > 0 {
		n, _ := batch.FrameSize(frames)
		h, recs, err := batch.Decode(frames[:n])
		if err != nil {
			panic(err)
		}
		h.BaseOffset = uint64(int64(h.BaseOffset) + delta)
		out = batch.Encode(out, h, recs)
		frames = frames[n:]
	}
	return out
}
