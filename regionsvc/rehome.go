package regionsvc

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.opentelemetry.io/otel/attribute"
)

// Planned rehome (DESIGN.md "Planned rehome"), coordinated by a node of
// the target region (the request is forwarded there), for the ranges of
// one request that share an old home, together. The protocol is the
// deterministic core homing.Rehome; rehomeGroup drives it (rehomeDriver
// carries out its requests). In short:
//
//  0. Before anything stops, the target's mirrors catch up to the old
//     home's current tails, so that the pause covers only what arrives
//     meanwhile.
//  1. PrepareRehomes marks each range as moving (compare-and-set on its
//     epoch) and bumps the old home's homes version, in one transaction
//     that also reads the old home's homes at that new version. The
//     coordinator hands that snapshot to every node of the old home
//     (RefreshHomes with homes): each takes it at once (homing.Homes.
//     Install: no lease-store round trip), so it proposes and acks nothing
//     more for those ranges (appends are checked against the lease when
//     admitted, proposed and acked), and answers with the homes version it
//     now acts on (and will never go back from): its confirmation. Each
//     range's leader first waits until its proposals in flight are
//     answered and reports its confirmed committed end (a ReadIndex): the
//     final tail T.
//  2. The target region's mirror catches up to T (the replicator keeps
//     shipping from the old home).
//  3. CompleteRehomes moves each lease to the target at epoch+1 from offset
//     T, given the confirmations; the store refuses while a live node of
//     the old home has confirmed neither to the coordinator nor through its
//     heartbeat (the coordinator then makes those heartbeat: the fallback
//     for a node it could not reach). The transaction also reads the
//     target's homes at their new version; the coordinator hands them to
//     the target's nodes, which start admitting at once.
//
// Every acknowledged record is below T (acked before the old home took the
// mark, so committed before T was read), and the target holds everything
// below T before it appends: zero loss. No node of the old home acks under
// the old epoch once the new one exists: each confirmed that it stopped,
// or may no longer be live. The pause is 1–3: two lease-store transactions
// and one round trip to the old home, plus what arrived meanwhile.

func (s *adminServer) Rehome(ctx context.Context, req *geologv1.RehomeRequest) (*geologv1.RehomeResponse, error) {
	resp, err := s.node.rehome(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *adminServer) RefreshHomes(ctx context.Context, req *geologv1.RefreshHomesRequest) (*geologv1.RefreshHomesResponse, error) {
	n := s.node
	if n.homing == nil {
		return nil, apierr.New(apierr.InvalidArgument, "homing is off on this node (no --lease-store)")
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	var confirmErr error
	if snap := req.GetHomes(); snap != nil {
		// The homes come from a committed transaction: take them (if newer)
		// without a heartbeat. The published version is the confirmation.
		if _, err := n.homing.homes.Install(ctx, regionHomesFromProto(snap)); err != nil {
			return nil, homingErr(err)
		}
	} else {
		// The first heartbeat learns the homes (and the node acts on them
		// as soon as it returns); with confirm, a second one tells the
		// store so (a planned rehome waits for it), while the final tails
		// are read.
		if err := n.homing.homes.Refresh(ctx); err != nil {
			return nil, homingErr(err)
		}
		if req.GetConfirm() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				confirmErr = n.homing.homes.Refresh(ctx)
			}()
		}
	}
	tRefreshed := time.Now()
	n.applyRoles() // the directory is refreshed after the tails are read
	view := n.homing.homes.View()
	resp := &geologv1.RefreshHomesResponse{HomesVersion: view.HomesVersion, LivenessNodeId: view.NodeID}
	resp.Tails = n.leaderFinalTails(ctx, req.GetStream(), req.GetRanges())
	wg.Wait()
	n.logger.Debug("refreshed homes", "installed", req.GetHomes() != nil, "homes_version", view.HomesVersion,
		"refresh", tRefreshed.Sub(t0), "tails_and_confirm", time.Since(tRefreshed), "tails", len(resp.Tails))
	// Ranges that moved away are looked up next (for redirects), off the
	// caller's path.
	n.tasks.Go(n.refreshDirectory)
	if confirmErr != nil {
		return nil, homingErr(confirmErr)
	}
	return resp, nil
}

