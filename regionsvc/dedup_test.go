package regionsvc

import (
	"testing"

	"github.com/geolog/geolog/apierr"
)

func TestDedupTable(t *testing.T) {
	type step struct {
		name     string
		producer uint64
		seq      uint64
		count    uint32
		want     dedupVerdict
		wantCode apierr.Code
		wantBase uint64 // for duplicates
	}
	d := newDedupTable(100)
	offset := uint64(0)
	steps := []step{
		{"unknown producer must start at 0", 1, 5, 3, verdictReject, apierr.SequenceGap, 0},
		{"new producer starts at 0", 1, 0, 3, verdictAppend, 0, 0},
		{"next in sequence", 1, 3, 2, verdictAppend, 0, 0},
		{"exact duplicate of first", 1, 0, 3, verdictDuplicate, 0, 0},
		{"exact duplicate of second", 1, 3, 2, verdictDuplicate, 0, 3},
		{"gap", 1, 7, 1, verdictReject, apierr.SequenceGap, 0},
		{"overlap without match", 1, 1, 2, verdictReject, apierr.InvalidArgument, 0},
		{"other producer is independent", 2, 0, 1, verdictAppend, 0, 0},
	}
	for _, s := range steps {
		v, orig, err := d.check(s.producer, s.seq, s.count)
		if v != s.want {
			t.Fatalf("%s: verdict %v, want %v (err %v)", s.name, v, s.want, err)
		}
		switch v {
		case verdictAppend:
			d.record(s.producer, sentBatch{baseSequence: s.seq, recordCount: s.count, baseOffset: offset})
			offset += uint64(s.count)
		case verdictDuplicate:
			if orig.baseOffset != s.wantBase {
				t.Fatalf("%s: original base %d, want %d", s.name, orig.baseOffset, s.wantBase)
			}
		case verdictReject:
			if got := apierr.CodeOf(err); got != s.wantCode {
				t.Fatalf("%s: code %v, want %v", s.name, got, s.wantCode)
			}
		}
	}
	// The gap error tells the producer where to resume.
	_, _, err := d.check(1, 9, 1)
	if e := apierr.As(err); e.ExpectedSequence != 5 {
		t.Fatalf("expected sequence %d, want 5", e.ExpectedSequence)
	}
}

func TestDedupWindow(t *testing.T) {
	d := newDedupTable(10)
	for i := uint64(0); i < recentBatchesMax+4; i++ {
		d.record(7, sentBatch{baseSequence: i, recordCount: 1, baseOffset: i})
	}
	// The oldest four batches fell out of the window.
	if v, _, err := d.check(7, 0, 1); v != verdictReject || apierr.CodeOf(err) != apierr.DuplicateOutOfWindow {
		t.Fatalf("old duplicate: %v %v", v, err)
	}
	if v, orig, _ := d.check(7, 4, 1); v != verdictDuplicate || orig.baseOffset != 4 {
		t.Fatalf("oldest remembered batch: %v %+v", v, orig)
	}
	if v, _, _ := d.check(7, recentBatchesMax+4, 1); v != verdictAppend {
		t.Fatalf("next: %v", v)
	}
}

func TestDedupBoundsAndExpiry(t *testing.T) {
	d := newDedupTable(10)
	for p := uint64(1); p <= 25; p++ {
		d.record(p, sentBatch{baseSequence: 0, recordCount: 1, appendTimeUnixNanos: int64(p)})
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
	n := d.expire(24)
	if _, ok := d.producers[24]; !ok || n == 0 {
		t.Fatalf("expire(24) removed %d, kept 24: %v", n, ok)
	}
	for id, p := range d.producers {
		if p.lastAppendUnixNanos < 24 {
			t.Fatalf("producer %d idle since %d survived expiry", id, p.lastAppendUnixNanos)
		}
	}
}
