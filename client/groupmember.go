package client

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
)

// run is the membership goroutine (the member contract in group.go).
func (g *GroupConsumer) run() {
	defer close(g.done)
	for attempt := 0; g.ctx.Err() == nil; {
		a, err := g.join()
		if err != nil {
			if !IsRetriable(err) && g.ctx.Err() == nil {
				g.fail(err)
				return
			}
			attempt++
			if backoff.Sleep(g.ctx, backoff.Delay(attempt-1, g.c.cfg.backoffMin, g.c.cfg.backoffMax, nil)) != nil {
				break
			}
			continue
		}
		attempt = 0
		g.member(a)
	}
	g.finish()
}

// joinTimeout bounds one join, retries included: a member owns nothing
// while it joins, so it may wait (the first join of a cluster also
// creates the cursor stream).
const joinTimeout = 30 * time.Second

// join joins the group as a new incarnation of the member.
func (g *GroupConsumer) join() (*geologv1.GroupAssignment, error) {
	ctx, cancel := context.WithTimeout(g.ctx, joinTimeout)
	defer cancel()
	var a *geologv1.GroupAssignment
	err := g.c.callCoordinator(ctx, g.group, func(ctx context.Context, cc geologv1.ConsumerClient, opts ...grpc.CallOption) (err error) {
		a, err = cc.JoinGroup(ctx, g.joinRequest(), opts...)
		return err
	})
	if err != nil {
		err = g.retriableTimeout(err)
		g.log.Debug("join", "error", err)
		return nil, err
	}
	g.log.Debug("joined", "epoch", a.GetMemberEpoch(), "ranges", a.GetRanges())
	g.reconcile(a)
	return a, nil
}

// member heartbeats and commits until the member is fenced (it returns to
// join again) or the consumer closes.
func (g *GroupConsumer) member(a *geologv1.GroupAssignment) {
	interval := heartbeatInterval(a)
	lastOK := time.Now() // when the last answered heartbeat was sent
	hb := time.NewTimer(interval)
	defer hb.Stop()
	commit := time.NewTicker(g.cfg.autoCommitInterval)
	defer commit.Stop()
	for {
		select {
		case <-hb.C:
		case <-g.heartbeatNow:
			g.commitEnded() // a split range's end, for the coordinator to see
		case <-commit.C:
			if err := g.commit(g.ctx, nil); err != nil && g.ctx.Err() == nil {
				g.log.Debug("auto-commit", "error", err)
			}
			continue
		case <-g.ctx.Done():
			return
		}
		sent := time.Now()
		a, err := g.heartbeat()
		switch {
		case err == nil:
			lastOK, interval = sent, heartbeatInterval(a)
			g.reconcile(a)
		case fencedErr(err):
			g.lose("fenced: " + err.Error())
			return
		case time.Since(lastOK) >= g.cfg.sessionTimeout:
			g.lose("no answer from the coordinator for a session timeout: " + err.Error())
			return
		}
		hb.Reset(interval)
	}
}

func heartbeatInterval(a *geologv1.GroupAssignment) time.Duration {
	if ms := a.GetHeartbeatIntervalMs(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return 500 * time.Millisecond
}

func (g *GroupConsumer) heartbeat() (*geologv1.GroupAssignment, error) {
	g.mu.Lock()
	req := &geologv1.GroupHeartbeatRequest{Group: g.group, MemberId: g.cfg.memberID, MemberEpoch: g.epoch,
		OwnedRanges: slices.Sorted(maps.Keys(g.ranges))}
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(g.ctx, g.heartbeatTimeout())
	defer cancel()
	var a *geologv1.GroupAssignment
	err := g.c.callCoordinator(ctx, g.group, func(ctx context.Context, cc geologv1.ConsumerClient, opts ...grpc.CallOption) (err error) {
		a, err = cc.GroupHeartbeat(ctx, req, opts...)
		return err
	})
	return a, g.retriableTimeout(err)
}

// retriableTimeout turns the expiry of a call's own deadline (not the
// consumer's end) into a retriable Timeout: the call may succeed later.
func (g *GroupConsumer) retriableTimeout(err error) error {
	if err != nil && g.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return apierr.Wrap(apierr.Timeout, err, "")
	}
	return err
}

