package cursors

import (
	"math/rand"
	"reflect"
	"slices"
	"testing"
)

// refApply is Apply as it was before records were decoded in place: a
// full Decode, then a max-register merge or a removal.
func refApply(s *State, r Record) error {
	d, err := Decode(r)
	if err != nil {
		return err
	}
	switch {
	case d.Group != nil:
		s.setGroup(d.Group)
	case d.Position.Deleted:
		s.removePosition(d.Cursor, d.Position.Stream, d.Position.Range)
	default:
		ps := s.cursors[d.Cursor]
		i, found := findPosition(ps, d.Position.Stream, d.Position.Range)
		if !found {
			s.cursors[d.Cursor] = slices.Insert(ps, i, *d.Position)
			s.positions++
		} else if d.Position.after(ps[i]) {
			ps[i] = *d.Position
		}
	}
	return nil
}

// TestApplyInPlaceMatchesDecode: applying random position records,
// tombstones and malformed records in place leaves the same State, and
// the same errors, as decoding each record whole and merging it.
func TestApplyInPlaceMatchesDecode(t *testing.T) {
	rnd := rand.New(rand.NewSource(7))
	got, want := NewState(Limits{}), NewState(Limits{})
	pick := func(xs ...string) string { return xs[rnd.Intn(len(xs))] }
	for i := 0; i < 20000; i++ {
		p := Position{Stream: pick("a", "orders", "zz"), Range: uint32(rnd.Intn(5)), Generation: uint64(rnd.Intn(3)),
			Offset: uint64(rnd.Intn(50)), Epoch: uint64(rnd.Intn(3)), CommitTimeUnixNanos: int64(i), MemberID: pick("", "m1", "m2"),
			MemberEpoch: uint64(rnd.Intn(4)), Deleted: rnd.Intn(20) == 0}
		if rnd.Intn(3) == 0 {
			p.Metadata = []byte(pick("x", "yy"))
		}
		r := EncodePosition(pick("c1", "c2", "c3"), p)
		if rnd.Intn(30) == 0 { // corrupt a byte
			b := slices.Clone(append(r.Key, r.Value...))
			b[rnd.Intn(len(b))] ^= byte(1 + rnd.Intn(255))
			r = Record{Key: b[:len(r.Key)], Value: b[len(r.Key):], Tombstone: r.Tombstone}
		}
		errGot, errWant := got.Apply(r), refApply(want, r)
		if (errGot == nil) != (errWant == nil) || (errGot != nil && errGot.Error() != errWant.Error()) {
			t.Fatalf("record %d: Apply error %v, decoding whole %v", i, errGot, errWant)
		}
	}
	if !reflect.DeepEqual(got.cursors, want.cursors) || got.positions != want.positions {
		t.Fatalf("states differ:\n%v\n%v", got.cursors, want.cursors)
	}
	if n, _ := got.Counts(); n == 0 {
		t.Fatal("no position held: the test applied nothing")
	}
}

// TestApplyHeldPositionAllocatesNothing: raising a held position, same
// member and metadata, allocates nothing (the applier's steady state).
func TestApplyHeldPositionAllocatesNothing(t *testing.T) {
	s := NewState(Limits{})
	p := Position{Stream: "orders", Range: 3, Offset: 1, MemberID: "m", Metadata: []byte("md")}
	if err := s.Apply(EncodePosition("c", p)); err != nil {
		t.Fatal(err)
	}
	recs := make([]Record, 200)
	for i := range recs {
		p.Offset++
		recs[i] = EncodePosition("c", p)
	}
	i := 0
	if n := testing.AllocsPerRun(100, func() {
		if err := s.Apply(recs[i%len(recs)]); err != nil {
			t.Fatal(err)
		}
		i++
	}); n != 0 {
		t.Errorf("Apply of a held position allocates %v times", n)
	}
	if got, _ := s.Position("c", "orders", 3); got.Offset < 100 || string(got.Metadata) != "md" || got.MemberID != "m" {
		t.Errorf("position after the applies: %+v", got)
	}
}
