package regionsvc

import (
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

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
				b.ReportMetric(float64(records)/float64(b.N), "records/op")
				b.ReportMetric(float64(bytes)/float64(b.N), "wire-B/op")
			})
		}
	}
}

// benchReadLog writes 4 MiB of batches of 100 records of valueBytes to a
// store and returns a driver reading it.
func benchReadLog(b *testing.B, valueBytes int) *rangeDriver {
	st, err := segment.Open(segment.Config{Dir: b.TempDir(), Fsync: segment.FsyncNever})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
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
	d := &rangeDriver{store: st, logger: hclog.NewNullLogger()}
	d.committed.Store(st.NextOffset())
	return d
}
