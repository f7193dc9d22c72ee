// Package replicamove carries out one replica move of a range: the steps
// of `geolog replicas replace` (add the new node as a learner, wait until
// it has caught up, by log entries or by a snapshot of the segments,
// promote it to a voter, remove the old node). The CLI and the region's
// rebalancer (regionsvc/rebalance*.go) both run it, over their own routing
// to the range leader.
package replicamove

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Admin makes one range's membership calls at its leader. The
// implementation routes each call to the range leader (following NOT_LEADER
// hints, retrying a bounded number of times); Replace adds no retry of its
// own beyond the catch-up poll.
type Admin interface {
	// Change makes one membership change at the range leader; with
	// expectVoters set, only while the range's voters are exactly those
	// (ChangeReplicasRequest.expected_voters).
	Change(ctx context.Context, change geologv1.ReplicaChange, node uint64, expectVoters []uint64) (*geologv1.ChangeReplicasResponse, error)
	Describe(ctx context.Context) (*geologv1.DescribeReplicasResponse, error)
}

// Config tunes Replace; the zero value is the CLI's behaviour.
type Config struct {
	// PollInterval is the pause between catch-up checks; default 100 ms.
	PollInterval time.Duration
	// LagEntriesMax: the learner counts as caught up once its match index
	// is within this many entries of the leader's last index; default 0
	// (exactly caught up). Under a steady stream of appends an exact match
	// may never be seen between two polls; promoting a learner a few
	// entries behind is safe (the other voters still form a quorum).
	LagEntriesMax uint64
	// OnChange, if set, is told of each change applied.
	OnChange func(change geologv1.ReplicaChange, node uint64, resp *geologv1.ChangeReplicasResponse)
	// OnCaughtUp, if set, is told when the learner caught up.
	OnCaughtUp func(node uint64, took time.Duration)
	// Planned, if set, are the range's voters the move was planned from
	// (the rebalancer's snapshot). Replace then adds the learner only while
	// the range still has exactly these voters and no learner, promotes it
	// only while the range has these voters and no other learner, and
	// removes the old voter only if as many voters as Planned remain; else
	// it stops with ErrConfigChanged (removing its own learner, if it added
	// one). Another move of the same range, started by another catalogue
	// leader, an earlier leadership of this one or by hand, changed the
	// range since: of two moves that overlap, at most one promotes, so the
	// range never gains a voter too many. nil: no check (the CLI's replace
	// works on the range as it is).
	Planned []uint64
}

// Step names where a move is.
type Step uint8

const (
	// StepLearner: to is not yet a member; it is added as a learner.
	StepLearner Step = iota
	// StepCatchUp: to is a learner catching up.
	StepCatchUp
	// StepPromote: to is caught up and is promoted.
	StepPromote
	// StepRemove: to is a voter; from (still a member) is removed.
	StepRemove
	// StepDone: to is a voter and from is not a member.
	StepDone
)

// StepOf is where a move from → to stands given the range's replicas as
// its leader describes them, so that a move interrupted (a leader change,
// a restart of the rebalancer) resumes where it was.
func StepOf(d *geologv1.DescribeReplicasResponse, from, to uint64) Step {
	role := map[uint64]string{}
	for _, r := range d.GetReplicas() {
		role[r.GetNodeId()] = r.GetRole()
	}
	switch role[to] {
	case "":
		return StepLearner
	case "learner":
		return StepCatchUp
	}
	if from != 0 && role[from] != "" {
		return StepRemove
	}
	return StepDone
}

