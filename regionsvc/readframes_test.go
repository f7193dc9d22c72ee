package regionsvc

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

// frameLog writes a random log to a segment store: dense data frames (with
// headers, producer times and tombstones), compacted frames (holes, some
// emptied, some starting past the previous frame's end) and compaction
// markers, with the epoch changing along the way. It returns the driver
// reading it, committed to the log's end.
func frameLog(t testing.TB, rng *rand.Rand, frames int) *rangeDriver {
	t.Helper()
	d := storeDriver(t, segment.Config{SegmentBytesMax: segment.SegmentBytesMaxMin, IndexIntervalBytes: 512})
	st := d.store
	next, epoch := uint64(0), uint64(1)
	for i := range frames {
		h := batch.Header{Type: batch.TypeData, BaseOffset: next, Epoch: epoch, AppendTimeUnixNanos: int64(1000 + i), ProducerID: uint64(rng.IntN(2)) * 7, BaseSequence: next}
		var frame []byte
		switch k := rng.IntN(10); {
		case k == 0:
			frame = batch.EncodeCompaction(nil, h, batch.Compaction{Point: next})
		case k <= 3:
			if rng.IntN(3) == 0 {
				h.BaseOffset += uint64(rng.IntN(5)) // the frames before were compacted away
			}
			span := 1 + rng.IntN(30)
			h.OffsetSpan = uint32(span)
			var recs []batch.Record
			for d := range span {
				if rng.IntN(3) == 0 {
					r := randomReadRecord(rng)
					r.OffsetDelta = uint32(d)
					recs = append(recs, r)
				}
			}
			frame = batch.Encode(nil, h, recs)
		default:
			recs := make([]batch.Record, 1+rng.IntN(30))
			for j := range recs {
				recs[j] = randomReadRecord(rng)
			}
			frame = batch.Encode(nil, h, recs)
		}
		if err := st.Append(frame); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		fh, _ := batch.PeekHeader(frame)
		next = fh.NextOffset()
		if rng.IntN(20) == 0 {
			epoch++
		}
	}
	d.committed.Store(st.NextOffset())
	return d
}

// storeDriver returns a range driver over a new store of cfg in a
// temporary directory (fsync never), which reads as a node does.
func storeDriver(t testing.TB, cfg segment.Config) *rangeDriver {
	t.Helper()
	cfg.Dir, cfg.Fsync = t.TempDir(), segment.FsyncNever
	st, err := segment.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &rangeDriver{store: st, logger: hclog.NewNullLogger()}
}

func randomReadRecord(rng *rand.Rand) batch.Record {
	r := batch.Record{Key: fmt.Appendf(nil, "k%d", rng.IntN(9)), Value: make([]byte, rng.IntN(200)), ProducerTimeUnixNanos: int64(rng.IntN(3))}
	if rng.IntN(5) == 0 {
		r.Value, r.Tombstone = nil, true
	}
	if rng.IntN(4) == 0 {
		r.Headers = []batch.RecordHeader{{Key: "h", Value: []byte{byte(rng.IntN(256))}}}
	}
	return r
}

// framesAsRecords decodes a frame-form reply into the records form, as
// the node would have built it.
func framesAsRecords(t testing.TB, frames []byte) []*geologv1.StoredRecord {
	t.Helper()
	var out []*geologv1.StoredRecord
	for len(frames) > 0 {
		n, err := batch.FrameSize(frames)
		if err != nil || n > len(frames) {
			t.Fatalf("frame size %d of %d bytes: %v", n, len(frames), err)
		}
		h, recs, err := batch.Decode(frames[:n])
		if err != nil || h.Type != batch.TypeData || len(recs) == 0 {
			t.Fatalf("frame %v with %d records: %v", h.Type, len(recs), err)
		}
		for i := range recs {
			out = append(out, storedRecord(h, h.Offset(&recs[i]), &recs[i]))
		}
		frames = frames[n:]
	}
	return out
}

func sameStored(a, b []*geologv1.StoredRecord) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// TestFrameFormEqualsRecordsForm: over a log of dense and compacted frames
// and compaction markers, from every offset (mid-frame ones, holes and
// markers included), under max_records from 1 up, with the servable end
// at the tail or at a fence inside a frame, the frame form's records equal
// the records form's, at the same offsets, with the same next offset;
// with max_bytes small enough to stop reads, a frame-form read returns
// exactly the records the unbounded read has below its next offset,
// moves forward, and holds at most max_bytes of frames past the first.
// Fails on any frame not cut right (records below from, past the end or
// the fence, past max_records) or a wrong next offset.
func TestFrameFormEqualsRecordsForm(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	d := frameLog(t, rng, 120)
	tail := d.store.NextOffset()
	for _, end := range []uint64{tail, tail / 2, tail/3 + 1} {
		d.committed.Store(tail)
		d.tl.fence.Store(nil)
		if end != tail {
			d.tl.fence.Store(&timelineFence{offset: end, epoch: 9})
		}
		for from := uint64(0); from <= end; from++ {
			// 50 records take less than 32 KiB of frames here: only
			// max_records binds.
			maxRecords := []int{1, 2, 3, 7, 50}[rng.IntN(5)]
			checkFrameRead(t, d, from, maxRecords, 32<<10)
			checkBoundedFrameRead(t, d, from, maxRecords, 1+rng.IntN(3000))
		}
	}
}