// leaderFinalTails is the final tail of each of a stream's ranges that
// this node leads, read after it took the new homes (finalTail), marked as
// a leader's. A range it does not lead, or whose final tail failed (its
// leadership moved meanwhile: a transfer, the leader balancer, an
// election), is left out. A follower reports nothing: its committed end
// may lag what its leader acked (it learns the commit index with the
// leader's next message), so it is no final tail; the coordinator asks
// the leader of now for a range no leader reported (homing.OpDrainedTails).
// This was the simulator's finding 1 (notes/simfaults.md): the followers'
// ends taken as final started the new home below acked records.
func (n *Node) leaderFinalTails(ctx context.Context, stream string, ranges []uint32) []*geologv1.RangeTail {
	if stream == "" {
		return nil
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []*geologv1.RangeTail
	for _, r := range ranges {
		d, err := n.rangeOf(ctx, stream, r)
		if err != nil || d.rep == nil || !d.isHome() || d.rep.LeaderID() != n.cfg.NodeID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t, err := n.finalTail(ctx, d)
			if err != nil {
				n.logger.Debug("rehome: no final tail from this leader", "stream", stream, "range", r, "error", err)
				return
			}
			mu.Lock()
			out = append(out, &geologv1.RangeTail{Range: r, TailOffset: t, Leader: true})
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func regionHomesToProto(r homing.RegionHomes) *geologv1.RegionHomes {
	out := &geologv1.RegionHomes{Region: r.Region, Version: r.Version, Homes: make([]*geologv1.HomeRecord, len(r.Homes))}
	for i, h := range r.Homes {
		out.Homes[i] = &geologv1.HomeRecord{Stream: h.Key.Stream, Range: h.Key.Range, Region: h.Region, Epoch: h.Epoch,
			StartOffset: h.StartOffset, PrevRegion: h.PrevRegion, MovingTo: h.MovingTo, DrainVersion: h.DrainVersion}
	}
	return out
}

func regionHomesFromProto(p *geologv1.RegionHomes) homing.RegionHomes {
	out := homing.RegionHomes{Region: p.GetRegion(), Version: p.GetVersion(), Homes: make([]homing.Home, len(p.GetHomes()))}
	for i, h := range p.GetHomes() {
		out.Homes[i] = homing.Home{Key: homing.RangeKey{Stream: h.GetStream(), Range: h.GetRange()}, Region: h.GetRegion(), Epoch: h.GetEpoch(),
			StartOffset: h.GetStartOffset(), PrevRegion: h.GetPrevRegion(), MovingTo: h.GetMovingTo(), DrainVersion: h.GetDrainVersion()}
	}
	return out
}

// finalTail is the tail of a home range that stopped admitting, on its
// leader: once every append it proposed is answered, its confirmed
// committed end (a ReadIndex) is final.
func (n *Node) finalTail(ctx context.Context, d *rangeDriver) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		pending := -1
		if err := d.exec(ctx, func() { pending = d.rep.Pending() }); err != nil {
			return 0, err
		}
		if pending == 0 {
			return n.homeTailFor(ctx, d, homeTailAsk{forwarded: true, final: true})
		}
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return 0, apierr.New(apierr.Timeout, "stream %s range %d: %d appends still in flight", d.cfg.stream, d.cfg.rangeID, pending)
		}
	}
}

