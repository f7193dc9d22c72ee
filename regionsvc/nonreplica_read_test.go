package regionsvc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestReadAtNonReplicaNode: in a region of more nodes than the
// replication factor, a read of a range at a node that holds no replica
// of it must not answer an empty log (a reader that moved there would see
// the log go backwards; found by splitfwd): it refuses with a retriable
// NOT_LEADER, and an SDK subscriber given that node's address first reads
// every record from a replica.
func TestReadAtNonReplicaNode(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 4, 10*time.Millisecond, 0)
	homes := createGeoStream(t, ctx, w, "nr", 8)
	var r uint32
	for i, h := range homes {
		if h == "us" {
			r = uint32(i)
			break
		}
	}
	const count = 30
	for i, n := 0, 0; n < count; i++ {
		if key := fmt.Sprintf("key-%d", i); keyspace.RangeForKey([]byte(key), 8) == r {
			appendRetry(t, ctx, w, "us", "nr", r, key, fmt.Sprintf("v-%d", i))
			n++
		}
	}
	waitUntil(t, ctx, time.Minute, "eu holds the records", func() bool {
		tails := w.tails(ctx, "nr")
		return len(tails["eu"]) > int(r) && tails["eu"][r] == count
	})
	for _, region := range w.regions {
		spec, _ := w.nodes[region][1].streamSpec("nr")
		var outside uint64
		for id, c := range w.conns[region] {
			res, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "nr", Range: r, FromOffset: 0, MaxRecords: 100})
			member := slices.Contains(spec.replicasOf(r), id)
			switch {
			case err == nil && len(res.GetRecords()) == count:
			case err == nil:
				t.Errorf("%s node %d (replicas %v): read at 0 answered %d records, next offset %d, no error; the range holds %d",
					region, id, spec.replicasOf(r), len(res.GetRecords()), res.GetNextOffset(), count)
			case member || rpcerr.CodeOf(err) != apierr.NotLeader || !rpcerr.IsRetriable(err):
				t.Errorf("%s node %d (replicas %v): %v", region, id, spec.replicasOf(r), err)
			default:
				outside = id
			}
		}
		if outside == 0 {
			t.Fatalf("%s: no node refused the read; replicas %v of %d nodes", region, spec.replicasOf(r), w.size)
		}
		addrs := []string{w.addrs[region][outside]}
		for id := uint64(1); id <= uint64(w.size); id++ {
			if id != outside {
				addrs = append(addrs, w.addrs[region][id])
			}
		}
		subscribeAt(t, ctx, strings.Join(addrs, ","), "nr", r).waitFor(t, ctx, count)
	}
}
