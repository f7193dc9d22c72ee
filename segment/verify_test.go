package segment

import (
	"errors"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// BenchmarkVerify measures Verify (geolog verify's pass) over a 64 MiB log
// of 64 KiB frames on the real file system (the page cache, warm), and
// reports MB/s.
func BenchmarkVerify(b *testing.B) {
	dir := b.TempDir()
	cfg := Config{Dir: dir, FS: vfs.OS(), Fsync: FsyncNever, SegmentBytesMax: 16 << 20}
	s, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]batch.Record, 64)
	for i := range recs {
		recs[i] = batch.Record{Key: []byte{byte(i)}, Value: make([]byte, 1000)}
	}
	for s.Size() < 64<<20 {
		if err := s.Append(batch.Encode(nil, batch.Header{BaseOffset: s.NextOffset(), Epoch: 1}, recs)); err != nil {
			b.Fatal(err)
		}
	}
	size := s.Size()
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		rep, err := Verify(cfg)
		if err != nil || rep.Bytes != size {
			b.Fatalf("Verify: %+v, %v", rep, err)
		}
	}
}

// FuzzStartRecord: any bytes in the start record file decode without a
// panic, to no record, a record held by one of its slots, or a
// CorruptionError.
func FuzzStartRecord(f *testing.F) {
	f.Add(encodeStartSlot(1, 0))
	f.Add(append(encodeStartSlot(1, 0), encodeStartSlot(2, 500)...))
	f.Add(append(make([]byte, startSlotBytes), encodeStartSlot(7, 9)[:23]...))
	f.Add(make([]byte, 48))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeStartRecord(b)
		var ce *CorruptionError
		switch {
		case err != nil && !errors.As(err, &ce):
			t.Fatalf("error %v is no CorruptionError", err)
		case err == nil && rec.ok:
			found := false
			for i := 0; i+startSlotBytes <= len(b) && i < 2*startSlotBytes; i += startSlotBytes {
				found = found || string(b[i:i+startSlotBytes]) == string(encodeStartSlot(rec.seq, rec.start))
			}
			if !found {
				t.Fatal("the decoded record is in no slot")
			}
		}
	})
}
