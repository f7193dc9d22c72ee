package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
)

// Readers (Regions > 1). In every region, per range, a consumer reads
// the range's log forward with local reads (CONSISTENCY_LOCAL: what the
// node it sticks to has committed, moving to another node of its region
// when that one is down or lags), and a prober makes home reads
// (CONSISTENCY_HOME) of the last few records below the home's confirmed
// tail, as regionsvc serves them (server.go's Read, homeTail,
// readAtHomeTail):
//
//   - on a node whose region is the range's home by its own view
//     (View.Home), the region's leader confirms its tail with a Raft
//     ReadIndex (replica.ReadIndex), then passes View.CheckRead (the fix
//     bb6ec9d: a home whose lease may have expired must not answer), and
//     serves what it committed below that tail;
//   - elsewhere, the region's leader asks the home region's leader for
//     its confirmed tail (the same ReadIndex and CheckRead there; the WAN
//     is crossed at once, refused while either region is cut off), and
//     serves it from its own copy once that copy has committed the tail,
//     unless its copy is fenced below the tail: a copy whose log's
//     highest epoch (replica.HighestEpoch) is older than the range's
//     holds a divergent tail from the lowest start of a newer epoch on
//     (the fix 6c9c4c5, regionsvc's timeline fence: the simulator runs
//     its core, rangecore.Timeline, fence.go).
//
// Checks:
//
//   - a home read is answered only by the range's current home region, at
//     the current epoch (as acks: a home that lost its lease may have been
//     replaced, and its tail miss the new home's acks), with a tail
//     covering every record acked before the read began, and returns no
//     record of an epoch the current one replaced past its start (a
//     divergent copy answering a home read);
//   - every record any reader was served is the range's record at its
//     offset, or one of an older epoch that a later epoch's start at or
//     below its offset replaced (a fork explains it, as the SDK's
//     ForkError does; for a home read the takeover must have come after
//     the read was answered);
//   - a consumer never sees the log go backwards: a node it reads again
//     serves it at least what it served before, across restarts, unless a
//     fork on that node cut the log back since.

