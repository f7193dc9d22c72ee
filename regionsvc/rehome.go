package regionsvc

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Planned rehome (DESIGN.md "Planned rehome"), coordinated by the node that
// takes the request, range by range:
//
//  1. PrepareRehome marks the range as moving (compare-and-set on its
//     epoch); the old home's nodes are told to refresh at once (twice: the
//     second heartbeat confirms to the store that they act on the mark), so
//     they admit no more appends and ack nothing more.
//  2. The old home's final tail T is read from its leader (a ReadIndex,
//     repeated until two readings agree: batches already in Raft when the
//     mark arrived commit unacknowledged).
//  3. The target region's mirror catches up to T (the replicator keeps
//     shipping from the old home).
//  4. CompleteRehome moves the lease to the target at epoch+1 from offset
//     T; the store refuses while a live node of the old home has not
//     confirmed the mark. The target's nodes refresh and start admitting.
//
// Every acknowledged record is below T (it was acked before the old home
// learned of the mark, so committed before the tail was read), and the
// target holds everything below T before it appends: zero loss. The pause
// is steps 1–4.

// rehomeConcurrency bounds the ranges moved at once by one request.
const rehomeConcurrency = 16

func (s *adminServer) Rehome(ctx context.Context, req *geologv1.RehomeRequest) (*geologv1.RehomeResponse, error) {
	resp, err := s.node.rehome(ctx, req)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return resp, nil
}

func (s *adminServer) RefreshHomes(ctx context.Context, _ *geologv1.RefreshHomesRequest) (*geologv1.RefreshHomesResponse, error) {
	n := s.node
	if n.homing == nil {
		return nil, apierr.ToStatus(apierr.New(apierr.InvalidArgument, "homing is off on this node (no --lease-store)"))
	}
	for i := 0; i < 2; i++ {
		if err := n.homing.homes.Refresh(ctx); err != nil {
			return nil, apierr.ToStatus(homingErr(err))
		}
	}
	n.refreshDirectory(ctx)
	return &geologv1.RefreshHomesResponse{HomesVersion: n.homing.homes.View().HomesVersion}, nil
}

func (n *Node) rehome(ctx context.Context, req *geologv1.RehomeRequest) (*geologv1.RehomeResponse, error) {
	if n.homing == nil {
		return nil, apierr.New(apierr.InvalidArgument, "rehome needs homing: this node runs without a lease store (--lease-store)")
	}
	spec, ok := n.streamSpec(req.GetStream())
	if !ok {
		if _, err := n.lookupStream(ctx, req.GetStream()); err != nil {
			return nil, err
		}
		spec, _ = n.streamSpec(req.GetStream())
	}
	to := req.GetRegion()
	if !slices.Contains(spec.Regions, to) {
		return nil, apierr.New(apierr.InvalidArgument, "region %q is not a region of stream %q (%v)", to, spec.Name, spec.Regions)
	}
	var ranges []uint32
	switch {
	case req.GetAllRanges() && len(req.GetRanges()) > 0:
		return nil, apierr.New(apierr.InvalidArgument, "give ranges or all_ranges, not both")
	case req.GetAllRanges():
		for r := uint32(0); r < spec.RangeCount; r++ {
			ranges = append(ranges, r)
		}
	case len(req.GetRanges()) == 0:
		return nil, apierr.New(apierr.InvalidArgument, "no range to move (give ranges or all_ranges)")
	default:
		for _, r := range req.GetRanges() {
			if r >= spec.RangeCount {
				return nil, apierr.New(apierr.RangeNotFound, "stream %q has %d ranges; range %d does not exist", spec.Name, spec.RangeCount, r)
			}
			if !slices.Contains(ranges, r) {
				ranges = append(ranges, r)
			}
		}
	}
	out := make([]*geologv1.RangeRehome, len(ranges))
	sem := make(chan struct{}, rehomeConcurrency)
	var wg sync.WaitGroup
	for i, r := range ranges {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = n.rehomeRange(ctx, spec, r, to)
		}()
	}
	wg.Wait()
	return &geologv1.RehomeResponse{Ranges: out}, nil
}

