package regionsvc

import (
	"fmt"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/appendwire"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/protobuf/proto"
)

// BenchmarkAppendHandling is the leader's work on one append of about 1 MiB
// from the wire bytes to the frame it proposes, in each form: records
// (the codec's decode into messages, batchRecords, Encode) and batch (the
// codec's decode, checkProduced over the frame in place).
func BenchmarkAppendHandling(b *testing.B) {
	n := &Node{cfg: Config{RecordBytesMax: 1 << 20, BatchBytesMax: 16 << 20}}
	for _, valueBytes := range []int{100, 1024} {
		count := (1 << 20) / (valueBytes + 40)
		in := make([]*geologv1.Record, count)
		for i := range in {
			in[i] = &geologv1.Record{Key: fmt.Appendf(nil, "key-%012d", i), Value: make([]byte, valueBytes), ProducerTimeUnixNanos: int64(i)}
		}
		forms := map[string]*geologv1.AppendRequest{
			"records": {Stream: "s", Records: in, ProducerId: 1},
			"batch":   {Stream: "s", Batch: produced(1, 0, in), ProducerId: 1},
		}
		for _, form := range []string{"records", "batch"} {
			wire, err := proto.Marshal(forms[form])
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("value=%d/records=%d/%s", valueBytes, count, form), func(b *testing.B) {
				b.SetBytes(int64(len(wire)))
				b.ReportAllocs()
				for b.Loop() {
					req := &geologv1.AppendRequest{}
					if err := appendwire.Unmarshal(wire, req); err != nil {
						b.Fatal(err)
					}
					if form == "batch" {
						if _, err := n.checkProduced(req, req.GetBatch(), keyRouter{count: 1}, false); err != nil {
							b.Fatal(err)
						}
						continue
					}
					brecs, size, err := n.batchRecords(req, keyRouter{count: 1}, false)
					if err != nil {
						b.Fatal(err)
					}
					batch.Encode(make([]byte, 0, size), batch.Header{Type: batch.TypeData, ProducerID: 1}, brecs)
				}
			})
		}
	}
}
