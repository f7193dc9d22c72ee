package replica

import (
	"math/rand/v2"
	"testing"

	"github.com/geolog/geolog/apierr"
)

// TestMirrorRetakesOlderEpochAfterTailReplaced (sim seed 311120): a mirror
// leader took frames of epoch 4 and, from offset 4, of epoch 5; a new Raft
// leader replaced that uncommitted tail. When it leads again the log ends
// at 2, and the home resends the same frames from there: the epoch-4
// frame at 2 is the range's (epoch 5 starts at 4), so it is taken, though
// the replica has seen epoch 5 (HighestEpoch). An epoch-4 frame at or past
// epoch 5's start (a fenced home's tail) is still refused.
func TestMirrorRetakesOlderEpochAfterTailReplaced(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].ProposeVerbatim(mirrorOp(0, 3, 2, "e3", &res))
	c.settle()
	if len(res) != 1 || res[0].Err != nil {
		t.Fatalf("epoch-3 frame: %+v", res)
	}
	// Node 1, cut off, takes epoch 4 at [2, 4) and epoch 5 at [4, 6)
	// into its log; nothing commits.
	c.cut[1] = true
	c.replicas[1].ProposeVerbatim(mirrorOp(2, 4, 2, "e4", &res))
	c.replicas[1].ProposeVerbatim(mirrorOp(4, 5, 2, "e5", &res))
	c.settle()
	for i := 0; i < 100 && (c.leader() == 0 || c.leader() == 1); i++ {
		c.tick(1)
	}
	if l := c.leader(); l == 0 || l == 1 {
		t.Fatalf("no new leader (got %d)", l)
	}
	delete(c.cut, 1)
	c.tick(3)
	c.transfer(1)
	r := c.replicas[1]
	if got := c.logValues(1); len(got) != 2 || r.HighestEpoch() != 5 {
		t.Fatalf("node 1 leads again with log %v, highest epoch %d: want the tail replaced, epoch 5 seen", got, r.HighestEpoch())
	}
	res = nil
	r.ProposeVerbatim(mirrorOp(4, 4, 2, "zombie", &res))
	if len(res) != 1 || apierr.CodeOf(res[0].Err) != apierr.StaleEpoch {
		t.Fatalf("an epoch-4 frame at epoch 5's start: %+v, want STALE_EPOCH", res)
	}
	res = nil
	r.ProposeVerbatim(mirrorOp(2, 4, 2, "e4", &res))
	r.ProposeVerbatim(mirrorOp(4, 5, 2, "e5", &res))
	c.settle()
	if len(res) != 2 || res[0].Err != nil || res[0].Epoch != 4 || res[1].Err != nil || res[1].Epoch != 5 {
		t.Fatalf("the home's frames again: %+v, want both taken", res)
	}
	res = nil
	r.ProposeVerbatim(mirrorOp(6, 4, 1, "zombie", &res))
	if len(res) != 1 || apierr.CodeOf(res[0].Err) != apierr.StaleEpoch {
		t.Fatalf("an epoch-4 frame after epoch 5's: %+v, want STALE_EPOCH", res)
	}
	if got := c.logValues(2); len(got) != 6 {
		t.Fatalf("node 2 log %v, want 6 records", got)
	}
}

// TestMirroredFrameBelowForkOrProposal: where a newer epoch starts is
// known from a fork to it (the home's frame at the fork offset is of that
// epoch) and from this leader's proposals not yet in its log: an older
// frame at or past either is refused.
func TestMirroredFrameBelowForkOrProposal(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withOrphans)
	c.elect(1)
	r := c.replicas[1]
	var res []Result
	r.ProposeVerbatim(mirrorOp(0, 1, 2, "a", &res))
	r.ProposeVerbatim(mirrorOp(2, 1, 2, "b", &res))
	c.settle()
	c.tick(2)
	if f := c.proposeFork(2, 2); f.Err != nil || f.At != 2 {
		t.Fatalf("fork at 2 to epoch 2: %+v %v", f.ForkRecord, f.Err)
	}
	res = nil
	r.ProposeVerbatim(mirrorOp(2, 1, 2, "b", &res))
	if len(res) != 1 || apierr.CodeOf(res[0].Err) != apierr.StaleEpoch {
		t.Fatalf("an epoch-1 frame at the fork to epoch 2: %+v, want STALE_EPOCH", res)
	}
	res = nil
	r.ProposeVerbatim(mirrorOp(2, 3, 2, "c", &res))
	r.ProposeVerbatim(mirrorOp(4, 2, 1, "d", &res)) // before the epoch-3 frame reaches the log
	c.settle()
	// The refusal comes at once, the epoch-3 frame's answer at its commit.
	if len(res) != 2 || apierr.CodeOf(res[0].Err) != apierr.StaleEpoch || res[1].Err != nil || res[1].Epoch != 3 {
		t.Fatalf("an epoch-2 frame after a proposed epoch-3 one: %+v, want it refused with STALE_EPOCH", res)
	}
}

// TestEpochStartsModel checks epochStarts against a list of every note:
// a newer epoch starts at or below an offset when some note of a newer
// epoch is at or below it, and the lowest such is returned.
func TestEpochStartsModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := 0; run < 200; run++ {
		var s epochStarts
		var notes []epochStart
		for i := 0; i < 40; i++ {
			e, at := rng.Uint64N(12), rng.Uint64N(100)
			s.note(e, at)
			if e != 0 {
				notes = append(notes, epochStart{epoch: e, from: at})
			}
			qe, qat := rng.Uint64N(12), rng.Uint64N(100)
			want, wantOK := epochStart{}, false
			for _, n := range notes {
				if n.epoch > qe && n.from <= qat && (!wantOK || n.from < want.from) {
					want, wantOK = n, true
				}
			}
			got, ok := s.newer(qe, qat)
			if ok != wantOK || (ok && got.from != want.from) {
				t.Fatalf("run %d: after %v, newer(%d, %d) = %v %v, want from %d (%v)", run, notes, qe, qat, got, ok, want.from, wantOK)
			}
			for j := 1; j < len(s.steps); j++ {
				if s.steps[j].epoch <= s.steps[j-1].epoch || s.steps[j].from <= s.steps[j-1].from {
					t.Fatalf("run %d: steps not increasing: %v", run, s.steps)
				}
			}
		}
	}
}
