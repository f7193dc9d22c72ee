package dedup

import (
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

func TestDedupTable(t *testing.T) {
	type step struct {
		name     string
		producer uint64
		seq      uint64
		count    uint32
		want     Verdict
		wantCode apierr.Code
		wantBase uint64 // for duplicates
		epoch    uint64 // the range's epoch; 0 means 1
	}
	d := NewTable(100)
	offset := uint64(0)
	steps := []step{
		{"unknown producer must start at 0", 1, 5, 3, Reject, apierr.ProducerStateLost, 0, 0},
		{"new producer starts at 0", 1, 0, 3, Append, 0, 0, 0},
		{"next in sequence", 1, 3, 2, Append, 0, 0, 0},
		{"exact duplicate of first", 1, 0, 3, Duplicate, 0, 0, 0},
		{"exact duplicate of second", 1, 3, 2, Duplicate, 0, 3, 0},
		{"gap", 1, 7, 1, Reject, apierr.SequenceGap, 0, 0},
		{"overlap without match", 1, 1, 2, Reject, apierr.InvalidArgument, 0, 0},
		{"other producer is independent", 2, 0, 1, Append, 0, 0, 0},
		// The range moved to epoch 2 (a failover) after producer 1's last
		// batch here: a batch past it means acknowledged batches were lost.
		{"gap across an epoch change", 1, 7, 1, Reject, apierr.ProducerStateLost, 0, 2},
		{"duplicates still answered after it", 1, 3, 2, Duplicate, 0, 3, 2},
		{"resuming at the expected sequence", 1, 5, 2, Append, 0, 0, 2},
		{"a gap within the new epoch", 1, 9, 1, Reject, apierr.SequenceGap, 0, 2},
		{"a producer last seen at epoch 1", 2, 4, 1, Reject, apierr.ProducerStateLost, 0, 2},
	}
	for _, s := range steps {
		epoch := max(s.epoch, 1)
		v, orig, err := d.Check(s.producer, s.seq, s.count, epoch)
		if v != s.want {
			t.Fatalf("%s: verdict %v, want %v (err %v)", s.name, v, s.want, err)
		}
		switch v {
		case Append:
			d.Record(s.producer, Batch{BaseSequence: s.seq, RecordCount: s.count, BaseOffset: offset, Epoch: epoch})
			offset += uint64(s.count)
		case Duplicate:
			if orig.BaseOffset != s.wantBase {
				t.Fatalf("%s: original base %d, want %d", s.name, orig.BaseOffset, s.wantBase)
			}
		case Reject:
			if got := apierr.CodeOf(err); got != s.wantCode {
				t.Fatalf("%s: code %v, want %v", s.name, got, s.wantCode)
			}
		}
	}
	// The gap error tells the producer where to resume.
	_, _, err := d.Check(1, 9, 1, 2)
	if e := apierr.As(err); e.ExpectedSequence != 7 {
		t.Fatalf("expected sequence %d, want 7", e.ExpectedSequence)
	}
	// So does the lost state: where this range holds the producer up to,
	// and the first epoch after the producer's newest batch here (even
	// with several epochs since).
	_, _, err = d.Check(2, 4, 1, 5)
	if e := apierr.As(err); e.ExpectedSequence != 1 || e.Retriable || e.ForkEpoch != 2 {
		t.Fatalf("lost state: %+v, want expected sequence 1, fork epoch 2, not retriable", e)
	}
	// An unknown producer: nothing to tell.
	_, _, err = d.Check(3, 4, 1, 5)
	if e := apierr.As(err); e.Code != apierr.ProducerStateLost || e.ForkEpoch != 0 || e.ExpectedSequence != 0 {
		t.Fatalf("unknown producer: %+v", e)
	}
}

func TestDedupWindow(t *testing.T) {
	d := NewTable(10)
	for i := uint64(0); i < RecentBatchesMax+4; i++ {
		d.Record(7, Batch{BaseSequence: i, RecordCount: 1, BaseOffset: i})
	}
	// The oldest four batches fell out of the window.
	if v, _, err := d.Check(7, 0, 1, 0); v != Reject || apierr.CodeOf(err) != apierr.DuplicateOutOfWindow {
		t.Fatalf("old duplicate: %v %v", v, err)
	}
	if v, orig, _ := d.Check(7, 4, 1, 0); v != Duplicate || orig.BaseOffset != 4 {
		t.Fatalf("oldest remembered batch: %v %+v", v, orig)
	}
	if v, _, _ := d.Check(7, RecentBatchesMax+4, 1, 0); v != Append {
		t.Fatalf("next: %v", v)
	}
}

func TestDedupBoundsAndExpiry(t *testing.T) {
	d := NewTable(10)
	for p := uint64(1); p <= 25; p++ {
		d.Record(p, Batch{BaseSequence: 0, RecordCount: 1, AppendTimeUnixNanos: int64(p)})
	}
	if len(d.producers) > 10 {
		t.Fatalf("%d producers remembered, bound is 10", len(d.producers))
	}
	if _, ok := d.producers[25]; !ok {
		t.Fatal("newest producer evicted")
	}
	if _, ok := d.producers[1]; ok {
		t.Fatal("oldest producer kept")
	}
	n := d.Expire(24)
	if _, ok := d.producers[24]; !ok || n == 0 {
		t.Fatalf("expire(24) removed %d, kept 24: %v", n, ok)
	}
	for id, p := range d.producers {
		if p.lastAppendUnixNanos < 24 {
			t.Fatalf("producer %d idle since %d survived expiry", id, p.lastAppendUnixNanos)
		}
	}
}

func TestRecordIsIdempotentForTheLatestBatch(t *testing.T) {
	d := NewTable(10)
	b := Batch{BaseSequence: 0, RecordCount: 2, BaseOffset: 7}
	d.Record(1, b)
	d.Record(1, b)
	if p := d.producers[1]; len(p.recent) != 1 || p.nextSequence != 2 {
		t.Fatalf("after recording twice: %+v", p)
	}
	if v, orig, _ := d.Check(1, 0, 2, 0); v != Duplicate || orig != b {
		t.Fatalf("check: %v %+v", v, orig)
	}
}

// TestRecordFrame: a data frame of an idempotent producer is recorded as
// its batch (a compacted one with its span); other frames are not.
func TestRecordFrame(t *testing.T) {
	tab := NewTable(10)
	h := batch.Header{Type: batch.TypeData, ProducerID: 7, BaseSequence: 0, BaseOffset: 40, RecordCount: 3, Epoch: 2, AppendTimeUnixNanos: 99}
	tab.RecordFrame(h)
	tab.RecordFrame(batch.Header{Type: batch.TypeNoop, ProducerID: 8, RecordCount: 1})
	tab.RecordFrame(batch.Header{Type: batch.TypeData, ProducerID: 0, RecordCount: 1})
	v, orig, err := tab.Check(7, 0, 3, 2)
	if err != nil || v != Duplicate || orig != BatchOf(h) || orig.RecordCount != 3 || orig.BaseOffset != 40 {
		t.Fatalf("frame not recorded: %v %+v %v", v, orig, err)
	}
	if v, _, _ := tab.Check(8, 0, 1, 2); v == Duplicate {
		t.Fatal("a noop frame was recorded")
	}
}
