package regionsvc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/protobuf/proto"
)

// produced returns recs as a produced frame (AppendRequest.batch), as the
// SDK builds it.
func produced(pid, seq uint64, recs []*geologv1.Record) []byte {
	brecs := make([]batch.Record, len(recs))
	for i, r := range recs {
		brecs[i] = batch.Record{Key: r.GetKey(), Value: r.GetValue(), ProducerTimeUnixNanos: r.GetProducerTimeUnixNanos(), Tombstone: r.GetTombstone()}
		for _, h := range r.GetHeaders() {
			brecs[i].Headers = append(brecs[i].Headers, batch.RecordHeader{Key: h.GetKey(), Value: h.GetValue()})
		}
	}
	return batch.EncodeProduced(nil, pid, seq, brecs)
}

// keyIn returns a key of range r of a stream of count ranges.
func keyIn(r, count uint32, i int) []byte {
	for j := i; ; j++ {
		if k := fmt.Appendf(nil, "key-%d", j); keyspace.RangeForKey(k, count) == r {
			return k
		}
	}
}

// mixedRecs returns n records of range r of 2 with keys, headers,
// producer times and a tombstone among them.
func mixedRecs(prefix string, r uint32, n int) []*geologv1.Record {
	out := recs(prefix, n)
	for i, rec := range out {
		rec.Key = keyIn(r, 2, i)
		rec.ProducerTimeUnixNanos = int64(1000 + i)
		if i%3 == 2 {
			rec.Value, rec.Tombstone = nil, true
		}
	}
	return out
}

// TestProducedAppendRoundTrip: the same records appended in the batch
// form and in the records form read back the same, each at the offsets
// the append answered; a resent batch is answered as the duplicate it is.
func TestProducedAppendRoundTrip(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 2)
	ctx := ctxT(t)
	in := mixedRecs("a", 1, 7)
	rb, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 1, Batch: produced(9, 0, in), ProducerId: 9})
	if err != nil || rb.BaseOffset != 0 || rb.RecordCount != 7 {
		t.Fatalf("batch form: %v %v", rb, err)
	}
	rr, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 1, Records: in, ProducerId: 9, BaseSequence: 7})
	if err != nil || rr.BaseOffset != 7 {
		t.Fatalf("records form: %v %v", rr, err)
	}
	dup, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 1, Batch: produced(9, 0, in), ProducerId: 9})
	if err != nil || !dup.Duplicate || dup.BaseOffset != 0 {
		t.Fatalf("resent batch: %v %v", dup, err)
	}
	read, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s", Range: 1})
	if err != nil || len(read.Records) != 14 {
		t.Fatalf("read: %v %v", read, err)
	}
	for i, got := range read.Records {
		want := in[i%7]
		if got.Offset != uint64(i) || !bytes.Equal(got.Key, want.Key) || !bytes.Equal(got.Value, want.Value) ||
			got.ProducerTimeUnixNanos != want.ProducerTimeUnixNanos || got.Tombstone != want.Tombstone ||
			len(got.Headers) != 1 || !proto.Equal(got.Headers[0], want.Headers[0]) || got.Epoch != rb.Epoch {
			t.Fatalf("offset %d: read %v, appended %v", i, got, want)
		}
	}
}

