package regionsvc

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestReadAtNonReplicaNode: in a region of more nodes than the
// replication factor, a read of a range at a node that holds no replica
// of it must not answer an empty log: it serves the records or refuses
// (a typed error a client retries elsewhere). Found by splitfwd
// (notes/splitfwd.md "Left"): node 4 of each 4-node region answers 0
// records, next offset 0, no error, for a range holding 30, so a reader
// that moves to it sees the log go backwards, and an SDK subscriber given
// every address of the region stalls. Skipped until read routing is
// fixed; run with GEOLOG_NONREPLICA_READ=1.
func TestReadAtNonReplicaNode(t *testing.T) {
	if testing.Short() || os.Getenv("GEOLOG_NONREPLICA_READ") == "" {
		t.Skip("known gap (notes/splitfwd.md): set GEOLOG_NONREPLICA_READ=1")
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
		for id, c := range w.conns[region] {
			res, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "nr", Range: r, FromOffset: 0, MaxRecords: 100})
			if err == nil && len(res.GetRecords()) != count {
				t.Errorf("%s node %d (replicas %v): read at 0 answered %d records, next offset %d, no error; the range holds %d",
					region, id, spec.replicasOf(r), len(res.GetRecords()), res.GetNextOffset(), count)
			}
		}
	}
}