// mutations are the deliberately broken variants of this layer's code
// (reads, second takeovers, rehomes, replaced replicas), set by tests:
// each check must report its own.
type mutations struct {
	// noLeaderBalance: the run does not balance leaders, whatever it
	// draws (a test that pins a seed's schedule from before leader
	// balance came into the simulator).
	noLeaderBalance bool
	// orphanAnyEpoch: an orphaned record is held against every timeline
	// the checks noted, not its own epoch's (sim/orphans.go before
	// 3d8f3d8: an old home's record committed after the grant fails
	// against a later epoch's record at its offset).
	orphanAnyEpoch bool
	// describeStale: the moves' DescribeReplicas and ChangeReplicas use
	// the leader's applied configuration at once, as regionsvc did before
	// both waited for a ReadIndex (moves.go describeFresh and catchUp;
	// TestMovesStaleDescribe).
	describeStale bool
	// changeUnexpected: ChangeReplicas ignores the voters the change was
	// decided from (expected_voters), as regionsvc did before it checked
	// them.
	changeUnexpected bool
	// splitAlways: every run of one region splits range 0 (split.go).
	splitAlways bool
	// child breaks the split's children (children.go).
	child childMutation
	// resplitAlways: every first split's child splits again (children.go).
	resplitAlways bool
	// movesAlways: every run of one region moves replicas (moves.go).
	movesAlways bool
	// deadAlways, deadForever, decommAlways: every run with moves has a
	// dead node (one that never comes back), and decommissions its
	// drained node (dead.go).
	deadAlways, deadForever, decommAlways bool
	// deadIgnored: the rebalancer's loop never learns a node is down,
	// so never takes one as dead (dead.go).
	deadIgnored bool
	// decommLive: the planner is given a decommissioned node as live
	// (the catalogue's node state ignored).
	decommLive bool
	// targetUnreachable: the rebalancer's loop does not tell a node down
	// for less than the dead-node time from a live one (placement before
	// Node.Unreachable: notes/simdead.md finding 1).
	targetUnreachable bool
	// targetUnchecked: the check that no move of the rebalancer starts
	// onto a node found unreachable is off (to run targetUnreachable
	// into what follows).
	targetUnchecked bool
	// moveConcurrent: the planner's snapshot shows no move under way and
	// its moves carry no Planned voters, so two moves of a range may run
	// at once (the one-change-per-range rule undone).
	moveConcurrent bool
	// moveAskUnchecked: the check of one change asked per range at a
	// time is off (to show what the configuration checks catch).
	moveAskUnchecked bool
	// moveStray: a node removed from a range restarts its replica as a
	// new group of its own (a stray that bootstraps instead of staying
	// removed): what it acks must not count.
	moveStray bool
	// moveNoHandOff: a range leader proposes its own removal without
	// handing its lead off first.
	moveNoHandOff bool
	// readNoLease: home reads skip View.CheckRead (the fix bb6ec9d
	// undone in the simulator's read path).
	readNoLease bool
	// noReadFence: a home read skips the timeline fence (the fix 6c9c4c5
	// undone; on the home's own copy, homeNoFence alone).
	noReadFence bool
	// readShort: a node now and then serves a consumer one record less
	// than it committed.
	readShort bool
	// takerDivergent: a failover agent counts a copy holding a
	// divergent tail at its raw committed end (homeWorld.regionTail).
	takerDivergent bool
	// takerRelearning: a failover agent counts a copy relearning its
	// commit index at its raw committed end (homeWorld.regionTail;
	// regionsvc before RangeInfo.relearning). No random seed reaches it
	// (3,000 of 3 s, 1,000 of a minute from 9100001, 1,500 of 20 s from
	// 9200001: about one minute seed in ten surveys a relearning copy,
	// none whose lowered committed end hid a divergent tail), so
	// TestTakerRelearningIsChecked opens the window on purpose
	// (takerRelearn: a taker whose relearning copies' durable marks
	// stop at the intervening epoch's start while their logs run past
	// it in the older epoch; Result.Homing.RelearningTakers). Reported
	// ("no fork explains it": a consumer's epoch-2 record replaced by
	// the old epoch's) only with homeNoFork as well: the product's start
	// gate forks the new home's divergent tail at the intervening
	// epoch's start whatever the takeover's start (rangecore.DivergeAt),
	// so with the gate whole the run is clean (notes/takerrelearning.md).
	takerRelearning bool
	// takerOwnCopy: a region's tail is read from one node's copy (the
	// agent's, or a rehome's coordinator's), whatever it holds
	// (homeWorld.regionTail; regionsvc's localTails before regionTails).
	takerOwnCopy bool
	// homeNoFork: a new home's start gate takes no epoch history, so it
	// raises its epoch's start over its own divergent tail (a region home
	// before an intervening epoch, back with its unreplicated tail) instead
	// of forking it off (gate.go checkStart; regionsvc before
	// rangecore.DivergeAt, seed 6500375).
	homeNoFork bool
	// homeNoFence: the home's own copy is never fenced, its divergent
	// tail served to home reads until the gate forks it (fence.go; the
	// home role without its epoch, rangecore's Fence before homeFence).
	homeNoFence bool
	// noStartGate: a new home appends without confirming its epoch's
	// start at its log's end (epochstart.go): the product before the
	// gate, its takeover's start final at the grant.
	noStartGate bool
	// rehomeShortTail: a planned rehome's stop reports every final tail
	// one offset short.
	rehomeShortTail bool
	// rehomeDivergent: a planned rehome's wait for the target's copy
	// takes its raw committed end, a divergent tail included
	// (rehome.go reached; regionsvc's waitRegionTails reads the region's
	// candidate tail).
	rehomeDivergent bool
	// rehomeFollowerTails: a stop whose leader fails to report a final
	// tail takes its followers' committed ends as final (regionsvc's
	// RefreshHomes and refreshRegionTails today; rehome.go leaderFailed).
	rehomeFollowerTails bool
	// replaceEarlyWipe: a replaced node's disk is wiped as soon as its
	// removal is applied at the leader, while other members may still
	// count its vote (replace.go forgotten).
	replaceEarlyWipe bool
	// noLogEpochFallback: a mirror whose frame at its applied end is gone
	// (retention) answers the open with no log epoch, as before replgap's
	// fix (replicator.LogEpocher) (mirror.go: logEpoch).
	noLogEpochFallback bool
	// floorEverywhere is no mutation: every replica gets the compaction
	// floor from the simulator's view, followers too, as before sim169
	// (snapshot.go compact), for the seeds found under that model
	// (TestDownDivergentCopyKeepsFloor).
	floorEverywhere bool
	// eventsMax, when above 0, fails the run on liveness once it has
	// queued that many events: a mutation that leaves a Raft group in a
	// storm of messages for good (replaceEarlyWipe: a few hundred events
	// per virtual ms, each carrying the log, against some 5 in a sound
	// run) then ends in seconds, not minutes, of wall time, so that a scan
	// for the mutation's seed stays cheap.
	eventsMax uint64
	// tolerateOldHomeReads is no mutation: it counts, instead of failing
	// the run on, the open issue of notes/README.md (a planned rehome's
	// old home answers home reads of its final log until it learns of the
	// complete, missing the new home's first acks), so that long sweeps
	// (make sim SIMFLAGS=-known) go on past it.
	tolerateOldHomeReads bool
	// instantDetector: the failure detector knows at once that a peer's
	// process is down or a cut divides them, and that it is back, as the
	// simulator's did before detector.go (TestDetectorDelays).
	instantDetector bool
	// unknownAsUp: the rebalancer takes a member its node's transport has
	// no verdict on (never dialled) as a possible target, as
	// raftnet.GRPCTransport.PeerDown's "not down" reads.
	unknownAsUp bool
	// addPastFactor: ChangeReplicas adds a learner to a range that holds
	// more voters than its replication factor (moves.go propose; seed
	// 766151 of a minute, one region, once: an operator's replace on a
	// range a failed repair had left with four voters took it to five).
	// No seed of the later scans reached the case; TestAddPastFactor
	// opens it on purpose (addPastFactorRun: a replace cut short between
	// its promotion and its removal, moveWorld.expire, then an operator's
	// replace on the range), and the configuration check reports the
	// five voters ("more than its replication factor 3 + 1").
	addPastFactor bool
	// startSyncCrashP is no mutation: when above the run's drawn
	// syncCrashP, it is the chance that a Sync of a node's start-up (a
	// fork or a snapshot completed as a restart opens its replicas) is where
	// its process dies, until heal stops the sync faults, so that a test
	// reaches a start-up death on a seed of a short scan
	// (TestStartUpSyncDeath). It draws nothing more: a run without it
	// replays as before.
	startSyncCrashP float64
	// shipPastFence: a home's replication ships its committed log past
	// its copy's timeline fence, as regionsvc's driverSource did before
	// seed 7705544: a region that takes a range back ships the tail of
	// its own earlier epoch before its start gate forks it off, and a
	// mirror keeps it (geoWorld.shippable).
	shipPastFence bool
	// readOverlapShort: a mirror reads the frames a batch overlaps with a
	// read sized for an identical overlap (the batch's bytes from its
	// first offset), as replicator's Server and the simulator did before
	// 18de08e (replicator.ReadOverlap), not on to the frame where that
	// read stops (mirror.go handleBatch). A mirror holding, at a new
	// epoch's start, an older home's divergent frame larger than the new
	// home's frame there, below a batch that starts lower, then finds no
	// frame at the start and refuses the batch as a divergence with no
	// fork point instead of forking the older frame off (seed 3501631:
	// "mirror has no frame at 599 below its applied end 619"). No seed
	// found reaches it since publication stopped waiting for lone marks,
	// so TestLargerDivergentFrameIsForked opens the window on purpose
	// (largerFrame; Result.Geo.LargerFrameForks). Reported as "no fork
	// explains it".
	readOverlapShort bool
}

