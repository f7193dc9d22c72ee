package regionsvc

import (
	"context"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/membership"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestCatalogueGrowsFromOneFounder: a region founded with node 1 alone
// grows by joins. With node 2 joined the catalogue keeps one voter (two
// would need both up); with node 3 it grows to voters 1-3, and node 4
// stays a learner. Node 1 is then stopped: nodes 2-4 still commit to the
// catalogue (a stream is created and listed on each). It fails if the
// catalogue keeps its founding voter only (the create finds no quorum
// once node 1 is gone).
func TestCatalogueGrowsFromOneFounder(t *testing.T) {
	t.Parallel()
	tr := newTestRegionRF(t, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr.createStream(ctx, "before", 1)
	tr.joinNode(2, 1)
	tr.waitNodes(ctx, "node 2 live", nodeState(2, geologv1.NodeState_NODE_STATE_LIVE))
	tr.waitCatalogueConf(ctx, 1, []uint64{1}, []uint64{2})
	tr.joinNode(3, 1)
	tr.waitCatalogueConf(ctx, 1, []uint64{1, 2, 3}, nil)
	tr.joinNode(4, 1)
	tr.waitCatalogueConf(ctx, 1, []uint64{1, 2, 3}, []uint64{4})
	tr.waitCatalogueConf(ctx, 2, []uint64{1, 2, 3}, []uint64{4})

	tr.stop(1)
	// Through the joined nodes (tr.retry asks the founders only).
	var err error
	waitUntil(t, ctx, 60*time.Second, "create after node 1 stopped", func() bool {
		for _, id := range []uint64{2, 3, 4} {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = tr.clients[id].CreateStream(cctx, &geologv1.CreateStreamRequest{Name: "after", RangeCount: 1})
			ccancel()
			if err == nil || rpcerr.CodeOf(err) == apierr.StreamExists {
				return true
			}
		}
		t.Logf("create: %v", err)
		return false
	})
	for _, id := range []uint64{2, 3, 4} {
		waitUntil(t, ctx, 30*time.Second, "stream after listed", func() bool {
			tr.nodes[id].mu.RLock()
			_, ok := tr.nodes[id].streams["after"]
			tr.nodes[id].mu.RUnlock()
			return ok
		})
	}
}

// TestCatalogueVotersWant: the founding count when 3 or more; else 3 once
// three nodes are members (draining counts, decommissioned does not),
// never an even count grown to. It fails on any other count.
func TestCatalogueVotersWant(t *testing.T) {
	t.Parallel()
	nodes := func(states ...membership.State) []membership.Node {
		var out []membership.Node
		for i, s := range states {
			out = append(out, membership.Node{ID: uint64(i + 1), State: s})
		}
		return out
	}
	L, D, X := membership.Live, membership.Draining, membership.Decommissioned
	for _, c := range []struct {
		founded int
		nodes   []membership.Node
		want    int
	}{
		{1, nodes(L), 1},
		{1, nodes(L, L), 1},
		{1, nodes(L, L, L), 3},
		{1, nodes(L, L, L, L, L, L), 3},
		{1, nodes(L, L, D), 3},
		{1, nodes(L, L, X), 1},
		{2, nodes(L, L), 2},
		{2, nodes(L, L, L), 3},
		{3, nodes(L), 3},
		{5, nodes(L, L, L), 5},
		{3, nodes(L, L, L, L, L, L), 3},
	} {
		if got := catalogueVotersWant(c.founded, c.nodes); got != c.want {
			t.Errorf("founded %d, %d nodes: %d voters, want %d", c.founded, len(c.nodes), got, c.want)
		}
	}
}