func (n *Node) rehome(ctx context.Context, req *geologv1.RehomeRequest) (*geologv1.RehomeResponse, error) {
	if n.homing == nil {
		return nil, apierr.New(apierr.InvalidArgument, "rehome needs homing: this node runs without a lease store (--lease-store)")
	}
	batch, ok := n.homing.store.(homing.BatchRehomer)
	if !ok {
		return nil, apierr.New(apierr.InvalidArgument, "rehome needs a lease store that moves ranges in batches (homing.BatchRehomer)")
	}
	if _, err := n.lookupStream(ctx, req.GetStream()); err != nil {
		return nil, err
	}
	spec, _ := n.streamSpec(req.GetStream())
	to := req.GetRegion()
	if !slices.Contains(spec.Regions, to) {
		return nil, apierr.New(apierr.InvalidArgument, "region %q is not a region of stream %q (%v)", to, spec.Name, spec.Regions)
	}
	ranges, err := rehomeRanges(spec, req)
	if err != nil {
		return nil, err
	}
	// The target region coordinates: its catch-up and its start are then
	// local, and only the old home's stop crosses the WAN.
	if resp, done, err := n.forwardRehome(ctx, to, req); done {
		return resp, err
	}
	keys := make([]homing.RangeKey, len(ranges))
	for i, r := range ranges {
		keys[i] = homing.RangeKey{Stream: spec.Name, Range: r}
	}
	cur, err := n.homing.store.Homes(ctx, keys)
	if err != nil {
		return nil, homingErr(err)
	}
	out := make([]*geologv1.RangeRehome, len(ranges))
	groups := map[string][]int{} // old home → indexes
	for i, h := range cur {
		out[i] = &geologv1.RangeRehome{Range: ranges[i], FromRegion: h.Region, ToRegion: to, Epoch: h.Epoch}
		switch {
		case h.Epoch == 0:
			out[i].Status = apierr.New(apierr.RangeNotFound, "range %s has no home record", keys[i]).Error()
		case h.Region == to && h.MovingTo == "":
			out[i].Status = "already home"
		case h.MovingTo != "" && h.MovingTo != to:
			out[i].Status = apierr.New(apierr.InvalidArgument, "range %s is already moving to %s", keys[i], h.MovingTo).Error()
		default:
			groups[h.Region] = append(groups[h.Region], i)
		}
	}
	for from, idx := range groups {
		gctx, span := n.startSpan(ctx, "geolog.rehome", attribute.String("geolog.stream", spec.Name),
			attribute.String("geolog.from_region", from), attribute.String("geolog.to_region", to), attribute.Int("geolog.ranges", len(idx)))
		n.rehomeGroup(gctx, batch, spec, from, to, idx, cur, out)
		span.End()
	}
	return &geologv1.RehomeResponse{Ranges: out}, nil
}

// rehomeRanges lists the ranges a rehome request names, once each.
func rehomeRanges(spec streamSpec, req *geologv1.RehomeRequest) ([]uint32, error) {
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
	return ranges, nil
}