// readMs is how often, in virtual milliseconds, each reader reads (at a
// random phase).
const readMs = 25

// readsPendingMs bounds how long a home read waits for its ReadIndex:
// past it the reader gives up (the node crashed, or lost its leadership).
const readsPendingMs = 500

// ReadResult counts what the readers did (part of HomingResult).
type ReadResult struct {
	// Local counts local reads answered, HomeReads home reads answered,
	// HomeRefused home reads refused (no lease, not caught up, fenced),
	// Fenced those refused by the divergent-tail fence alone, Records
	// the records served, ForkExplained records read that a later fork
	// replaced.
	Local, HomeReads, HomeRefused, Fenced, Records, ForkExplained int
	// NoLease counts home reads refused by CheckRead, Behind those whose
	// copy had not committed the confirmed tail yet, OldHome those a
	// planned rehome's old home confirmed after the complete.
	NoLease, Behind, OldHome int
	// OldHomeStale counts those that missed an ack of the new home
	// (mutations.tolerateOldHomeReads; else the run fails).
	OldHomeStale int
}

func (r ReadResult) String() string {
	return fmt.Sprintf("; reads: %d local, %d home (%d refused: %d without a lease, %d behind the tail, %d by a timeline fence; %d by an old home after a planned rehome, %d of them stale), %d records served, %d replaced by a fork",
		r.Local, r.HomeReads, r.HomeRefused, r.NoLease, r.Behind, r.Fenced, r.OldHome, r.OldHomeStale, r.Records, r.ForkExplained)
}