// TestProducedFrameMatchesEncoded: the leader writes a produced frame as
// it came, and it is byte for byte the frame it encodes from the same
// records in the records form.
func TestProducedFrameMatchesEncoded(t *testing.T) {
	t.Parallel()
	n, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 2)
	in := mixedRecs("a", 0, 9)
	req := &geologv1.AppendRequest{Stream: "s", Range: 0, Records: in, ProducerId: 3, BaseSequence: 40}
	old, err := n.encodedAppend(context.Background(), req, keyRouter{count: 2}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	n.limits.appends.release(old.held)
	frame := produced(3, 40, in)
	req = &geologv1.AppendRequest{Stream: "s", Range: 0, Batch: frame, ProducerId: 3, BaseSequence: 40}
	op, err := n.producedAppend(context.Background(), req, keyRouter{count: 2}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	n.limits.appends.release(op.held)
	if &op.frame[0] != &frame[0] {
		t.Fatal("the produced frame was copied")
	}
	if !bytes.Equal(op.frame, old.frame) || op.recordCount != old.recordCount || op.producerID != old.producerID ||
		op.baseSequence != old.baseSequence || op.held != old.held {
		t.Fatalf("produced op %+v differs from encoded op %+v", op, old)
	}
}

// TestProducedBadInput: each damaged or rule-breaking batch is refused
// with its code (and a bad frame with INVALID_ARGUMENT naming the batch
// error), nothing of any of them is appended, and the node goes on.
func TestProducedBadInput(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), func(cfg *Config) { cfg.RecordBytesMax = 1000; cfg.BatchBytesMax = 4000 })
	createStream(t, c, "s", 2)
	if _, err := c.CreateStream(ctxT(t), &geologv1.CreateStreamRequest{Name: "kv", RangeCount: 1,
		Cleanup: geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT}); err != nil {
		t.Fatal(err)
	}
	good := mixedRecs("g", 0, 3)
	frame := produced(5, 0, good)
	body := func(mutate func(f []byte)) []byte {
		f := bytes.Clone(frame)
		mutate(f)
		return f
	}
	restamp := func(f []byte) {
		binary.LittleEndian.PutUint32(f[4:], crc32.Checksum(f[8:], crc32.MakeTable(crc32.Castagnoli)))
	}
	manyHeaders := recs("h", 1)
	for i := range headersPerRecordMax {
		manyHeaders[0].Headers = append(manyHeaders[0].Headers, &geologv1.Header{Key: fmt.Sprint(i)})
	}
	cases := []struct {
		name   string
		stream string
		rng    uint32
		frame  []byte
		pid    uint64
		seq    uint64
		recs   []*geologv1.Record
		code   apierr.Code
		says   string
	}{
		{name: "bad crc", frame: body(func(f []byte) { f[len(f)-1] ^= 1 }), code: apierr.InvalidArgument, says: "crc mismatch"},
		{name: "truncated", frame: frame[:len(frame)-3], code: apierr.InvalidArgument, says: "short"},
		{name: "header only", frame: frame[:batch.HeaderSize-1], code: apierr.InvalidArgument, says: "short"},
		{name: "trailing bytes", frame: append(bytes.Clone(frame), 0), code: apierr.InvalidArgument, says: "bytes after the frame"},
		{name: "over the batch bound", frame: produced(5, 0, recs(strings.Repeat("x", 900), 5)), code: apierr.BatchTooLarge},
		{name: "record too large", frame: produced(5, 0, []*geologv1.Record{{Value: make([]byte, 1001)}}), code: apierr.RecordTooLarge},
		{name: "key of another range", frame: produced(5, 0, mixedRecs("o", 1, 2)), code: apierr.InvalidArgument, says: "belongs to range 1"},
		{name: "count does not match the sequences", frame: frame, seq: 3, code: apierr.InvalidArgument, says: "from sequence"},
		{name: "other producer", frame: frame, pid: 6, code: apierr.InvalidArgument, says: "under producer"},
		{name: "leader field", frame: body(func(f []byte) { f[24] = 1; restamp(f) }), code: apierr.InvalidArgument, says: "only the leader sets"},
		{name: "no records", frame: produced(5, 0, nil), code: apierr.EmptyBatch},
		{name: "both forms", frame: frame, recs: good, code: apierr.InvalidArgument, says: "both"},
		{name: "too many headers", frame: produced(5, 0, manyHeaders), code: apierr.InvalidArgument, says: "headers"},
		{name: "keyless in a compacted stream", stream: "kv", frame: produced(5, 0, recs("k", 1)), code: apierr.KeyRequired},
	}
	ctx := ctxT(t)
	for _, tc := range cases {
		if tc.stream == "" {
			tc.stream = "s"
		}
		if tc.pid == 0 {
			tc.pid = 5
		}
		_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: tc.stream, Range: tc.rng, Batch: tc.frame, Records: tc.recs, ProducerId: tc.pid, BaseSequence: tc.seq})
		if err == nil || rpcerr.FromError(err).Code != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Fatalf("%s: got %v, want %v saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "s"})
	if err != nil || d.Ranges[0].TailOffset != 0 || d.Ranges[1].TailOffset != 0 {
		t.Fatalf("refused batches appended something: %v %v", d, err)
	}
	if r, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Batch: frame, ProducerId: 5}); err != nil || r.RecordCount != 3 {
		t.Fatalf("the good batch after the bad ones: %v %v", r, err)
	}
}

// FuzzCheckProduced: whatever the batch, the leader's check never panics
// and either refuses it with an append code or accepts a frame whose
// records decode, each within the bounds and of the range.
func FuzzCheckProduced(f *testing.F) {
	for i, rs := range [][]*geologv1.Record{mixedRecs("a", 0, 4), recs("b", 2), {{Value: make([]byte, 600)}}} {
		frame := produced(uint64(i), 0, rs)
		f.Add(frame, uint64(i))
		f.Add(frame[:len(frame)-1], uint64(i))
	}
	n := &Node{cfg: Config{RecordBytesMax: 500, BatchBytesMax: 1 << 16}}
	f.Fuzz(func(t *testing.T, frame []byte, pid uint64) {
		req := &geologv1.AppendRequest{Stream: "s", Range: 0, Batch: frame, ProducerId: pid}
		h, err := n.checkProduced(req, frame, keyRouter{count: 2}, false)
		if err != nil {
			var e *apierr.Error
			if !errors.As(err, &e) {
				t.Fatalf("untyped refusal %T: %v", err, err)
			}
			switch e.Code {
			case apierr.InvalidArgument, apierr.BatchTooLarge, apierr.RecordTooLarge, apierr.EmptyBatch:
			default:
				t.Fatalf("refused with %v: %v", e.Code, err)
			}
			return
		}
		_, got, err := batch.Decode(frame)
		if err != nil || len(got) == 0 || h.ProducerID != pid {
			t.Fatalf("accepted a frame that does not decode (%v) or is another producer's", err)
		}
		for _, r := range got {
			if len(r.Key) > 0 && keyspace.RangeForKey(r.Key, 2) != 0 {
				t.Fatalf("accepted a key of another range")
			}
		}
	})
}
