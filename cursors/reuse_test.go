package cursors

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestBatchReuseMatchesFresh: a batch begun with BeginReusing on the
// memory of a dropped one, cut with CutAppend into reused slices, behaves
// as a batch from Begin cut with Cut: the same answers and errors for
// random commits, resets, deletes and joins, and byte for byte the same
// records, over batches kept across several cuts.
func TestBatchReuseMatchesFresh(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		fresh, reused := NewState(Limits{}), NewState(Limits{})
		cf, cr := NewCoordinator(), NewCoordinator()
		now := time.Unix(1_700_000_000, 0)
		var old *Batch
		var out []Record
		var buf []byte
		for round := 0; round < 60; round++ {
			bf := fresh.Begin(now, 1)
			br := reused.BeginReusing(old, now, 1)
			var pending [][]Record // cuts of this batch, applied when it is dropped
			for range 1 + rng.IntN(3) {
				for range 1 + rng.IntN(6) {
					op := randomBatchOp(rng)
					a, errA := op(bf, cf)
					b, errB := op(br, cr)
					if !reflect.DeepEqual(a, b) || fmt.Sprint(errA) != fmt.Sprint(errB) {
						t.Fatalf("seed %d round %d: fresh %+v %v, reused %+v %v", seed, round, a, errA, b, errB)
					}
				}
				want := bf.Cut()
				out, buf = br.CutAppend(out[:0], buf[:0])
				if len(out) != len(want) {
					t.Fatalf("seed %d round %d: %d records, want %d", seed, round, len(out), len(want))
				}
				got := make([]Record, len(out))
				for i, r := range out {
					if !bytes.Equal(r.Key, want[i].Key) || !bytes.Equal(r.Value, want[i].Value) || r.Tombstone != want[i].Tombstone {
						t.Fatalf("seed %d round %d: record %d differs", seed, round, i)
					}
					got[i] = Record{Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value), Tombstone: r.Tombstone}
				}
				pending = append(pending, got)
				now = now.Add(time.Millisecond)
				bf.SetNow(now)
				br.SetNow(now)
			}
			for _, cut := range pending {
				for _, r := range cut {
					if err := fresh.Apply(r); err != nil {
						t.Fatal(err)
					}
					if err := reused.Apply(r); err != nil {
						t.Fatal(err)
					}
				}
			}
			old = br
		}
		if a, b := fmt.Sprint(fresh.Counts()), fmt.Sprint(reused.Counts()); a != b {
			t.Fatalf("seed %d: counts %s and %s", seed, a, b)
		}
	}
}

// randomBatchOp is a random request over few cursors, streams and ranges
// (so that keys repeat within and across batches).
func randomBatchOp(rng *rand.Rand) func(*Batch, *Coordinator) (any, error) {
	cursor := fmt.Sprintf("c%d", rng.IntN(5))
	stream := fmt.Sprintf("s%d", rng.IntN(2))
	switch k := rng.IntN(20); {
	case k < 15:
		ps := make([]Position, 1+rng.IntN(5))
		for i := range ps {
			ps[i] = Position{Stream: stream, Range: uint32(rng.IntN(6)), Generation: uint64(rng.IntN(2)),
				Offset: uint64(rng.IntN(1000)), Epoch: uint64(rng.IntN(3))}
			if rng.IntN(4) == 0 {
				ps[i].Metadata = []byte(fmt.Sprint(rng.IntN(100)))
			}
		}
		return func(b *Batch, _ *Coordinator) (any, error) {
			return b.Commit(CommitRequest{Cursor: cursor, Positions: append([]Position(nil), ps...)})
		}
	case k < 16:
		r := uint32(rng.IntN(6))
		off := uint64(rng.IntN(1000))
		return func(b *Batch, _ *Coordinator) (any, error) {
			return b.Reset(cursor, stream, []Position{{Range: r, Offset: off}})
		}
	case k < 18:
		return func(b *Batch, _ *Coordinator) (any, error) { return b.Delete(cursor) }
	default:
		member := fmt.Sprintf("m%d", rng.IntN(3))
		return func(b *Batch, c *Coordinator) (any, error) {
			return c.Join(b, JoinRequest{Group: "g" + cursor, MemberID: member, Stream: stream, RangeCount: 6})
		}
	}
}

// TestBatchReuseAllocations: a commit of held positions into a reused
// batch, cut into reused slices, allocates nothing per position.
func TestBatchReuseAllocations(t *testing.T) {
	s := NewState(Limits{})
	req := CommitRequest{Cursor: "c", Positions: make([]Position, 64)}
	for i := range req.Positions {
		req.Positions[i] = Position{Stream: "s", Range: uint32(i), Offset: 1}
	}
	b := s.Begin(time.Unix(1, 0), 1)
	if _, err := b.Commit(req); err != nil {
		t.Fatal(err)
	}
	for _, r := range b.Cut() {
		if err := s.Apply(r); err != nil {
			t.Fatal(err)
		}
	}
	var out []Record
	buf := make([]byte, 0, 64<<10)
	off := uint64(1)
	n := testing.AllocsPerRun(50, func() {
		b = s.BeginReusing(b, time.Unix(2, 0), 1)
		off++
		for i := range req.Positions {
			req.Positions[i].Offset = off
		}
		if _, err := b.Commit(req); err != nil {
			t.Fatal(err)
		}
		out, buf = b.CutAppend(out[:0], buf[:0])
	})
	// The batch itself and Commit's answer: a handful per request, none
	// per position (a fresh batch's map grows through many).
	if n > 4 {
		t.Fatalf("a reused batch allocates %v times per 64-position commit", n)
	}
}