// readRec is a record a reader was served: its value and epoch, whether a
// home read served it and when.
type readRec struct {
	value    string
	epoch    uint64
	home     bool
	answered int64
}

// reader is one region's consumer or home prober of one range.
type reader struct {
	region, rng int
	home        bool
	phase       int64
	// consumer: the node it sticks to (id), that node's incarnation
	// when it last served and the end it served, and the epoch of the
	// last fork that explained that node's end falling back.
	node, gen int
	forkEpoch uint64
	nodeEnd   uint64
	wipes     int // the node's wiped disks when it last served
	pos       uint64
	// pendingSince is when the home read in flight was issued (-1: none);
	// wait is its confirmed tail waiting for the copy.
	pendingSince int64
	wait         *tailWait
	// got holds what it was served, by offset; checked up to checked.
	got     map[uint64]readRec
	checked uint64
}

// readWorld holds the readers; it draws from its own generator so that
// reads add no draws to the rest of the run (Raft's ReadIndex traffic
// still does).
type readWorld struct {
	w       *world
	rng     *rand.Rand
	readers []*reader
	res     *ReadResult
}

// grant is an epoch of a range and when the store granted it.
type grant struct {
	home homing.Home
	at   int64
	// planned: a planned rehome's complete, not a takeover.
	planned bool
}

func newReadWorld(w *world, res *ReadResult) *readWorld {
	rw := &readWorld{w: w, rng: rand.New(rand.NewPCG(uint64(w.opt.Seed), 0x7265616473)), res: res}
	for g := 0; g < w.opt.Regions; g++ {
		for r := 0; r < w.opt.Ranges; r++ {
			for _, home := range []bool{false, true} {
				rw.readers = append(rw.readers, &reader{region: g, rng: r, home: home, phase: rw.rng.Int64N(readMs),
					node: 1 + rw.rng.IntN(w.opt.Nodes), pendingSince: -1, got: map[uint64]readRec{}})
			}
		}
	}
	return rw
}

// granted notes a takeover or rehome of range r: what readers were served
// at or past its start is checked again against the new timeline.
func (rw *readWorld) granted(r int, home homing.Home) {
	for _, rd := range rw.readers {
		if rd.rng == r {
			rd.checked = min(rd.checked, home.StartOffset)
		}
	}
}