// Replace moves the range's replica from node from to node to (from 0:
// only adds to, for a range missing a replica). Each step is skipped if
// the range already took it, so Replace may be called again after an
// interruption.
func Replace(ctx context.Context, a Admin, from, to uint64, cfg Config) error {
	if to == 0 || to == from {
		return fmt.Errorf("replicamove: move %d -> %d", from, to)
	}
	d, err := a.Describe(ctx)
	if err != nil {
		return err
	}
	step := StepOf(d, from, to)
	if step == StepLearner && from != 0 && !isMember(d, from) {
		// Nothing of this move has happened and its source is not a member:
		// the move was planned from a view the range has left (another
		// move or a repair took the replica off). Adding to now would give
		// the range a voter too many; the caller plans again.
		return fmt.Errorf("%w: node %d is not a member of the range", ErrSourceGone, from)
	}
	if step == StepLearner {
		if err := cfg.checkPlanned(d, 0); err != nil {
			return err
		}
		if err := change(ctx, a, cfg, geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER, to, d); err != nil {
			return err
		}
		step = StepCatchUp
	}
	if step == StepCatchUp {
		if err := catchUpAndPromote(ctx, a, to, cfg); err != nil {
			return err
		}
		step = StepRemove
	}
	if step == StepRemove && from != 0 {
		if d, err = a.Describe(ctx); err != nil {
			return err
		}
		if n := len(voters(d)); cfg.Planned != nil && n <= len(cfg.Planned) && isMember(d, from) {
			// Another move removed a voter meanwhile: removing from too
			// would leave the range below what it was planned with.
			return fmt.Errorf("%w: %d voters %v, planned from %v", ErrConfigChanged, n, voters(d), cfg.Planned)
		}
		// Removing the range leader itself: the leader hands leadership
		// to another voter first and answers NOT_LEADER, which Admin
		// retries at the new leader (regionsvc/admin.go).
		return change(ctx, a, cfg, geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, from, d)
	}
	return nil
}

// ErrSourceGone: a move whose source is no longer a member of the range,
// and whose target is not one yet, is refused before it adds anything.
var ErrSourceGone = errors.New("replicamove: the move's source is gone")

// ErrConfigChanged: the range's voters or learners are no longer those the
// move was planned from (Config.Planned); the caller plans again.
var ErrConfigChanged = errors.New("replicamove: the range's configuration changed since the move was planned")

// catchUpAndPromote waits for learner to to catch up, checks the range
// against cfg.Planned (removing to if it no longer holds) and promotes
// it.
func catchUpAndPromote(ctx context.Context, a Admin, to uint64, cfg Config) error {
	d, err := waitCaughtUp(ctx, a, to, cfg)
	if err != nil {
		return err
	}
	if err := cfg.checkPlanned(d, to); err != nil {
		// Another move's learner or voter arrived beside this one: this
		// move stops, and takes its learner off (best effort: a learner
		// left behind is removed by the rebalancer's cleanup). Never a
		// voter: if to is one, another move promoted it.
		if !slices.Contains(learners(d), to) {
			return err
		}
		if _, rerr := a.Change(ctx, geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, to, voters(d)); rerr != nil {
			return errors.Join(err, fmt.Errorf("replicamove: removing learner %d: %w", to, rerr))
		}
		return err
	}
	return change(ctx, a, cfg, geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE, to, d)
}

// checkPlanned returns ErrConfigChanged unless d's voters are cfg.Planned
// and its learners are exactly learner (0: none); nil if no Planned.
func (cfg Config) checkPlanned(d *geologv1.DescribeReplicasResponse, learner uint64) error {
	if cfg.Planned == nil {
		return nil
	}
	var want []uint64
	if learner != 0 {
		want = []uint64{learner}
	}
	vs, ls := voters(d), learners(d)
	if !SameVoters(vs, cfg.Planned) || !SameVoters(ls, want) {
		return fmt.Errorf("%w: voters %v learners %v, planned from voters %v", ErrConfigChanged, vs, ls, cfg.Planned)
	}
	return nil
}

// Remove removes voter from of the range, planned as a voter beyond its
// replication factor: only while the range keeps at least votersMin
// voters without it (else ErrConfigChanged). A range from is no longer a
// member of is left as it is (nil). Removing the range leader hands
// leadership off first, as in Replace.
func Remove(ctx context.Context, a Admin, from uint64, votersMin int, cfg Config) error {
	d, err := a.Describe(ctx)
	if err != nil {
		return err
	}
	if !isMember(d, from) {
		return nil
	}
	if vs := voters(d); slices.Contains(vs, from) && len(vs)-1 < votersMin {
		return fmt.Errorf("%w: removing node %d would leave %d voters, fewer than %d", ErrConfigChanged, from, len(vs)-1, votersMin)
	}
	return change(ctx, a, cfg, geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, from, d)
}

