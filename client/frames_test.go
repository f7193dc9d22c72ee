package client

import (
	"errors"
	"testing"

	logbatch "github.com/geolog/geolog/batch"
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