// reconcile moves the member to an assignment: releases the ranges it no
// longer lists (step 3 of the contract), starts the new ones (step 2).
func (g *GroupConsumer) reconcile(a *geologv1.GroupAssignment) {
	g.mu.Lock()
	g.epoch = a.GetMemberEpoch()
	var revoked, added []uint32
	for rng := range g.ranges {
		if !slices.Contains(a.GetRanges(), rng) {
			revoked = append(revoked, rng)
		}
	}
	for _, rng := range a.GetRanges() {
		if _, ok := g.ranges[rng]; !ok {
			added = append(added, rng)
		}
	}
	g.mu.Unlock()
	slices.Sort(revoked)
	if len(revoked) > 0 {
		g.release(revoked)
		g.kick()
	}
	if len(added) > 0 {
		g.assign(added, a.GetPositions())
	}
}

// assign takes ranges the coordinator granted and starts fetching them.
func (g *GroupConsumer) assign(rngs []uint32, positions []*geologv1.CursorPosition) {
	if g.cfg.onAssigned != nil {
		g.cfg.onAssigned(slices.Clone(rngs))
	}
	for _, rng := range rngs {
		gr := &groupRange{rng: rng, fetched: make(chan struct{})}
		from, known := uint64(0), false
		for _, p := range positions {
			if p.GetRange() == rng && p.GetStream() == g.stream {
				from, known, gr.generation = p.GetOffset(), true, p.GetGeneration()
			}
		}
		var ctx context.Context
		ctx, gr.cancel = context.WithCancel(g.ctx)
		g.mu.Lock()
		g.token++
		gr.token = g.token
		if known {
			gr.committed, gr.marked = from, from
		}
		g.ranges[rng] = gr
		g.mu.Unlock()
		go g.fetch(ctx, gr, from, known)
	}
}

// stopFetchers stops the fetchers of ranges and waits for them.
func (g *GroupConsumer) stopFetchers(rngs []uint32) {
	g.mu.Lock()
	var grs []*groupRange
	for _, rng := range rngs {
		if gr, ok := g.ranges[rng]; ok {
			grs = append(grs, gr)
		}
	}
	g.mu.Unlock()
	for _, gr := range grs {
		gr.cancel()
		<-gr.fetched
	}
}

// release gives ranges back: stop fetching, OnRevoked, commit, forget.
func (g *GroupConsumer) release(rngs []uint32) {
	g.stopFetchers(rngs)
	if g.cfg.onRevoked != nil {
		g.cfg.onRevoked(slices.Clone(rngs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.heartbeatTimeout())
	if err := g.commit(ctx, rngs); err != nil {
		// Not fatal: the next owner starts at the last committed position
		// and processes the rest again (at least once).
		g.log.Warn("commit of released ranges", "ranges", rngs, "error", err)
	}
	cancel()
	g.forget(rngs)
}

func (g *GroupConsumer) forget(rngs []uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, rng := range rngs {
		delete(g.ranges, rng)
	}
}

// lose drops every range without committing (the member is no longer the
// owner) and calls OnLost.
func (g *GroupConsumer) lose(why string) {
	g.log.Warn("lost the group's ranges; joining again", "why", why)
	all := g.Assigned()
	g.stopFetchers(all)
	g.forget(all)
	g.mu.Lock()
	g.epoch = 0
	g.mu.Unlock()
	if len(all) > 0 && g.cfg.onLost != nil {
		g.cfg.onLost(all)
	}
}

// finish ends the member as Close or Abandon asked: stop every fetcher,
// and unless abandoned, OnRevoked, commit and leave.
func (g *GroupConsumer) finish() {
	all := g.Assigned()
	g.stopFetchers(all)
	g.mu.Lock()
	abandon, epoch := g.abandon, g.epoch
	g.mu.Unlock()
	if abandon || epoch == 0 {
		g.forget(all)
		return
	}
	if len(all) > 0 && g.cfg.onRevoked != nil {
		g.cfg.onRevoked(all)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*g.heartbeatTimeout())
	defer cancel()
	if err := g.commit(ctx, nil); err != nil {
		g.log.Warn("final commit", "error", err)
	}
	g.forget(all)
	req := &geologv1.LeaveGroupRequest{Group: g.group, MemberId: g.cfg.memberID, MemberEpoch: epoch, Temporary: g.cfg.instanceID != ""}
	err := g.c.callConsumer(ctx, true, func(ctx context.Context, cc geologv1.ConsumerClient) error {
		_, err := cc.LeaveGroup(ctx, req)
		return err
	})
	if err != nil {
		g.log.Warn("leave the group", "error", err)
	}
}
