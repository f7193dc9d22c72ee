package batch

import (
	"fmt"
	"testing"
)

// benchRecords returns n records with a 16-byte key and a 1 KiB value.
func benchRecords(n int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		value := make([]byte, 1024)
		for j := range value {
			value[j] = byte(i + j)
		}
		recs[i] = Record{Key: fmt.Appendf(nil, "key-%012d", i), Value: value, ProducerTimeUnixNanos: int64(i)}
	}
	return recs
}

func BenchmarkEncode(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			recs := benchRecords(n)
			frame := Encode(nil, sampleHeader(), recs)
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			dst := make([]byte, 0, len(frame))
			for b.Loop() {
				dst = Encode(dst[:0], sampleHeader(), recs)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			frame := Encode(nil, sampleHeader(), benchRecords(n))
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := Decode(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkValidate(b *testing.B) {
	frame := Encode(nil, sampleHeader(), benchRecords(64))
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Validate(frame); err != nil {
			b.Fatal(err)
		}
	}
}
