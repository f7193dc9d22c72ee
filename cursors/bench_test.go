package cursors

import (
	"fmt"
	"testing"
	"time"
)

// benchCommits is the shape of `geolog bench cursors`: commits of one
// cursor's 64 positions, cursors round robin, offsets rising.
func benchCommits(cursors, ranges, n int) []CommitRequest {
	out := make([]CommitRequest, n)
	for i := range out {
		req := CommitRequest{Cursor: fmt.Sprintf("bench-%d", i%cursors), Positions: make([]Position, ranges)}
		for r := range req.Positions {
			req.Positions[r] = Position{Stream: "bench-cursors", Range: uint32(r), Offset: uint64(i/cursors + 1)}
		}
		out[i] = req
	}
	return out
}

// BenchmarkCommitPath is a coordinator's and its replicas' work per
// commit request: validate and stage it in a Batch, cut its records, and
// apply them to three States (the three replicas' appliers).
func BenchmarkCommitPath(b *testing.B) { benchCommitPath(b, false) }

// BenchmarkCommitPathReused is BenchmarkCommitPath the way the node's
// coordinator runs it: each batch begun on the memory of the one before
// (BeginReusing), cut into reused slices (CutAppend).
func BenchmarkCommitPathReused(b *testing.B) { benchCommitPath(b, true) }

func benchCommitPath(b *testing.B, reuse bool) {
	const cursors, ranges, perBatch = 1024, 64, 8
	reqs := benchCommits(cursors, ranges, 4*cursors)
	states := []*State{NewState(Limits{}), NewState(Limits{})}
	leader := NewState(Limits{})
	for _, req := range reqs[:cursors] { // every cursor held: the steady state
		bt := leader.Begin(time.Unix(1, 0), 1)
		if _, err := bt.Commit(req); err != nil {
			b.Fatal(err)
		}
		for _, r := range bt.Cut() {
			for _, s := range append(states, leader) {
				if err := s.Apply(r); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var bt *Batch
	var recs []Record
	var buf []byte
	for i := 0; i < b.N; i += perBatch {
		if reuse {
			bt = leader.BeginReusing(bt, time.Unix(2, 0), 1)
		} else {
			bt = leader.Begin(time.Unix(2, 0), 1)
		}
		for j := i; j < i+perBatch; j++ {
			req := reqs[j%len(reqs)]
			req.Positions = append([]Position(nil), req.Positions...)
			for k := range req.Positions {
				req.Positions[k].Offset += uint64(j / len(reqs) * 4)
			}
			if _, err := bt.Commit(req); err != nil {
				b.Fatal(err)
			}
		}
		if reuse {
			recs, buf = bt.CutAppend(recs[:0], buf[:0])
		} else {
			recs = bt.Cut()
		}
		for _, r := range recs {
			for _, s := range append(states, leader) {
				if err := s.Apply(r); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}
