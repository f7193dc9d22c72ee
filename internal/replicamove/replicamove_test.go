package replicamove

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// fakeRange is a range's membership as its leader would change it; the
// learner gains catchUp entries per Describe.
type fakeRange struct {
	voters, learners []uint64
	last, match      uint64
	catchUp          uint64
	changes          []string
	// onDescribe, if set, runs at the start of each Describe (another
	// move's change arriving between two of this one's calls).
	onDescribe func()
	// failAfter, if set, is a change that applies and then answers an
	// error (a call that timed out while its change was on its way).
	failAfter string
	// beforeChange, if set, runs at the start of each Change (another
	// move's change overtaking the description this one decided from).
	beforeChange func()
	// ignoreExpected: Change ignores the expected voters.
	ignoreExpected bool
}

func (f *fakeRange) Change(_ context.Context, c geologv1.ReplicaChange, node uint64, expect []uint64) (*geologv1.ChangeReplicasResponse, error) {
	if f.beforeChange != nil {
		f.beforeChange()
	}
	if len(expect) > 0 && !f.ignoreExpected && !SameVoters(f.voters, expect) {
		return nil, fmt.Errorf("the range's voters changed: %v, not the expected %v", f.voters, expect)
	}
	f.changes = append(f.changes, c.String())
	switch c {
	case geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER:
		f.learners = append(f.learners, node)
	case geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE:
		f.learners = slices.DeleteFunc(f.learners, func(id uint64) bool { return id == node })
		f.voters = append(f.voters, node)
	case geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE:
		f.voters = slices.DeleteFunc(f.voters, func(id uint64) bool { return id == node })
		f.learners = slices.DeleteFunc(f.learners, func(id uint64) bool { return id == node })
	}
	if c.String() == f.failAfter {
		return nil, errors.New("timed out")
	}
	return &geologv1.ChangeReplicasResponse{Voters: f.voters, Learners: f.learners}, nil
}

func (f *fakeRange) Describe(context.Context) (*geologv1.DescribeReplicasResponse, error) {
	if f.onDescribe != nil {
		f.onDescribe()
	}
	d := &geologv1.DescribeReplicasResponse{LastIndex: f.last}
	for _, id := range f.voters {
		d.Replicas = append(d.Replicas, &geologv1.ReplicaStatus{NodeId: id, Role: "voter", MatchIndex: f.last})
	}
	for _, id := range f.learners {
		f.match = min(f.last, f.match+f.catchUp)
		d.Replicas = append(d.Replicas, &geologv1.ReplicaStatus{NodeId: id, Role: "learner", MatchIndex: f.match})
	}
	return d, nil
}

// TestReplaceSteps: a move adds the learner, waits for it to catch up,
// promotes it and removes the old voter, in that order; a move started
// again after each step resumes where it was and repeats none.
func TestReplaceSteps(t *testing.T) {
	ctx := context.Background()
	cfg := Config{PollInterval: time.Millisecond}
	f := &fakeRange{voters: []uint64{1, 2, 3}, last: 100, catchUp: 30}
	if err := Replace(ctx, f, 1, 4, cfg); err != nil {
		t.Fatal(err)
	}
	want := []string{"REPLICA_CHANGE_ADD_LEARNER", "REPLICA_CHANGE_PROMOTE", "REPLICA_CHANGE_REMOVE"}
	if !slices.Equal(f.changes, want) || !slices.Equal(f.voters, []uint64{2, 3, 4}) || f.match != 100 {
		t.Fatalf("changes %v voters %v match %d", f.changes, f.voters, f.match)
	}
	// Interrupted after the promotion: only the removal is left.
	f = &fakeRange{voters: []uint64{1, 2, 3, 4}, last: 100}
	if err := Replace(ctx, f, 1, 4, cfg); err != nil || !slices.Equal(f.changes, want[2:]) {
		t.Fatalf("resume at remove: %v %v", f.changes, err)
	}
	// Done already: nothing.
	if err := Replace(ctx, f, 1, 4, cfg); err != nil || len(f.changes) != 1 {
		t.Fatalf("resume when done: %v %v", f.changes, err)
	}
	// A learner within LagEntriesMax is promoted without an exact match.
	f = &fakeRange{voters: []uint64{1, 2, 3}, learners: []uint64{4}, last: 100, match: 90}
	if err := Replace(ctx, f, 0, 4, Config{PollInterval: time.Millisecond, LagEntriesMax: 10}); err != nil || !slices.Equal(f.changes, want[1:2]) {
		t.Fatalf("lag bound: %v %v", f.changes, err)
	}
	// Planned from a stale view: the source has left and the target is
	// not a member; adding it would leave four voters.
	f = &fakeRange{voters: []uint64{1, 2, 3}, last: 100}
	if err := Replace(ctx, f, 6, 4, cfg); !errors.Is(err, ErrSourceGone) || len(f.changes) != 0 {
		t.Fatalf("a move whose source is gone: changes %v, %v", f.changes, err)
	}
	if StepOf(&geologv1.DescribeReplicasResponse{}, 1, 4) != StepLearner {
		t.Fatal("StepOf an empty range")
	}
}

