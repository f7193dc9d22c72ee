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
	Change(ctx context.Context, change geologv1.ReplicaChange, node uint64) (*geologv1.ChangeReplicasResponse, error)
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
		if err := change(ctx, a, cfg, geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER, to); err != nil {
			return err
		}
		step = StepCatchUp
	}
	if step == StepCatchUp {
		if err := waitCaughtUp(ctx, a, to, cfg); err != nil {
			return err
		}
		if err := change(ctx, a, cfg, geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE, to); err != nil {
			return err
		}
		step = StepRemove
	}
	if step == StepRemove && from != 0 {
		// Removing the range leader itself: the leader hands leadership
		// to another voter first and answers NOT_LEADER, which Admin
		// retries at the new leader (regionsvc/admin.go).
		return change(ctx, a, cfg, geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, from)
	}
	return nil
}

// ErrSourceGone: a move whose source is no longer a member of the range,
// and whose target is not one yet, is refused before it adds anything.
var ErrSourceGone = errors.New("replicamove: the move's source is gone")

func isMember(d *geologv1.DescribeReplicasResponse, node uint64) bool {
	return slices.ContainsFunc(d.GetReplicas(), func(r *geologv1.ReplicaStatus) bool { return r.GetNodeId() == node })
}

func change(ctx context.Context, a Admin, cfg Config, c geologv1.ReplicaChange, node uint64) error {
	resp, err := a.Change(ctx, c, node)
	if err != nil {
		return err
	}
	if cfg.OnChange != nil {
		cfg.OnChange(c, node, resp)
	}
	return nil
}

// waitCaughtUp polls the leader until the learner to is within
// cfg.LagEntriesMax of its last index.
func waitCaughtUp(ctx context.Context, a Admin, to uint64, cfg Config) error {
	poll := cfg.PollInterval
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	start := time.Now()
	for {
		d, err := a.Describe(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(d.GetReplicas(), func(r *geologv1.ReplicaStatus) bool { return r.GetNodeId() == to })
		if i < 0 {
			return fmt.Errorf("replicamove: node %d is no longer a member of the range", to)
		}
		if CaughtUp(d, d.Replicas[i], cfg.LagEntriesMax) {
			if cfg.OnCaughtUp != nil {
				cfg.OnCaughtUp(to, time.Since(start))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// CaughtUp reports whether replica r is within lagMax entries of the
// leader's last index in d.
func CaughtUp(d *geologv1.DescribeReplicasResponse, r *geologv1.ReplicaStatus, lagMax uint64) bool {
	return r.GetMatchIndex()+lagMax >= d.GetLastIndex()
}
