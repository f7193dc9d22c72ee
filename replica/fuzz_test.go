package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/dedup"
)

// FuzzSnapshotDesc: any bytes decode to a description or ErrSnapshotInvalid,
// never a panic, and a decoded one re-encodes to the same bytes.
func FuzzSnapshotDesc(f *testing.F) {
	f.Add(snapshotDesc{FirstIndex: 5, FirstOffset: 10, NextOffset: 20, Frames: 3, AppendUnixNanos: -1, ProducersBytes: 40, ProducersIndex: 4}.encode())
	f.Add(snapshotDesc{}.encode())
	f.Add(snapshotDesc{FirstIndex: 5, FirstOffset: 10, NextOffset: 20, Frames: 2, ProducersIndex: 4, OrphansBytes: 700}.encode())
	f.Add(snapshotDesc{FirstIndex: 5, FirstOffset: 10, NextOffset: 10, ProducersIndex: 4, CompactedEpoch: 3}.encode())
	f.Add(snapshotDesc{FirstIndex: 5, FirstOffset: 10, NextOffset: 20, Frames: 2, ProducersIndex: 4, OrphansBytes: 700, CompactedEpoch: 9}.encode())
	f.Add([]byte("GLSN"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeSnapshotDesc(b)
		if err != nil {
			if !errors.Is(err, ErrSnapshotInvalid) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !bytes.Equal(d.encode(), b) {
			t.Fatal("round trip changed the bytes")
		}
		_ = d.check(d.FirstIndex + d.Frames) // must not panic
	})
}

// FuzzProducerBase: any bytes decode to a base or an error, never a panic;
// a decoded base re-encodes to the same bytes.
func FuzzProducerBase(f *testing.F) {
	p := newProducerBase()
	for i := uint64(1); i <= 20; i++ {
		p.record(batch.Header{Type: batch.TypeData, ProducerID: i%3 + 1, BaseSequence: i, RecordCount: 1, BaseOffset: i, Epoch: 1, AppendTimeUnixNanos: int64(i)})
	}
	f.Add(p.encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeProducerBase(b)
		if err != nil {
			return
		}
		if !bytes.Equal(p.encode(), b) {
			t.Fatal("round trip changed the bytes")
		}
	})
}

// TestProducerBaseMatchesTable: the base keeps what a dedup table keeps, so
// a table built from it answers as one that saw every batch.
func TestProducerBaseMatchesTable(t *testing.T) {
	p := newProducerBase()
	var hs []batch.Header
	for i := uint64(0); i < 100; i++ {
		h := batch.Header{Type: batch.TypeData, ProducerID: i%4 + 1, BaseSequence: i / 4 * 2, RecordCount: 2, BaseOffset: i * 2, Epoch: 1, AppendTimeUnixNanos: int64(i)}
		hs = append(hs, h)
		p.record(h)
		p.record(h) // recording the latest again is a no-op, as in the table
	}
	q, err := decodeProducerBase(p.encode())
	if err != nil {
		t.Fatal(err)
	}
	tbl := q.table(100)
	for _, h := range hs {
		v, orig, _ := tbl.Check(h.ProducerID, h.BaseSequence, h.RecordCount, 0)
		recent := h.BaseSequence/2 >= 25-16 // the last 16 batches of each producer
		if recent && (v != dedup.Duplicate || orig.BaseOffset != h.BaseOffset) {
			t.Fatalf("producer %d sequence %d: verdict %v offset %d, want duplicate at %d", h.ProducerID, h.BaseSequence, v, orig.BaseOffset, h.BaseOffset)
		}
	}
	if v, _, _ := tbl.Check(1, 50, 1, 0); v != dedup.Append {
		t.Fatalf("next sequence: verdict %v, want append", v)
	}
}

// FuzzForkRecord: any bytes decode to a fork record or ErrOrphansCorrupt,
// never a panic; a decoded record re-encodes to the same bytes.
func FuzzForkRecord(f *testing.F) {
	f.Add(ForkRecord{Index: 40, Term: 3, PrevIndex: 12, At: 15, Epoch: 2, TimeUnixNanos: 99, Records: 15, Frames: 5, Bytes: 900,
		FirstOffset: 15, NextOffset: 30}.encode())
	f.Add(ForkRecord{Index: 7, Epoch: 1, At: 3, FirstOffset: 3, NextOffset: 3}.encode())
	f.Add([]byte("GLOR"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeForkRecord(b)
		if err != nil {
			if !errors.Is(err, ErrOrphansCorrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !bytes.Equal(rec.encode(), b) {
			t.Fatal("round trip changed the bytes")
		}
	})
}

// FuzzSkipDesc: any bytes decode to a skip entry's payload or
// ErrSkipInvalid, never a panic; a decoded one re-encodes to the same
// bytes, is recognised as a skip (isSkipPayload) and never as a fork, and
// names no index before it (a skip frame never ends a gap).
func FuzzSkipDesc(f *testing.F) {
	f.Add(skipDesc{At: 40, Proposer: 1, ProposalTerm: 2, ProposalSeq: 1}.encode())
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 7), skipDesc{At: 40}.encode()[8:]...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeSkipDesc(b)
		if err != nil {
			if !errors.Is(err, ErrSkipInvalid) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !bytes.Equal(d.encode(), b) || !isSkipPayload(b) {
			t.Fatal("round trip changed the bytes, or the payload is not a skip's")
		}
		if _, err := decodeForkDesc(b); err == nil {
			t.Fatal("a skip payload decodes as a fork's")
		}
		frame := batch.EncodeControl(nil, batch.Header{Type: batch.TypeFork, Epoch: 1, Index: 50}, b)
		if prev, err := batch.ForkPrevIndex(frame); err != nil || prev != 0 {
			t.Fatalf("ForkPrevIndex = %d, %v; a skip names none", prev, err)
		}
	})
}

// FuzzForkDesc: any bytes decode to a fork entry's payload or
// ErrForkInvalid, never a panic; a decoded one re-encodes to the same
// bytes, and a fork frame carrying it names its PrevIndex to the segment
// store.
func FuzzForkDesc(f *testing.F) {
	f.Add(forkDesc{At: 15, KeepIndex: 12, Proposer: 1, ProposalTerm: 2, ProposalSeq: 1}.encode())
	f.Add(forkDesc{PrevIndex: 12, At: 15, KeepIndex: 12}.encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeForkDesc(b)
		if err != nil {
			if !errors.Is(err, ErrForkInvalid) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !bytes.Equal(d.encode(), b) {
			t.Fatal("round trip changed the bytes")
		}
		frame := batch.EncodeControl(nil, batch.Header{Type: batch.TypeFork, Epoch: 1, Index: 50}, b)
		if prev, err := batch.ForkPrevIndex(frame); err != nil || prev != d.PrevIndex {
			t.Fatalf("ForkPrevIndex = %d, %v; payload says %d", prev, err, d.PrevIndex)
		}
	})
}