// applied reports whether d shows change c of node made.
func applied(d *geologv1.DescribeReplicasResponse, c geologv1.ReplicaChange, node uint64) bool {
	switch c {
	case geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER:
		return slices.Contains(learners(d), node)
	case geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE:
		return slices.Contains(voters(d), node)
	case geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE:
		return !isMember(d, node)
	}
	return false
}

func voters(d *geologv1.DescribeReplicasResponse) []uint64   { return role(d, "voter") }
func learners(d *geologv1.DescribeReplicasResponse) []uint64 { return role(d, "learner") }

func role(d *geologv1.DescribeReplicasResponse, want string) []uint64 {
	var out []uint64
	for _, r := range d.GetReplicas() {
		if r.GetRole() == want {
			out = append(out, r.GetNodeId())
		}
	}
	return out
}

// SameVoters reports whether a and b hold the same node ids, in any order
// and ignoring repeats: how a range's voters are compared wherever a change
// names the voters it was decided from.
func SameVoters(a, b []uint64) bool {
	return slices.Equal(slices.Compact(slices.Sorted(slices.Values(a))), slices.Compact(slices.Sorted(slices.Values(b))))
}

func isMember(d *geologv1.DescribeReplicasResponse, node uint64) bool {
	return slices.ContainsFunc(d.GetReplicas(), func(r *geologv1.ReplicaStatus) bool { return r.GetNodeId() == node })
}

// change makes one membership change. A call that failed while its
// change was on its way (timed out, retried by Admin and then refused:
// "not a learner", "not a member") may have applied all the same: if the
// range as its leader now describes it shows the change made, it counts as
// made. Reporting it failed would fail the move with its work done, and
// the move planned again from there is how a range once got a fifth
// voter. d is the description the change was decided from: the leader
// makes it only while the range's voters are still d's, so a change that
// overtook d (another move's, or this one's own earlier attempt) fails
// it, and the description after it decides as above.
func change(ctx context.Context, a Admin, cfg Config, c geologv1.ReplicaChange, node uint64, d *geologv1.DescribeReplicasResponse) error {
	resp, err := a.Change(ctx, c, node, voters(d))
	if err != nil {
		d, derr := a.Describe(ctx)
		if derr != nil || !applied(d, c, node) {
			return err
		}
		resp = &geologv1.ChangeReplicasResponse{Voters: voters(d), Learners: learners(d)}
	}
	if cfg.OnChange != nil {
		cfg.OnChange(c, node, resp)
	}
	return nil
}

// waitCaughtUp polls the leader until the learner to is within
// cfg.LagEntriesMax of its last index, and returns the last description.
func waitCaughtUp(ctx context.Context, a Admin, to uint64, cfg Config) (*geologv1.DescribeReplicasResponse, error) {
	poll := cfg.PollInterval
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	start := time.Now()
	for {
		d, err := a.Describe(ctx)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(d.GetReplicas(), func(r *geologv1.ReplicaStatus) bool { return r.GetNodeId() == to })
		if i < 0 {
			return nil, fmt.Errorf("replicamove: node %d is no longer a member of the range", to)
		}
		if CaughtUp(d, d.Replicas[i], cfg.LagEntriesMax) {
			if cfg.OnCaughtUp != nil {
				cfg.OnCaughtUp(to, time.Since(start))
			}
			return d, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// CaughtUp reports whether replica r has answered the leader (a match
// index above 0: every range's log starts at index 1) and is within lagMax
// entries of the leader's last index in d. Without the first half, a
// learner on a node that is down or cut off, which never answered, would
// count as caught up on a range whose log is shorter than lagMax, and a
// move would promote it and then remove a live voter.
func CaughtUp(d *geologv1.DescribeReplicasResponse, r *geologv1.ReplicaStatus, lagMax uint64) bool {
	return r.GetMatchIndex() > 0 && r.GetMatchIndex()+lagMax >= d.GetLastIndex()
}