// step issues the reads due and checks what readers were served.
func (rw *readWorld) step() {
	w := rw.w
	for _, rd := range rw.readers {
		if rd.wait != nil {
			if err := rw.serveHome(rd); err != nil {
				w.err = err
				return
			}
		}
		if rd.pendingSince >= 0 && w.now-rd.pendingSince > readsPendingMs {
			rd.pendingSince, rd.wait = -1, nil
		}
		if (w.now+rd.phase)%readMs != 0 || rd.pendingSince >= 0 {
			continue
		}
		if rd.home {
			rw.homeRead(rd)
		} else {
			rw.localRead(rd)
		}
		if w.err != nil {
			return
		}
	}
	for _, rd := range rw.readers {
		if err := rw.checkReader(rd, false); err != nil {
			w.err = err
			return
		}
	}
}

func (rd *reader) String() string {
	kind := "consumer"
	if rd.home {
		kind = "home reader"
	}
	return fmt.Sprintf("region %d's %s of range %d", rd.region, kind, rd.rng)
}

// localRead reads forward at the consumer's node (CONSISTENCY_LOCAL).
func (rw *readWorld) localRead(rd *reader) {
	w := rw.w
	n := w.node(rd.region, rd.node)
	if !n.up {
		rd.node, rd.gen = 1+rw.rng.IntN(w.opt.Nodes), 0
		return
	}
	if wipes := w.homing.replacer.wipes[n]; wipes != rd.wipes {
		rd.gen, rd.wipes = 0, wipes // its disk was wiped: it starts over
	}
	rep, st := n.replicas[rd.rng], n.stores[rd.rng]
	if rep.Relearning() {
		// Refused (regionsvc's readable): the SDK reads at another node.
		rd.node, rd.gen = 1+rw.rng.IntN(w.opt.Nodes), 0
		return
	}
	end := rep.Committed()
	if w.opt.mut.readShort && end > 0 && rw.rng.IntN(2) == 0 {
		end-- // a node that now and then serves less than it committed
	}
	if rd.gen != 0 && rd.nodeEnd > end {
		f, ok := forkBelow(rep.Orphans(), rd.forkEpoch, end)
		if !ok {
			w.err = fmt.Errorf("%v: %v served it up to %d, now %d: the log went backwards with no fork to explain it", rd, n, rd.nodeEnd, end)
			return
		}
		rd.forkEpoch = f // the reader meets a ForkError and reads on
	}
	// A copy holding a divergent tail (w.stale) is served too: the
	// simulator has no timeline fence for local reads (the pre-knowledge
	// window, unbounded here); a fork must explain its records.
	if rd.gen == 0 {
		rd.forkEpoch = 0
	}
	rd.gen, rd.nodeEnd = n.gen, end
	if rd.pos < st.StartOffset() {
		rd.pos = st.StartOffset() // compacted: the consumer skips ahead
	}
	if rd.pos >= end {
		if rw.rng.IntN(4) == 0 {
			rd.node = 1 + rw.rng.IntN(w.opt.Nodes) // lagging: try another node
			rd.gen = 0
		}
		return
	}
	n2 := rw.serve(rd, n, rd.pos, end, false, w.now)
	rd.pos += uint64(n2)
	w.homing.res.Reads.Local++
}

// forkBelow returns the epoch of a fork newer than after at or below end
// (a node's committed end falls back to a fork point only).
func forkBelow(forks []replica.ForkRecord, after, end uint64) (uint64, bool) {
	for _, f := range forks {
		if f.Epoch > after && f.At <= end {
			return f.Epoch, true
		}
	}
	return 0, false
}

