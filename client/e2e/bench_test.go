package e2e

import (
	"crypto/rand"
	"testing"
)

// BenchmarkSeal1KiB and BenchmarkOpen1KiB measure the cost per 1 KiB
// record with one sealed and one clear header (go test -bench . -benchmem
// ./client/e2e/).
func BenchmarkSeal1KiB(b *testing.B) {
	f := newFixture(b)
	r := benchRecord()
	b.SetBytes(int64(len(r.Value)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.sealer.Seal(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpen1KiB(b *testing.B) {
	f := newFixture(b)
	sealed := f.seal(b, benchRecord())
	b.SetBytes(int64(len(benchRecord().Value)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.opener.Open(sealed); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRecord() *Record {
	v := make([]byte, 1024)
	rand.Read(v)
	return chatRecord(string(v), Header{"sender", []byte("alice")}, Header{"trace", []byte("00f067aa0ba902b7")})
}