// TestSilentLearnerNotPromoted: on a range whose log is shorter than
// LagEntriesMax, a learner that never answered (match index 0: its node
// is down or cut off) is not taken as caught up; the move waits, and
// promotes it only once it has answered. It fails without CaughtUp's
// match-above-0 clause (the learner was promoted and node 1 removed).
func TestSilentLearnerNotPromoted(t *testing.T) {
	f := &fakeRange{voters: []uint64{1, 2, 3}, last: 12}
	describes := 0
	f.onDescribe = func() {
		describes++
		if describes == 20 {
			f.catchUp = 1 // the learner's node answers from here on
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if CaughtUp(&geologv1.DescribeReplicasResponse{LastIndex: 12},
		&geologv1.ReplicaStatus{NodeId: 4, Role: "learner"}, 64) {
		t.Fatal("a learner with match index 0 counts as caught up")
	}
	if err := Replace(ctx, f, 1, 4, Config{PollInterval: time.Millisecond, LagEntriesMax: 64}); err != nil {
		t.Fatal(err)
	}
	if describes < 20 || f.match == 0 || !slices.Equal(f.voters, []uint64{2, 3, 4}) {
		t.Fatalf("promoted after %d descriptions, learner's match %d, voters %v", describes, f.match, f.voters)
	}
}

// TestReplaceOverlappingMoves: two moves of node 6's replica of one range,
// planned from the same view (voters 2, 3, 6) by two rebalancer
// leaderships, 6->4 and 6->5. Whichever way they interleave, at most one
// promotes its learner and the range never holds more than three voters:
// the later one refuses to add its learner beside the first's; one whose
// learner finds another learner beside it at promotion takes its own off.
// It fails without Config.Planned (the range ended with voters 2, 3, 4, 5).
func TestReplaceOverlappingMoves(t *testing.T) {
	ctx := context.Background()
	planned := []uint64{2, 3, 6}
	cfg := Config{PollInterval: time.Millisecond, Planned: planned}
	removes := func(f *fakeRange) int {
		n := 0
		for _, c := range f.changes {
			if c == "REPLICA_CHANGE_REMOVE" {
				n++
			}
		}
		return n
	}

	// B starts once A's learner is in: B adds nothing.
	f := &fakeRange{voters: slices.Clone(planned), last: 100, catchUp: 100}
	var errB error
	cfgA := cfg
	cfgA.OnChange = func(c geologv1.ReplicaChange, node uint64, _ *geologv1.ChangeReplicasResponse) {
		if c == geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER && errB == nil {
			before := len(f.changes)
			errB = Replace(ctx, f, 6, 5, cfg)
			if len(f.changes) != before {
				t.Fatalf("B changed the range beside A's learner: %v", f.changes[before:])
			}
		}
	}
	if err := Replace(ctx, f, 6, 4, cfgA); err != nil {
		t.Fatalf("A: %v", err)
	}
	if !errors.Is(errB, ErrConfigChanged) || !SameVoters(f.voters, []uint64{2, 3, 4}) || len(f.learners) != 0 {
		t.Fatalf("B: %v; voters %v learners %v, want B refused and 2 3 4", errB, f.voters, f.learners)
	}

	// Both learners in before either promotes (both checked an unchanged
	// range): A, checking at promotion, takes its learner off; B then
	// finishes alone.
	f = &fakeRange{voters: slices.Clone(planned), last: 100, catchUp: 100}
	f.onDescribe = func() {
		if slices.Contains(f.learners, 4) && !slices.Contains(f.learners, 5) {
			f.learners = append(f.learners, 5) // B's learner, added after B's own check
		}
	}
	if err := Replace(ctx, f, 6, 4, cfg); !errors.Is(err, ErrConfigChanged) {
		t.Fatalf("A with B's learner beside its own: %v", err)
	}
	if !SameVoters(f.voters, planned) || !SameVoters(f.learners, []uint64{5}) {
		t.Fatalf("after A stopped: voters %v learners %v, want 2 3 6 and learner 5", f.voters, f.learners)
	}
	f.onDescribe = nil
	if err := Replace(ctx, f, 6, 5, cfg); err != nil || !SameVoters(f.voters, []uint64{2, 3, 5}) || len(f.learners) != 0 {
		t.Fatalf("B resumed: %v; voters %v learners %v", err, f.voters, f.learners)
	}

	// A voter removed meanwhile (another move finished first): the
	// removal of 6 would leave two voters of a range planned with three.
	f = &fakeRange{voters: []uint64{2, 4, 6}, last: 100}
	if err := Replace(ctx, f, 6, 4, Config{PollInterval: time.Millisecond, Planned: []uint64{2, 3, 6}}); !errors.Is(err, ErrConfigChanged) || removes(f) != 0 {
		t.Fatalf("removal below the planned count: %v, changes %v", err, f.changes)
	}
}

// TestChangeOvertaken: a change that lands between a move's last
// description and its own change (another move's removal, committed
// after the Describe) makes the leader refuse the change decided from
// that description: the move fails and the range keeps its voters. With
// the expectation ignored, Replace removes its source as well and the
// range is left with two voters.
func TestChangeOvertaken(t *testing.T) {
	ctx := context.Background()
	for _, ignore := range []bool{false, true} {
		f := &fakeRange{voters: []uint64{1, 2, 3}, last: 100, catchUp: 100, ignoreExpected: ignore}
		f.beforeChange = func() {
			if slices.Contains(f.voters, 4) && slices.Contains(f.voters, 2) {
				f.voters = slices.DeleteFunc(f.voters, func(id uint64) bool { return id == 2 }) // another move's
			}
		}
		err := Replace(ctx, f, 1, 4, Config{PollInterval: time.Millisecond, Planned: []uint64{1, 2, 3}})
		switch {
		case !ignore && (err == nil || !SameVoters(f.voters, []uint64{1, 3, 4})):
			t.Fatalf("overtaken removal: %v, voters %v, want refused and voters 1 3 4", err, f.voters)
		case ignore && (err != nil || !SameVoters(f.voters, []uint64{3, 4})):
			t.Fatalf("the test's premise: without the expectation the removal goes through (%v, voters %v)", err, f.voters)
		}
	}
}

// TestRemoveExcessVoter: Remove takes a voter off while at least
// votersMin remain, refuses below, and leaves a range the node has left.
func TestRemoveExcessVoter(t *testing.T) {
	ctx := context.Background()
	f := &fakeRange{voters: []uint64{2, 3, 4, 5}, last: 100}
	if err := Remove(ctx, f, 5, 3, Config{}); err != nil || !SameVoters(f.voters, []uint64{2, 3, 4}) {
		t.Fatalf("remove: %v, voters %v", err, f.voters)
	}
	if err := Remove(ctx, f, 4, 3, Config{}); !errors.Is(err, ErrConfigChanged) || !SameVoters(f.voters, []uint64{2, 3, 4}) {
		t.Fatalf("remove below the factor: %v, voters %v", err, f.voters)
	}
	if err := Remove(ctx, f, 5, 3, Config{}); err != nil || len(f.changes) != 1 {
		t.Fatalf("remove a node already gone: %v, changes %v", err, f.changes)
	}
	// A removal that applied though its call failed is done; one that did
	// not apply is an error.
	f = &fakeRange{voters: []uint64{2, 3, 4, 5}, last: 100, failAfter: "REPLICA_CHANGE_REMOVE"}
	if err := Remove(ctx, f, 5, 3, Config{}); err != nil || !SameVoters(f.voters, []uint64{2, 3, 4}) {
		t.Fatalf("removal applied, call failed: %v, voters %v", err, f.voters)
	}
	for _, c := range []string{"REPLICA_CHANGE_ADD_LEARNER", "REPLICA_CHANGE_PROMOTE", "REPLICA_CHANGE_REMOVE"} {
		f = &fakeRange{voters: []uint64{1, 2, 3}, last: 100, catchUp: 100, failAfter: c}
		err := Replace(ctx, f, 1, 4, Config{PollInterval: time.Millisecond, Planned: []uint64{1, 2, 3}})
		if err != nil || !SameVoters(f.voters, []uint64{2, 3, 4}) || len(f.changes) != 3 {
			t.Fatalf("move whose %s applied, call failed: %v, voters %v, changes %v", c, err, f.voters, f.changes)
		}
	}
	// A change that did not apply stays an error.
	f = &fakeRange{voters: []uint64{1, 2, 3}, last: 100, catchUp: 100}
	if err := change(ctx, refuse{f}, Config{}, geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE, 4, nil); err == nil {
		t.Fatal("a refused promotion of a non-member counted as made")
	}
}

// refuse is an Admin whose changes all fail without applying.
type refuse struct{ *fakeRange }

func (refuse) Change(context.Context, geologv1.ReplicaChange, uint64, []uint64) (*geologv1.ChangeReplicasResponse, error) {
	return nil, errors.New("refused")
}