// serve reads node n's committed records of the reader's range in
// [from, end) (at most 16) into the reader's log, and returns how many.
func (rw *readWorld) serve(rd *reader, n *node, from, end uint64, home bool, answered int64) int {
	w := rw.w
	frames, err := readServed(n.stores[rd.rng], from, end)
	if err != nil {
		w.err = fmt.Errorf("%v: read [%d, %d) at %v: %w", rd, from, end, n, err)
		return 0
	}
	served := 0
	for len(frames) > 0 && served < 16 {
		size, err := batch.FrameSize(frames)
		if err != nil {
			w.err = err
			return served
		}
		h, recs, err := batch.Decode(frames[:size])
		frames = frames[size:]
		if err != nil {
			w.err = err
			return served
		}
		for i := range recs {
			off := h.Offset(&recs[i])
			if h.Type != batch.TypeData || off < from || off >= end {
				continue
			}
			if off != from+uint64(served) {
				w.err = fmt.Errorf("%v: %v served offset %d after %d: a gap", rd, n, off, from+uint64(served)-1)
				return served
			}
			rd.got[off] = readRec{value: string(recs[i].Value), epoch: h.Epoch, home: home, answered: answered}
			rd.checked = min(rd.checked, off)
			served++
			w.homing.res.Reads.Records++
			if served == 16 {
				break
			}
		}
	}
	return served
}

// readServed is what serve reads: ReadFrames(from, 64 KiB, end). It
// tries 4 KiB first, which costs a sixteenth of the copying and checking
// and is enough when its frames reach end or hold the 16 records serve
// takes at most: a read returns a prefix of the frames a larger one
// would, so serve then does exactly what it did on the larger read.
func readServed(st *segment.Store, from, end uint64) ([]byte, error) {
	if small, err := st.ReadFrames(from, 4<<10, end); err == nil && servesAll(small, from, end) {
		return small, nil
	}
	return st.ReadFrames(from, 64<<10, end)
}

// servesAll reports whether frames, read from offset from up to end,
// reach end or hold 16 data records past from (counted by header).
func servesAll(frames []byte, from, end uint64) bool {
	records := 0
	for len(frames) > 0 {
		size, err := batch.FrameSize(frames)
		if err != nil || size > len(frames) {
			return false
		}
		h, err := batch.DecodeHeader(frames[:size])
		if err != nil {
			return false
		}
		frames = frames[size:]
		if h.NextOffset() >= end {
			return true
		}
		if h.Type == batch.TypeData && h.BaseOffset >= from {
			if records += int(h.RecordCount); records >= 16 {
				return true
			}
		}
	}
	return false
}

// homeRead probes the last few records below the home's confirmed tail
// (CONSISTENCY_HOME), at the reader's region's leader of its range.
func (rw *readWorld) homeRead(rd *reader) {
	w, r := rw.w, rd.rng
	at := w.leaderOf(rd.region, r)
	if at == nil {
		return // no leader here: NOT_LEADER without a hint; later
	}
	src := at
	if _, ok := at.core.View().Home(rangeKey(r)); !ok {
		// Not the home by its view: ask the home region's leader (the
		// directory: the store's record, as the simulator last saw it).
		g := w.homing.homeIdx[r]
		src = w.leaderOf(g, r)
		if g == rd.region || src == nil || w.geo.partitioned(g) || w.geo.partitioned(rd.region) {
			w.homing.res.Reads.HomeRefused++
			return
		}
		if _, ok := src.core.View().Home(rangeKey(r)); !ok {
			w.homing.res.Reads.HomeRefused++ // a forwarded read: "not the home"
			return
		}
	}
	issued := w.homing.homes[r]
	ackedEnd := w.ackedEnd(r)
	rd.pendingSince = w.now
	srcGen, atGen := src.gen, at.gen
	src.replicas[r].ReadIndex(func(tail uint64, err error) {
		rd.pendingSince = -1
		if err != nil || !src.up || src.gen != srcGen || !at.up || at.gen != atGen {
			w.homing.res.Reads.HomeRefused++
			return
		}
		if err := rw.confirmed(rd, src, at, tail, issued, ackedEnd); err != nil && w.err == nil {
			w.err = err
		}
	})
}