// forwardRehome hands the request to a node of the target region, which
// coordinates: its catch-up and its start are then local, and only the old
// home's stop crosses the WAN. done is false when this node coordinates
// (it is in the target, the request was forwarded already, or no node of
// the target answers).
func (n *Node) forwardRehome(ctx context.Context, to string, req *geologv1.RehomeRequest) (resp *geologv1.RehomeResponse, done bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if to == n.cfg.Region || len(md.Get(forwardedKey)) > 0 {
		return nil, false, nil
	}
	for _, addr := range n.regionAddrs(to) {
		conn, err := n.peerConn(addr)
		if err != nil {
			continue
		}
		resp, err := geologv1.NewAdminClient(conn).Rehome(metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"), req)
		if err == nil {
			return resp, true, nil
		}
		if e := rpcerr.FromError(err); !e.Retriable {
			return nil, true, e
		}
	}
	return nil, false, nil
}

// rehomeGroup moves ranges homed in from to to, together: one stop of the
// old home, one catch-up wait, one start of the new home. The protocol is
// homing.Rehome's; a rehomeDriver carries out its ops.
func (n *Node) rehomeGroup(ctx context.Context, batch homing.BatchRehomer, spec streamSpec, from, to string, idx []int, cur []homing.Home, out []*geologv1.RangeRehome) {
	homes := make([]homing.Home, len(idx))
	for j, i := range idx {
		homes[j] = cur[i]
	}
	core, err := homing.NewRehome(homing.RehomeConfig{From: from, To: to, Ranges: homes, MaxOffsetNanos: int64(n.cfg.MaxClockOffset)})
	if err != nil {
		for _, i := range idx {
			out[i].Status = apierr.As(homingErr(err)).Error()
		}
		return
	}
	d := &rehomeDriver{n: n, batch: batch, spec: spec, core: core}
	d.run(ctx)
	tm := core.Times()
	pause := time.Duration(tm.PauseNanos)
	phases := &geologv1.RehomePhases{
		PrepareMicros: tm.PrepareNanos / 1e3, StopOldMicros: tm.StopOldNanos / 1e3, CatchUpMicros: tm.CatchUpNanos / 1e3,
		CompleteMicros: tm.CompleteNanos / 1e3, CompleteAttempts: uint32(tm.CompleteAttempts), StartNewMicros: tm.StartNewNanos / 1e3,
	}
	moved := 0
	for j, r := range core.Results() {
		o := out[idx[j]]
		if !r.Moved {
			o.Status = apierr.As(homingErr(r.Err)).Error()
			continue
		}
		moved++
		o.Epoch, o.StartOffset, o.Status, o.PauseMicros, o.Phases = r.Home.Epoch, r.StartOffset, "moved", pause.Microseconds(), phases
	}
	if moved == 0 {
		return
	}
	n.metrics.recordRehome(phases, pause)
	n.logger.Info("rehomed", "stream", spec.Name, "ranges", moved, "from", from, "to", to, "pause", pause,
		"prepare", time.Duration(tm.PrepareNanos), "stop_old", time.Duration(tm.StopOldNanos), "catch_up", time.Duration(tm.CatchUpNanos),
		"complete", time.Duration(tm.CompleteNanos), "complete_attempts", tm.CompleteAttempts, "start_new", time.Duration(tm.StartNewNanos))
}

// rehomeDriver carries out a homing.Rehome's ops for one group, in order,
// and feeds their answers back (homing/doc.go, "Rehome driver contract").
type rehomeDriver struct {
	n     *Node
	batch homing.BatchRehomer
	spec  streamSpec
	core  *homing.Rehome
}

func (d *rehomeDriver) now() int64 { return d.n.cfg.Now().UnixNano() }

// run drives the core until it is done. Once ctx is done the core is
// abandoned at its next awaited op: it cancels what it prepared.
func (d *rehomeDriver) run(ctx context.Context) {
	abandoned := false
	for {
		ops, notes := d.core.Ready()
		d.log(notes)
		if len(ops) == 0 {
			if !d.core.Done() {
				d.n.logger.Error("rehome: the coordinator stopped with nothing to do", "stream", d.spec.Name)
			}
			return
		}
		for _, op := range ops {
			if op.Kind.Awaited() && ctx.Err() != nil && !abandoned {
				abandoned = true
				d.core.Abandon(d.now(), apierr.New(apierr.Timeout, "the rehome was given up: %v", ctx.Err()))
				break // the ops after it are void; Ready has the next ones
			}
			d.do(ctx, op)
		}
	}
}

func (d *rehomeDriver) log(notes []homing.RehomeNote) {
	for _, nt := range notes {
		kv := []any{"stream", d.spec.Name}
		if nt.Key != (homing.RangeKey{}) {
			kv = append(kv, "range", nt.Key)
		}
		if len(nt.Nodes) > 0 {
			kv = append(kv, "nodes", nt.Nodes)
		}
		if nt.Err != nil {
			kv = append(kv, "error", nt.Err)
		}
		if nt.Routine {
			d.n.logger.Debug("rehome: "+nt.Msg, kv...)
		} else {
			d.n.logger.Warn("rehome: "+nt.Msg, kv...)
		}
	}
}

// do carries out one op and gives the core its answer.
func (d *rehomeDriver) do(ctx context.Context, op homing.RehomeOp) {
	n, c := d.n, d.core
	switch op.Kind {
	case homing.OpReadTails:
		t := n.tailsOf(ctx, op.Region, d.spec.Name)
		c.TailsRead(d.now(), d.tailsOf(op.Keys, t), t != nil)
	case homing.OpAwaitTails:
		c.TailsAwaited(d.now(), d.awaitTails(ctx, op.Region, op.Tails))
	case homing.OpPrepare:
		var b homing.RehomeBatch
		err := n.storeWrite(ctx, func() (err error) { b, err = d.batch.PrepareRehomes(ctx, op.Reqs); return err })
		c.Prepared(d.now(), b, err)
	case homing.OpStop:
		req := &geologv1.RefreshHomesRequest{Stream: d.spec.Name, Ranges: rangesOf(op.Keys), Confirm: true}
		if op.Homes != nil {
			req.Homes, req.Confirm = regionHomesToProto(*op.Homes), false
		}
		stopped, err := n.refreshRegionTails(ctx, op.Region, req)
		c.Stopped(d.now(), d.keyed(stopped.tails), stopped.seen, err)
	case homing.OpDrainedTails:
		tails, errs := map[homing.RangeKey]uint64{}, map[homing.RangeKey]error{}
		for _, k := range op.Keys {
			if t, err := n.drainedTail(ctx, d.spec, k.Range, op.Region); err != nil {
				errs[k] = err
			} else {
				tails[k] = t
			}
		}
		c.DrainedTails(d.now(), tails, errs)
	case homing.OpDrainLiveness:
		cctx, cancel := context.WithTimeout(ctx, n.storeTimeout())
		live, err := n.homing.store.Liveness(cctx, op.Region)
		cancel()
		c.LivenessRead(d.now(), live, err)
	case homing.OpConfirm:
		again, _ := n.refreshRegionTails(ctx, op.Region, &geologv1.RefreshHomesRequest{Confirm: true})
		c.Confirmed(d.now(), again.seen)
	case homing.OpWait:
		// Bounded: a clock that jumps must not stall the wait.
		select {
		case <-time.After(min(max(time.Duration(op.AtNanos-d.now()), 0), time.Second)):
		case <-ctx.Done():
		}
		c.Tick(d.now())
	default:
		d.doMove(ctx, op)
	}
}

// doMove carries out the ops that move leases and start homes.
func (d *rehomeDriver) doMove(ctx context.Context, op homing.RehomeOp) {
	n, c := d.n, d.core
	switch op.Kind {
	case homing.OpComplete:
		now := d.now()
		for i := range op.Reqs {
			op.Reqs[i].NowNanos = now
		}
		var b homing.RehomeBatch
		err := n.storeWrite(ctx, func() (err error) { b, err = d.batch.CompleteRehomes(ctx, op.Reqs, op.Seen); return err })
		c.Completed(d.now(), b, err)
	case homing.OpCancel:
		// Gives the range back to its home rather than leave it stopped,
		// even when the caller gave up.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err := n.storeWrite(cctx, func() error { _, err := n.homing.homes.CancelRehome(cctx, op.Key, op.Epoch); return err })
		if err != nil {
			n.logger.Error("rehome: cancel failed; the range stays stopped until a rehome completes or is cancelled", "range", op.Key, "error", err)
		}
	case homing.OpStart:
		// The new home's nodes take the complete's homes at once.
		req := &geologv1.RefreshHomesRequest{}
		if op.Homes != nil {
			req.Homes = regionHomesToProto(*op.Homes)
		}
		if _, err := n.refreshRegionTails(ctx, op.Region, req); err != nil {
			n.logger.Warn("rehome: starting the new home", "region", op.Region, "error", err) // its heartbeats bring the homes
		}
		c.Started(d.now())
	case homing.OpRelease:
		// The old home learns where its producers go now (the complete's
		// homes, else its heartbeat), and takes back what was cancelled.
		req := &geologv1.RefreshHomesRequest{}
		if op.Homes != nil {
			req.Homes = regionHomesToProto(*op.Homes)
		}
		n.tasks.Go(func(ctx context.Context) { n.refreshRegionTails(ctx, op.Region, req) })
	}
}

// awaitTails waits, for all the ranges at once, until region's copy of
// each has its tail; the errors are of the ranges that did not get there.
func (d *rehomeDriver) awaitTails(ctx context.Context, region string, tails map[homing.RangeKey]uint64) map[homing.RangeKey]error {
	want := make(map[uint32]uint64, len(tails))
	for k, t := range tails {
		want[k.Range] = t
	}
	errs := map[homing.RangeKey]error{}
	for r, err := range d.n.waitRegionTails(ctx, region, d.spec.Name, want) {
		errs[homing.RangeKey{Stream: d.spec.Name, Range: r}] = err
	}
	return errs
}

// tailsOf picks keys' tails out of a stream's tails by range.
func (d *rehomeDriver) tailsOf(keys []homing.RangeKey, t []uint64) map[homing.RangeKey]uint64 {
	out := map[homing.RangeKey]uint64{}
	for _, k := range keys {
		if int(k.Range) < len(t) {
			out[k] = t[k.Range]
		}
	}
	return out
}

// keyed names ranges of the stream by key.
func (d *rehomeDriver) keyed(tails map[uint32]uint64) map[homing.RangeKey]uint64 {
	out := make(map[homing.RangeKey]uint64, len(tails))
	for r, t := range tails {
		out[homing.RangeKey{Stream: d.spec.Name, Range: r}] = t
	}
	return out
}

func rangesOf(keys []homing.RangeKey) []uint32 {
	out := make([]uint32, len(keys))
	for i, k := range keys {
		out[i] = k.Range
	}
	return out
}

// regionRefresh is what a region's nodes answered to RefreshHomes.
type regionRefresh struct {
	// tails are the final tails their leaders reported, by range.
	tails map[uint32]uint64
	// seen is the homes version each node acts on now, by liveness id.
	seen map[uint64]uint64
}

// add takes one node's answer: its leaders' final tails (the highest per
// range: every ack came from a leader that had not taken the new homes
// yet, and a leader's final tail, read after it took them, covers every
// ack of the range) and the homes version it acts on. A tail not marked as
// a leader's is dropped: a node older than RangeTail.leader reported its
// followers' committed ends too, which may lag what the leader acked.
func (r *regionRefresh) add(resp *geologv1.RefreshHomesResponse) {
	for _, t := range resp.GetTails() {
		if t.GetLeader() {
			r.tails[t.GetRange()] = max(r.tails[t.GetRange()], t.GetTailOffset())
		}
	}
	if id := resp.GetLivenessNodeId(); id != 0 {
		r.seen[id] = max(r.seen[id], resp.GetHomesVersion())
	}
}

// refreshRegionTails refreshes every node of region and collects the
// final tails of the ranges their leaders report (a range no leader
// reported is missing), and the homes versions the nodes act on.
func (n *Node) refreshRegionTails(ctx context.Context, region string, req *geologv1.RefreshHomesRequest) (regionRefresh, error) {
	addrs := n.regionAddrList(region)
	errs := make([]error, len(addrs))
	out := regionRefresh{tails: map[uint32]uint64{}, seen: map[uint64]uint64{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp *geologv1.RefreshHomesResponse
			if region == n.cfg.Region && addr == n.peerAddr(n.cfg.NodeID) {
				resp, errs[i] = (&adminServer{node: n}).RefreshHomes(ctx, req)
			} else {
				conn, err := n.peerConn(addr)
				if err != nil {
					errs[i] = err
					return
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				resp, errs[i] = geologv1.NewAdminClient(conn).RefreshHomes(cctx, req)
			}
			if errs[i] != nil {
				return
			}
			mu.Lock()
			out.add(resp)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// storeWrite runs one of the coordinator's lease-store writes: one at a
// time on this node (the ranges of one request write the same region
// rows, and concurrent serializable transactions on them mostly abort
// each other), retried while the store reports a transient failure
// (a conflict that outlasted the store's own attempts), for up to 5 s.
// Every write is a compare-and-set, so a retry after an ambiguous commit
// fails harmlessly (ErrEpochMismatch) rather than acting twice.
func (n *Node) storeWrite(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(5 * time.Second)
	for attempt := 1; ; attempt++ {
		n.homing.writeMu.Lock()
		err := fn()
		n.homing.writeMu.Unlock()
		if err == nil || !errors.Is(err, homing.ErrStoreUnavailable) || errors.Is(err, homing.ErrAmbiguousCommit) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-time.After(time.Duration(attempt) * 10 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
}

// regionAddrs is how this node reaches a region's nodes.
func (n *Node) regionAddrList(region string) []string {
	if region == n.cfg.Region {
		addrs := n.memberAddrs() // joined nodes too (members.go)
		var out []string
		for _, id := range slices.Sorted(maps.Keys(addrs)) {
			out = append(out, addrs[id])
		}
		return out
	}
	return n.regionAddrs(region)
}

// refreshRegion asks every node of region to refresh its homes now; the
// error is the first failure (the others still ran).
func (n *Node) refreshRegion(ctx context.Context, region string) error {
	_, err := n.refreshRegionTails(ctx, region, &geologv1.RefreshHomesRequest{})
	return err
}

// drainedTail reads the old home's final tail: the home leader's
// confirmed committed end, read until two readings agree.
func (n *Node) drainedTail(ctx context.Context, spec streamSpec, r uint32, home string) (uint64, error) {
	prev, err := n.confirmedTail(ctx, spec, r, home)
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
		t, err := n.confirmedTail(ctx, spec, r, home)
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

// finalTailKey marks a home read that a planned rehome's coordinator
// makes for the final tail of a range stopped for the move: the home
// leader confirms it (homing.View.CheckFinal) although it answers no home
// read of a range stopped for a move, and the answer is the tail only, no
// records.
const finalTailKey = "x-geolog-final-tail"

// confirmedTailWait bounds confirmedTail's rounds over the home's nodes.
const confirmedTailWait = 30 * time.Second

// confirmedTail asks the home region for the range's final tail as its
// home leader confirms it (a home read marked finalTailKey: the range is
// stopped for the move), trying its nodes in turn, round after
// round, for up to confirmedTailWait. Each attempt is bounded by
// attemptTimeout: a dead node is passed over in seconds, and a slow one
// (a busy machine, a slow link) is still heard in a later round.
func (n *Node) confirmedTail(ctx context.Context, spec streamSpec, r uint32, home string) (uint64, error) {
	if home == n.cfg.Region {
		d, err := n.rangeOf(ctx, spec.Name, r)
		if err != nil {
			return 0, err
		}
		return n.homeTailFor(ctx, d, homeTailAsk{final: true})
	}
	deadline := time.Now().Add(confirmedTailWait)
	var last error
	for round := 0; round == 0 || time.Now().Before(deadline); round++ {
		for _, addr := range n.regionAddrs(home) {
			conn, err := n.peerConn(addr)
			if err != nil {
				last = err
				continue
			}
			cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, finalTailKey, "1"), attemptTimeout(round))
			resp, err := geologv1.NewLogClient(conn).Read(cctx, &geologv1.ReadRequest{Stream: spec.Name, Range: r,
				Consistency: geologv1.Consistency_CONSISTENCY_HOME, MaxRecords: 1})
			cancel()
			if err == nil {
				return resp.GetTailOffset(), nil
			}
			last = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return 0, apierr.New(apierr.Unavailable, "the home region %s could not confirm the tail of %s/%d: %v", home, spec.Name, r, last)
}

// attemptTimeout bounds one attempt of a request to another node in the
// given round (0 first) over a region's nodes: 2 s, then doubling up to 16
// s. The first round passes over a dead node quickly; the later ones wait
// longer for a live node that is slow to answer.
func attemptTimeout(round int) time.Duration {
	return min(2*time.Second<<min(round, 3), 16*time.Second)
}

// waitRegionTail waits until region's copy of range r has tail
// (waitRegionTails).
func (n *Node) waitRegionTail(ctx context.Context, region, stream string, r uint32, tail uint64) error {
	return n.waitRegionTails(ctx, region, stream, map[uint32]uint64{r: tail})[r]
}

// waitRegionTails waits, for up to a minute, until region's copy of each
// range of want has its tail there, and returns a Timeout error for each
// that did not. This node's own copy answers first when it may be
// continued from (a member, not relearning, not barred), the rule when
// the target is caught up; else the region's tail (tailsOf: its best
// copy, none while a copy holds a divergent tail until it forks), one
// survey of the region for all the ranges still waiting at each poll.
func (n *Node) waitRegionTails(ctx context.Context, region, stream string, want map[uint32]uint64) map[uint32]error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pending := maps.Clone(want)
	have := map[uint32]uint64{}
	for {
		if region == n.cfg.Region {
			for r, tail := range pending {
				if d, err := n.rangeOf(ctx, stream, r); err == nil && d.member() {
					if c := d.candidate(); !c.relearning && !c.barred && c.tail >= tail {
						delete(pending, r)
					}
				}
			}
		}
		if len(pending) > 0 {
			t := n.tailsOf(ctx, region, stream)
			for r, tail := range pending {
				if int(r) < len(t) {
					have[r] = t[r]
				}
				if have[r] >= tail {
					delete(pending, r)
				}
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			errs := map[uint32]error{}
			for r, tail := range pending {
				errs[r] = apierr.New(apierr.Timeout, "region %s's copy of %s/%d did not reach offset %d (at %d)", region, stream, r, tail, have[r])
			}
			return errs
		}
	}
}