// rehomeRange moves one range; errors are reported in the result.
func (n *Node) rehomeRange(ctx context.Context, spec streamSpec, r uint32, to string) *geologv1.RangeRehome {
	res := &geologv1.RangeRehome{Range: r, ToRegion: to}
	fail := func(err error) *geologv1.RangeRehome {
		res.Status = apierr.As(homingErr(err)).Error()
		return res
	}
	hs := n.homing
	key := homing.RangeKey{Stream: spec.Name, Range: r}
	homes, err := hs.store.Homes(ctx, []homing.RangeKey{key})
	if err != nil {
		return fail(err)
	}
	cur := homes[0]
	res.FromRegion, res.Epoch = cur.Region, cur.Epoch
	switch {
	case cur.Epoch == 0:
		return fail(apierr.New(apierr.RangeNotFound, "range %s has no home record", key))
	case cur.Region == to && cur.MovingTo == "":
		res.Status = "already home"
		return res
	case cur.MovingTo != "" && cur.MovingTo != to:
		return fail(apierr.New(apierr.InvalidArgument, "range %s is already moving to %s", key, cur.MovingTo))
	}
	start := time.Now()
	prepared, err := hs.homes.PrepareRehome(ctx, key, cur.Epoch, to)
	if err != nil {
		return fail(err)
	}
	abort := func(err error) *geologv1.RangeRehome {
		// Give the range back to its home rather than leave it stopped.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, cerr := hs.homes.CancelRehome(cctx, key, prepared.Epoch); cerr != nil {
			n.logger.Error("rehome: cancel failed; the range stays stopped until a rehome completes or is cancelled", "range", key, "error", cerr)
		}
		n.refreshRegion(cctx, cur.Region)
		return fail(err)
	}
	if err := n.refreshRegion(ctx, cur.Region); err != nil {
		n.logger.Warn("rehome: refreshing the old home", "range", key, "error", err) // the store's drain check decides
	}
	tail, err := n.drainedTail(ctx, spec, r, cur.Region)
	if err != nil {
		return abort(err)
	}
	if err := n.waitRegionTail(ctx, to, spec.Name, r, tail); err != nil {
		return abort(err)
	}
	var moved homing.Home
	for {
		moved, err = hs.homes.CompleteRehome(ctx, key, prepared.Epoch, to, tail)
		if err == nil {
			break
		}
		if !errors.Is(err, homing.ErrNotDrained) || ctx.Err() != nil {
			return abort(err)
		}
		n.refreshRegion(ctx, cur.Region)
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return abort(ctx.Err())
		}
	}
	if err := n.refreshRegion(ctx, to); err != nil {
		n.logger.Warn("rehome: refreshing the new home", "range", key, "error", err)
	}
	res.PauseMicros = time.Since(start).Microseconds()
	// The old home learns where its producers go now.
	go n.refreshRegion(context.WithoutCancel(ctx), cur.Region)
	res.Epoch, res.StartOffset, res.Status = moved.Epoch, tail, "moved"
	n.logger.Info("rehomed", "range", key, "from", cur.Region, "to", to, "epoch", moved.Epoch, "start_offset", tail, "pause", time.Since(start))
	return res
}

// regionAddrs is how this node reaches a region's nodes.
func (n *Node) regionAddrList(region string) []string {
	if region == n.cfg.Region {
		var out []string
		for _, id := range n.region.ids {
			out = append(out, n.cfg.Peers[id])
		}
		return out
	}
	return n.cfg.Regions[region]
}

// refreshRegion asks every node of region to refresh its homes now; the
// error is the first failure (the others still ran).
func (n *Node) refreshRegion(ctx context.Context, region string) error {
	addrs := n.regionAddrList(region)
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if addr == n.Addr() || (region == n.cfg.Region && addr == n.cfg.Peers[n.cfg.NodeID]) {
				_, errs[i] = (&adminServer{node: n}).RefreshHomes(ctx, nil)
				return
			}
			conn, err := n.peerConn(addr)
			if err != nil {
				errs[i] = err
				return
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, errs[i] = geologv1.NewAdminClient(conn).RefreshHomes(cctx, &geologv1.RefreshHomesRequest{})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// drainedTail reads the old home's final tail: the home leader's
// confirmed committed end, read until two readings agree.
func (n *Node) drainedTail(ctx context.Context, spec streamSpec, r uint32, home string) (uint64, error) {
	read := func() (uint64, error) {
		if home == n.cfg.Region {
			d, err := n.rangeOf(ctx, spec.Name, r)
			if err != nil {
				return 0, err
			}
			return n.homeTail(ctx, d, false)
		}
		for _, addr := range n.cfg.Regions[home] {
			conn, err := n.peerConn(addr)
			if err != nil {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := geologv1.NewLogClient(conn).Read(cctx, &geologv1.ReadRequest{Stream: spec.Name, Range: r,
				Consistency: geologv1.Consistency_CONSISTENCY_HOME, MaxRecords: 1})
			cancel()
			if err == nil {
				return resp.GetTailOffset(), nil
			}
		}
		return 0, apierr.New(apierr.Unavailable, "the home region %s could not confirm the tail of %s/%d", home, spec.Name, r)
	}
	prev, err := read()
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		t, err := read()
		if err != nil {
			return 0, err
		}
		if t == prev {
			return t, nil
		}
		if time.Now().After(deadline) {
			return 0, apierr.New(apierr.Unavailable, "the tail of %s/%d kept moving after the home stopped admitting (%d → %d)", spec.Name, r, prev, t)
		}
		prev = t
	}
}

// waitRegionTail waits until region's copy of the range has tail.
func (n *Node) waitRegionTail(ctx context.Context, region, stream string, r uint32, tail uint64) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var have uint64
		if region == n.cfg.Region {
			d, err := n.rangeOf(ctx, stream, r)
			if err != nil {
				return err
			}
			have = d.committed.Load()
		} else if t := n.remoteTails(ctx, region, stream); int(r) < len(t) {
			have = t[r]
		}
		if have >= tail {
			return nil
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return apierr.New(apierr.Timeout, "region %s's copy of %s/%d did not reach offset %d (at %d)", region, stream, r, tail, have)
		}
	}
}