// confirmed goes on with a home read once src confirmed tail by
// ReadIndex: src's lease check (homeTail's CheckRead) and the checks of
// the confirmation; then the read waits for its copy (serveHome). issued is the range's home record and
// ackedEnd the end of what was acked when the read began. It returns
// what a check found.
func (rw *readWorld) confirmed(rd *reader, src, at *node, tail uint64, issued homing.Home, ackedEnd uint64) error {
	w, r := rw.w, rd.rng
	key := rangeKey(r)
	epoch, err := src.core.View().CheckRead(key, w.nodeNanos(src))
	if w.opt.mut.readNoLease {
		h, _ := src.core.View().Home(key)
		epoch, err = h.Epoch, nil // the read fix bb6ec9d undone in the simulator
	}
	if err != nil {
		w.homing.res.Reads.HomeRefused++
		w.homing.res.Reads.NoLease++
		return nil
	}
	home := w.homing.homes[r]
	if rw.oldHome(r, src, epoch) {
		// The old home of a planned rehome reads its final log until it
		// learns of the complete (CheckRead: a range stopped by a move
		// still reads); it is linearizable only while the new home has
		// acked nothing the read should see.
		w.homing.res.Reads.OldHome++
		if tail < ackedEnd && w.opt.mut.tolerateOldHomeReads {
			w.homing.res.Reads.OldHomeStale++ // the known issue, counted
		} else if tail < ackedEnd {
			return fmt.Errorf("%v: a home read confirmed by %v, the old home of a planned rehome, at its final tail %d, but %d was acked at the new home before the read began (a home read on the old home after the move)",
				rd, src, tail, ackedEnd-1)
		}
	} else if regionName(src.region) != home.Region || epoch != home.Epoch {
		return fmt.Errorf("%v: a home read confirmed by %v at epoch %d, but the range is homed in %s at epoch %d (a home read past the lease)", rd, src, epoch, home.Region, home.Epoch)
	}
	if tail < ackedEnd && home.Epoch == issued.Epoch && !rw.oldHome(r, src, epoch) {
		return fmt.Errorf("%v: a home read confirmed by %v (committed %d) the tail %d, but %d was acked before it began", rd, src, src.replicas[r].Committed(), tail, ackedEnd-1)
	}
	rd.wait = &tailWait{at: at, gen: at.gen, forwarded: at != src, tail: tail, home: home, confirmed: w.now}
	rd.pendingSince = w.now
	return rw.serveHome(rd)
}

// oldHome reports whether src, confirming a home read at epoch, is the
// old home of range r's last move, a planned rehome from its region at
// that epoch whose complete src has not learnt of yet (its view still has
// the range moving).
func (rw *readWorld) oldHome(r int, src *node, epoch uint64) bool {
	hist := rw.w.homing.history[r]
	if len(hist) == 0 {
		return false
	}
	g := hist[len(hist)-1]
	h, ok := src.core.View().Home(rangeKey(r))
	return g.planned && g.home.PrevRegion == regionName(src.region) && g.home.Epoch == epoch+1 && ok && h.MovingTo != ""
}

// tailWait is a home read whose tail was confirmed (at confirmed, with
// the range's home then), waiting for the copy at to commit it
// (regionsvc's waitCommitted).
type tailWait struct {
	at        *node
	gen       int
	forwarded bool
	tail      uint64
	home      homing.Home
	confirmed int64
}