func checkFrameRead(t *testing.T, d *rangeDriver, from uint64, maxRecords, maxBytes int) {
	t.Helper()
	want, wantNext, err := d.readRecords(from, maxRecords, maxBytes)
	if err != nil {
		t.Fatalf("records form at %d: %v", from, err)
	}
	out, next, err := d.readFrames(from, maxRecords, maxBytes)
	if err != nil {
		t.Fatalf("frame form at %d: %v", from, err)
	}
	got := framesAsRecords(t, out.frames)
	if !sameStored(got, want) || next != wantNext || out.count != len(want) {
		t.Fatalf("from %d max %d: frame form %d records (count %d) next %d, records form %d next %d",
			from, maxRecords, len(got), out.count, next, len(want), wantNext)
	}
}

func checkBoundedFrameRead(t *testing.T, d *rangeDriver, from uint64, maxRecords, maxBytes int) {
	t.Helper()
	truth, truthNext, err := d.readRecords(from, maxRecords, 32<<10)
	if err != nil {
		t.Fatal(err)
	}
	out, next, err := d.readFrames(from, maxRecords, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	got := framesAsRecords(t, out.frames)
	var want []*geologv1.StoredRecord
	for _, r := range truth {
		if r.GetOffset() < next {
			want = append(want, r)
		}
	}
	first, _ := batch.FrameSize(out.frames)
	switch {
	case !sameStored(got, want):
		t.Fatalf("from %d max %d/%dB: %d records, want the %d below next %d", from, maxRecords, maxBytes, len(got), len(want), next)
	case next > truthNext || (len(truth) > 0 && len(got) == 0):
		t.Fatalf("from %d max %d/%dB: next %d (unbounded %d), %d records of %d", from, maxRecords, maxBytes, next, truthNext, len(got), len(truth))
	case len(out.frames) > max(maxBytes, first):
		t.Fatalf("from %d: %d bytes of frames for max_bytes %d", from, len(out.frames), maxBytes)
	}
}

// BenchmarkReadForms is a node's work on one read of 1 MiB (the default
// max_bytes) from a frame boundary, in each form, from the segment store
// to the reply's wire bytes: records (readRecords: decode every frame,
// one message per record, proto.Marshal) and frames (readFrames: the
// frames read, proto.Marshal copies them). The log is 4 MiB of batches of
// 100 records; ns/record is the time per record returned.
func BenchmarkReadForms(b *testing.B) {
	for _, valueBytes := range []int{100, 1024} {
		d := benchReadLog(b, valueBytes)
		for _, form := range []string{"records", "frames"} {
			b.Run(fmt.Sprintf("value=%d/%s", valueBytes, form), func(b *testing.B) {
				b.ReportAllocs()
				records, bytes := 0, 0
				cpu0 := processCPU(b)
				for b.Loop() {
					resp := &geologv1.ReadResponse{}
					if form == "frames" {
						out, next, err := d.readFrames(0, readRecordsMax, readBytesDefault)
						if err != nil {
							b.Fatal(err)
						}
						resp.Frames, resp.NextOffset, records = out.frames, next, records+out.count
					} else {
						recs, next, err := d.readRecords(0, readRecordsMax, readBytesDefault)
						if err != nil {
							b.Fatal(err)
						}
						resp.Records, resp.NextOffset, records = recs, next, records+len(recs)
					}
					wire, err := proto.Marshal(resp)
					if err != nil {
						b.Fatal(err)
					}
					bytes += len(wire)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(records), "ns/record")
				b.ReportMetric(float64(processCPU(b)-cpu0)/float64(records), "cpu-ns/record")
				b.ReportMetric(float64(records)/float64(b.N), "records/op")
				b.ReportMetric(float64(bytes)/float64(b.N), "wire-B/op")
			})
		}
	}
}

// processCPU is the process's user and system CPU time so far, in
// nanoseconds: on a shared machine a steadier figure than the wall time,
// which counts the time other processes hold the CPU.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// benchReadLog writes 4 MiB of batches of 100 records of valueBytes to a
// store and returns a driver reading it.
func benchReadLog(b *testing.B, valueBytes int) *rangeDriver {
	d := storeDriver(b, segment.Config{})
	st := d.store
	recs := make([]batch.Record, 100)
	for i := range recs {
		recs[i] = batch.Record{Key: fmt.Appendf(nil, "key-%012d", i), Value: make([]byte, valueBytes), ProducerTimeUnixNanos: int64(i),
			Headers: []batch.RecordHeader{{Key: "trace", Value: []byte("0123456789abcdef")}}}
	}
	for off := uint64(0); st.Size() < 4<<20; off += uint64(len(recs)) {
		h := batch.Header{Type: batch.TypeData, BaseOffset: off, Epoch: 1, AppendTimeUnixNanos: int64(off), ProducerID: 3, BaseSequence: off}
		if err := st.Append(batch.Encode(nil, h, recs)); err != nil {
			b.Fatal(err)
		}
	}
	d.committed.Store(st.NextOffset())
	return d
}
