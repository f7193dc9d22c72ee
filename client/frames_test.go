package client

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	logbatch "github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// FuzzDecodeFrames feeds arbitrary reply bytes to the frame decoder: it
// never panics; it refuses with ErrCorruptFrames, or returns records in
// increasing offset order inside [from, next) whose count is the frames'.
func FuzzDecodeFrames(f *testing.F) {
	h := logbatch.Header{Type: logbatch.TypeData, BaseOffset: 10, Epoch: 2, AppendTimeUnixNanos: 5}
	one := logbatch.Encode(nil, h, []logbatch.Record{{Key: []byte("k"), Value: []byte("v"), Headers: []logbatch.RecordHeader{{Key: "h"}}}, {Tombstone: true}})
	h.BaseOffset, h.OffsetSpan = 12, 9
	compacted := logbatch.Encode(nil, h, []logbatch.Record{{Value: []byte("x"), OffsetDelta: 3}, {OffsetDelta: 7}})
	f.Add(one, uint64(10), uint64(12))
	f.Add(append(append([]byte(nil), one...), compacted...), uint64(0), uint64(30))
	f.Add(compacted, uint64(15), uint64(20))
	f.Add(logbatch.EncodeControl(nil, logbatch.Header{Type: logbatch.TypeNoop}, nil), uint64(0), uint64(1))
	f.Add([]byte{1, 2, 3}, uint64(0), uint64(1))
	f.Fuzz(func(t *testing.T, frames []byte, from, next uint64) {
		recs, err := decodeFrames(3, frames, from, next)
		if err != nil {
			if !errors.Is(err, ErrCorruptFrames) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		floor, count := from, 0
		for p := 0; p < len(frames); {
			n, _ := logbatch.FrameSize(frames[p:])
			fh, _ := logbatch.PeekHeader(frames[p:])
			count += int(fh.RecordCount)
			p += n
		}
		if len(recs) != count {
			t.Fatalf("%d records of %d", len(recs), count)
		}
		for _, r := range recs {
			if r.Offset < floor || r.Offset >= next || r.Range != 3 {
				t.Fatalf("record at %d of range %d, outside [%d, %d)", r.Offset, r.Range, floor, next)
			}
			floor = r.Offset + 1
		}
	})
}

// BenchmarkReplyDecode is the SDK's work on one read reply of about 1 MiB
// (batches of 100 records), from its wire bytes to []StoredRecord, in each
// form: records (proto.Unmarshal of a message per record, then
// storedFromProto) and frames (proto.Unmarshal copies the frames out,
// decodeFrames checks each CRC and decodes).
func BenchmarkReplyDecode(b *testing.B) {
	for _, valueBytes := range []int{100, 1024} {
		var frames []byte
		var recs []*geologv1.StoredRecord
		for off := uint64(0); len(frames) < 1<<20; off += 100 {
			h := logbatch.Header{Type: logbatch.TypeData, BaseOffset: off, Epoch: 1, AppendTimeUnixNanos: 7}
			in := make([]logbatch.Record, 100)
			for i := range in {
				in[i] = logbatch.Record{Key: fmt.Appendf(nil, "key-%012d", i), Value: make([]byte, valueBytes), ProducerTimeUnixNanos: int64(i + 1),
					Headers: []logbatch.RecordHeader{{Key: "trace", Value: []byte("0123456789abcdef")}}}
				recs = append(recs, &geologv1.StoredRecord{Offset: off + uint64(i), Key: in[i].Key, Value: in[i].Value, ProducerTimeUnixNanos: int64(i + 1),
					AppendTimeUnixNanos: 7, Epoch: 1, Headers: []*geologv1.Header{{Key: "trace", Value: []byte("0123456789abcdef")}}})
			}
			frames = logbatch.Encode(frames, h, in)
		}
		next := uint64(len(recs))
		for _, form := range []string{"records", "frames"} {
			resp := &geologv1.ReadResponse{Records: recs, NextOffset: next}
			if form == "frames" {
				resp = &geologv1.ReadResponse{Frames: frames, NextOffset: next}
			}
			wire, err := proto.Marshal(resp)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("value=%d/%s", valueBytes, form), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					var r geologv1.ReadResponse
					if err := proto.Unmarshal(wire, &r); err != nil {
						b.Fatal(err)
					}
					out, err := replyRecords(0, r.GetRecords(), r.GetFrames(), 0, r.GetNextOffset())
					if err != nil || len(out) != len(recs) {
						b.Fatal(len(out), err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
			})
		}
	}
}
