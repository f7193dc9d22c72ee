package regionsvc

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Cluster-wide orphan listing (ListOrphans with ORPHAN_SCOPE_CLUSTER): a
// fork is kept by the nodes of the region whose log it cut, so the node
// asks every node of every region of the stream for its own forks, a
// bounded number at a time and within one deadline, and answers with what
// each said, or why it did not.

const (
	// orphanFanoutConcurrencyMax bounds the nodes asked at once.
	orphanFanoutConcurrencyMax = 8
	// orphanFanoutTimeoutDefault is the whole listing's deadline when the
	// request has none; orphanFanoutTimeoutMax caps the request's.
	orphanFanoutTimeoutDefault = 10 * time.Second
	orphanFanoutTimeoutMax     = 30 * time.Second
)

// orphanTarget is one node to ask.
type orphanTarget struct {
	region string
	id     uint64
	// addr is where this node reaches it ("" for this node itself).
	addr string
}

// clusterOrphans asks every node of the stream's regions for its forks.
func (n *Node) clusterOrphans(ctx context.Context, stream string) (*geologv1.ListOrphansResponse, error) {
	if err := validateStreamName(stream); err != nil {
		return nil, err
	}
	timeout := orphanFanoutTimeoutDefault
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(time.Until(dl), orphanFanoutTimeoutMax)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	spec, known := n.streamSpec(stream)
	targets := n.orphanTargets(spec, known)
	answers := make([]orphanAnswer, len(targets))
	var wg sync.WaitGroup
	sem := make(chan struct{}, orphanFanoutConcurrencyMax)
	for i, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				answers[i] = n.orphanAnswer(tg, nil, apierr.New(apierr.Timeout, "not asked before the deadline"))
				return
			}
			forks, err := n.askOrphans(ctx, tg, stream)
			answers[i] = n.orphanAnswer(tg, forks, err)
		}()
	}
	wg.Wait()
	return mergeOrphans(stream, answers, spec, known)
}

// orphanTargets lists every node of the stream's regions (of every region
// this node knows, if it does not know the stream): its own region's from
// Peers (this node included), the others' from Regions.
func (n *Node) orphanTargets(spec streamSpec, known bool) []orphanTarget {
	regions := spec.Regions
	if !known {
		regions = []string{n.cfg.Region}
		for r := range n.cfg.Regions {
			regions = append(regions, r)
		}
		slices.Sort(regions[1:])
	}
	var out []orphanTarget
	for _, region := range regions {
		if region != n.cfg.Region {
			for i, addr := range n.regionAddrs(region) {
				out = append(out, orphanTarget{region: region, id: uint64(i + 1), addr: addr})
			}
			continue
		}
		peers := n.memberAddrs() // joined nodes too (members.go)
		if len(peers) == 0 {
			out = append(out, orphanTarget{region: region, id: n.cfg.NodeID})
			continue
		}
		for _, id := range slices.Sorted(maps.Keys(peers)) {
			tg := orphanTarget{region: region, id: id, addr: peers[id]}
			if id == n.cfg.NodeID {
				tg.addr = ""
			}
			out = append(out, tg)
		}
	}
	return out
}

// askOrphans asks one node for its own forks of stream.
func (n *Node) askOrphans(ctx context.Context, tg orphanTarget, stream string) ([]*geologv1.OrphanFork, error) {
	if tg.addr == "" {
		return n.localOrphans(ctx, stream)
	}
	conn, err := n.peerConn(tg.addr)
	if err != nil {
		return nil, apierr.Wrap(apierr.Unavailable, err, "")
	}
	resp, err := geologv1.NewAdminClient(conn).ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: stream, Scope: geologv1.OrphanScope_ORPHAN_SCOPE_NODE})
	if err != nil {
		return nil, rpcerr.FromError(err)
	}
	return resp.GetForks(), nil
}

// orphanAnswer is one node's answer.
type orphanAnswer struct {
	entry *geologv1.NodeOrphans
	// notFound: the node does not hold the stream.
	notFound bool
}

// orphanAnswer is one node's entry of the answer: its identity as this
// node knows it (its advertised address when learned, advertise.go) and
// what it said.
func (n *Node) orphanAnswer(tg orphanTarget, forks []*geologv1.OrphanFork, err error) orphanAnswer {
	no := &geologv1.NodeOrphans{Region: tg.region, NodeId: tg.id, Address: tg.addr, Forks: forks}
	if tg.addr == "" {
		no.Address = n.advertise
	} else if ni, ok := n.book.identity(tg.addr); ok {
		no.NodeId, no.Address = ni.id, ni.advertise
	}
	switch {
	case err == nil:
		return orphanAnswer{entry: no}
	case rpcerr.CodeOf(err) == apierr.StreamNotFound:
		return orphanAnswer{entry: no, notFound: true}
	}
	no.Error = apierr.As(err).Error()
	return orphanAnswer{entry: no}
}

// mergeOrphans builds the answer: every node's entry, and each fork once
// per (region, range, fork index) in that order. A node that does not
// hold the stream has answered (no forks) unless its region is one of the
// stream's as this node knows it; if no node holds it, the stream is not
// found.
func mergeOrphans(stream string, answers []orphanAnswer, spec streamSpec, known bool) (*geologv1.ListOrphansResponse, error) {
	resp := &geologv1.ListOrphansResponse{}
	type fork struct {
		region string
		f      *geologv1.OrphanFork
	}
	type forkKey struct {
		region string
		rng    uint32
		index  uint64
	}
	seen := map[forkKey]bool{}
	var forks []fork
	holders := 0
	for _, a := range answers {
		no := a.entry
		resp.Nodes = append(resp.Nodes, no)
		if a.notFound && known && spec.hasRegion(no.Region) {
			no.Error = "the node does not hold the stream (yet)"
		}
		if no.Error != "" {
			resp.Partial = true
			continue
		}
		if !a.notFound {
			holders++
		}
		for _, f := range no.Forks {
			if k := (forkKey{no.Region, f.GetRange(), f.GetForkIndex()}); !seen[k] {
				seen[k] = true
				forks = append(forks, fork{no.Region, f})
			}
		}
	}
	if holders == 0 && !resp.Partial {
		return nil, apierr.New(apierr.StreamNotFound, "no node holds stream %q", stream)
	}
	slices.SortStableFunc(forks, func(a, b fork) int {
		return cmp.Or(cmp.Compare(a.region, b.region), cmp.Compare(a.f.GetRange(), b.f.GetRange()), cmp.Compare(a.f.GetForkIndex(), b.f.GetForkIndex()))
	})
	for _, f := range forks {
		resp.Forks = append(resp.Forks, f.f)
	}
	return resp, nil
}
