package replicamove

import (
	"context"
	"errors"
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
}

func (f *fakeRange) Change(_ context.Context, c geologv1.ReplicaChange, node uint64) (*geologv1.ChangeReplicasResponse, error) {
	f.changes = append(f.changes, c.String())
	switch c {
	case geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER:
		f.learners = append(f.learners, node)
	case geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE:
		f.learners = slices.DeleteFunc(f.learners, func(id uint64) bool { return id == node })
		f.voters = append(f.voters, node)
	case geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE:
		f.voters = slices.DeleteFunc(f.voters, func(id uint64) bool { return id == node })
	}
	return &geologv1.ChangeReplicasResponse{Voters: f.voters, Learners: f.learners}, nil
}

func (f *fakeRange) Describe(context.Context) (*geologv1.DescribeReplicasResponse, error) {
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