// serveHome serves a confirmed home read once its copy committed the
// tail: the timeline fence, then the read (readAtHomeTail). It returns
// what a check found.
func (rw *readWorld) serveHome(rd *reader) error {
	w, r, tw := rw.w, rd.rng, rd.wait
	at, tail, home := tw.at, tw.tail, tw.home
	// A copy relearning its commit index refuses reads (regionsvc's
	// readable, when the read is taken; the copy relearns only from a
	// restart, which changes its gen).
	if !at.up || at.gen != tw.gen || at.replicas[r].Relearning() {
		rd.wait, rd.pendingSince = nil, -1
		w.homing.res.Reads.HomeRefused++
		return nil
	}
	rep := at.replicas[r]
	if rep.Committed() < tail {
		if w.now-tw.confirmed >= readsPendingMs {
			rd.wait, rd.pendingSince = nil, -1
			w.homing.res.Reads.HomeRefused++
			w.homing.res.Reads.Behind++ // the wait timed out
		}
		return nil
	}
	rd.wait, rd.pendingSince = nil, -1
	// The timeline fence (the fix 6c9c4c5, rangecore.Timeline as
	// regionsvc's driver runs it: fence.go): a copy whose log's epoch is
	// older than the home's may hold a divergent tail from the lowest start
	// of an epoch newer than its log's on (two takeovers while its region
	// was away: the first's start, seed 293); it serves below that fence
	// only. So may the home's own copy, until its start gate forks it off,
	// when its log is two epochs behind (seed 6500375: rangecore's
	// homeFence).
	if fence := w.homing.fence(at, r); !w.opt.mut.noReadFence && fence < tail {
		w.homing.res.Reads.HomeRefused++
		w.homing.res.Reads.Fenced++
		return nil
	}
	from := max(tail-min(tail, uint64(1+rw.rng.IntN(8))), at.stores[r].StartOffset())
	w.homing.res.Reads.HomeReads++
	if from >= tail {
		return nil
	}
	served := rw.serve(rd, at, from, tail, true, tw.confirmed)
	for off := from; off < from+uint64(served); off++ {
		if rec := rd.got[off]; home.Epoch > 1 && off >= w.homing.startOf(r, home) && rec.epoch < home.Epoch && w.homing.startConfirmed(r, home.Epoch) {
			return fmt.Errorf("%v: a home read at %v served %q at %d of epoch %d, past the start %d of the range's epoch %d (a divergent copy answering a home read)",
				rd, at, rec.value, off, rec.epoch, home.StartOffset, home.Epoch)
		}
	}
	return nil
}

// checkReader holds what the reader was served against the range's log:
// every record is the log's at its offset, or one of an older epoch that a
// later epoch replaced from a start at or below its offset (a fork
// explains it: for a home read, the grant came after the read was
// answered). final also checks what lies past the log's end.
func (rw *readWorld) checkReader(rd *reader, final bool) error {
	canon := rw.w.canonical[rd.rng]
	for off := rd.checked; off < uint64(len(canon)); off++ {
		if rec, ok := rd.got[off]; ok && rec.value != canon[off] {
			if err := rw.explain(rd, off, rec, fmt.Sprintf("the log holds %q there", canon[off])); err != nil {
				return err
			}
		}
	}
	rd.checked = uint64(len(canon))
	if !final {
		return nil
	}
	for off, rec := range rd.got {
		if off >= uint64(len(canon)) {
			if err := rw.explain(rd, off, rec, fmt.Sprintf("the log ends at %d", len(canon))); err != nil {
				return err
			}
		}
	}
	return nil
}

// explain accepts a record read at off that the log does not hold if a
// fork explains it (see checkReader), and forgets it; else it reports it.
func (rw *readWorld) explain(rd *reader, off uint64, rec readRec, holds string) error {
	for _, g := range rw.w.homing.history[rd.rng] {
		if g.home.Epoch > rec.epoch && g.home.StartOffset <= off && (!rec.home || g.at >= rec.answered) {
			delete(rd.got, off)
			rw.res.ForkExplained++
			return nil
		}
	}
	kind := "read"
	if rec.home {
		kind = "home read"
	}
	return fmt.Errorf("%v: a %s at %d ms served %q at %d (epoch %d), %s, and no fork explains it", rd, kind, rec.answered, rec.value, off, rec.epoch, holds)
}

// final checks every reader once the run healed.
func (rw *readWorld) final() error {
	for _, rd := range rw.readers {
		if err := rw.checkReader(rd, true); err != nil {
			return err
		}
	}
	return nil
}

// add sums two runs' counters.
func (r ReadResult) add(o ReadResult) ReadResult {
	r.Local += o.Local
	r.HomeReads += o.HomeReads
	r.HomeRefused += o.HomeRefused
	r.Fenced += o.Fenced
	r.Records += o.Records
	r.ForkExplained += o.ForkExplained
	r.NoLease += o.NoLease
	r.Behind += o.Behind
	r.OldHome += o.OldHome
	r.OldHomeStale += o.OldHomeStale
	return r
}
