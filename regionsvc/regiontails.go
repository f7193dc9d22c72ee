package regionsvc

import (
	"context"
	"sync"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// A region's tail of a range, as a failover agent or a planned rehome reads
// it, is its best copy's: every node of the region is asked (this node's
// own copies without a call), and the highest committed end of a copy
// that may be continued from is the region's. Reading one node would read
// whatever copy that node holds: in a region of more nodes than the
// replication factor, a node outside the range's group holds an empty
// copy, and a follower, or a replica added back empty after a machine was
// replaced, lags the group's leader (the simulator's seed 6681378: a
// takeover "from 0" against the region's 92; the new home's start gate
// raised it at the first append, but until then the other regions' copies
// fenced their reads of the range at 0).

// copyCandidate is one node's copy of a range as a takeover candidate.
type copyCandidate struct {
	// tail is its committed end as the node knows it.
	tail uint64
	// relearning: the copy relearns its commit index after its machine
	// crashed; its tail may be below what it published. It is passed
	// over: the region's other copies say where the group is.
	relearning bool
	// barred: the copy holds a divergent tail (its timeline fence is below
	// its committed end: takeoverTail) or heard of an epoch it cannot place
	// yet (heardUnplaced). Its group's log runs (unplaced: may run) past
	// where the range's timeline left it, and the other copies' nodes may
	// not know it yet: the region is no candidate for the range until the
	// copy forks or places the epoch.
	barred bool
}

// regionCandidates combines the copies a region's nodes reported, by
// range (copies[i][r]: node i's copy of range r; a node that did not
// answer, or failed the range, reports nothing for it): the region's tail
// of range r is the highest tail of a copy not relearning, and ok[r] says
// whether it is a candidate at all: at least one such copy answered and
// none is barred.
func regionCandidates(ranges int, copies [][]*copyCandidate) (tails []uint64, ok []bool) {
	tails, ok = make([]uint64, ranges), make([]bool, ranges)
	barred := make([]bool, ranges)
	for _, node := range copies {
		for r, c := range node {
			if r >= ranges || c == nil || c.relearning {
				continue
			}
			if c.barred {
				barred[r] = true
				continue
			}
			tails[r], ok[r] = max(tails[r], c.tail), true
		}
	}
	for r := range tails {
		if barred[r] {
			tails[r], ok[r] = 0, false
		}
	}
	return tails, ok
}

// candidatesOf reads a node's DescribeStream answer as its copies.
func candidatesOf(resp *geologv1.DescribeStreamResponse, ranges int) []*copyCandidate {
	out := make([]*copyCandidate, ranges)
	for _, ri := range resp.GetRanges() {
		r := int(ri.GetRange())
		if r >= ranges || ri.GetNotMember() || (ri.GetStatus() != "ok" && ri.GetStatus() != diskFullStatus) {
			continue // not the range's log, or failed (corrupt): as ownCandidates skips it
		}
		_, fine := takeoverTail(ri.GetTailOffset(), ri.TimelineFenceOffset)
		out[r] = &copyCandidate{tail: ri.GetTailOffset(), relearning: ri.GetRelearning(), barred: !fine || ri.GetEpochUnplaced()}
	}
	return out
}

// ownCandidates is this node's copies of st's ranges as candidates: those
// that are the range's log (member) and not failed.
func ownCandidates(st *streamState) []*copyCandidate {
	out := make([]*copyCandidate, len(st.ranges))
	for r, d := range st.ranges {
		if d.rep == nil || d.store == nil || d.failure.Load() != nil || !d.member() {
			continue
		}
		c := d.candidate()
		out[r] = &c
	}
	return out
}

// regionTails asks every node of region (this node's own copies directly)
// for its copies of stream's ranges and combines them (regionCandidates).
// answered is false when no node answered: the region is then no
// candidate for any range.
func (n *Node) regionTails(ctx context.Context, region, stream string) (tails []uint64, ok []bool, answered bool) {
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return nil, nil, false
	}
	ranges := len(st.ranges)
	addrs := n.regionAddrList(region)
	copies := make([][]*copyCandidate, len(addrs)+1)
	if region == n.cfg.Region {
		copies[len(addrs)] = ownCandidates(st)
	}
	var wg sync.WaitGroup
	for i, addr := range addrs {
		if region == n.cfg.Region && addr == n.peerAddr(n.cfg.NodeID) {
			continue // read above
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := n.peerConn(addr)
			if err != nil {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, n.cfg.TailSurveyTimeout)
			defer cancel()
			resp, err := geologv1.NewLogClient(conn).DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
			if err != nil {
				return
			}
			copies[i] = candidatesOf(resp, ranges)
		}()
	}
	wg.Wait()
	for _, c := range copies {
		answered = answered || c != nil
	}
	if !answered {
		return nil, nil, false
	}
	tails, ok = regionCandidates(ranges, copies)
	return tails, ok, true
}

// tailsOf is region's tail of each of stream's ranges for the ranking
// of takeover candidates and a rehome's waits: regionTails, 0 for a range
// the region is no candidate for; nil when no node answered.
func (n *Node) tailsOf(ctx context.Context, region, stream string) []uint64 {
	tails, _, answered := n.regionTails(ctx, region, stream)
	if !answered {
		return nil
	}
	return tails
}

// member reports whether this node's copy is the range's log: the node is
// a voter or a learner of the range's group, as the copy last applied its
// configuration, and the copy is no stray suspect (strays.go). Every node
// opens a copy of every range; a node outside the group holds an empty
// one, and one the range moved away from a stale one, neither of which
// is the region's tail (RangeInfo.not_member).
func (d *rangeDriver) member() bool {
	return d.rep != nil && !d.noReplica.Load() && !d.strayFlagged.Load()
}
