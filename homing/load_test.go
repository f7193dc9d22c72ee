package homing

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// TestLeaseStoreLoad measures the lease store's statement rate in steady
// state: 9 nodes (3 regions of 3) heartbeating every second for 10 seconds,
// with 100 and with 1,000 ranges homed across the regions. Every statement
// the nodes send is counted by a pgx tracer (BEGIN, SAVEPOINT, RELEASE and
// COMMIT included). The statements of a heartbeat's committed transaction
// must not depend on the range count: range homes hang off liveness, so
// the load is O(nodes). Transactions retried after a serialization
// conflict (more frequent when the machine is busy and the heartbeats of a
// round overlap longer) are counted apart and printed.
//
// Time is virtual (each round is one heartbeat interval, driven through
// Refresh), so the counts are exact. GEOLOG_HOMING_LOAD_REALTIME=1 also runs
// the drivers on their own 1s timers for 10 real seconds.
func TestLeaseStoreLoad(t *testing.T) {
	const nodes, rounds = 9, 10
	perHeartbeat := map[[2]int]float64{} // by (nodes, ranges)
	for _, shape := range [][2]int{{9, 100}, {9, 1000}, {3, 1000}} {
		nodes, ranges := shape[0], shape[1]
		counter, homes, clock := loadCluster(t, nodes, ranges, true)
		ctx := ctxT(t)
		refreshAll := func() {
			var wg sync.WaitGroup
			for _, h := range homes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := h.Refresh(ctx); err != nil {
						t.Errorf("refresh: %v", err)
					}
				}()
			}
			wg.Wait()
		}
		refreshAll() // registration and the first fetch of the homes
		start, startCommitted, startAborted := counter.n.Load(), counter.committed.Load(), counter.aborted.Load()
		began := time.Now()
		for range rounds {
			clock.Advance(time.Second)
			refreshAll()
		}
		elapsed := time.Since(began)
		n := counter.n.Load() - start
		committed, aborted := counter.committed.Load()-startCommitted, counter.aborted.Load()-startAborted
		perHeartbeat[shape] = float64(committed) / float64(nodes*rounds)
		fmt.Printf("lease store load: %d nodes, %d ranges, %d heartbeat rounds (%ds at 1s): %d statements = %.1f statements/s, %.1f per node per heartbeat (%d more in %d statements of retried transactions; %.1f ms wall per round)\n",
			nodes, ranges, rounds, rounds, n, float64(n)/rounds, perHeartbeat[shape], n-committed, aborted, float64(elapsed.Microseconds())/1000/rounds)
		for _, h := range homes {
			if len(h.View().Homes()) == 0 {
				t.Fatalf("node %d has no homes", h.View().NodeID)
			}
		}
	}
	// O(nodes): the same per node per heartbeat whatever the shape.
	want := perHeartbeat[[2]int{9, 1000}]
	for _, got := range perHeartbeat {
		if got != want {
			t.Fatalf("statements per heartbeat depend on the shape: %v", perHeartbeat)
		}
	}
	if want > 8 {
		t.Fatalf("%.1f statements per heartbeat, want at most 8 (one small transaction)", want)
	}

	if os.Getenv("GEOLOG_HOMING_LOAD_REALTIME") == "1" {
		counter, _, _ := loadCluster(t, nodes, 1000, false)
		time.Sleep(time.Second) // registration
		start := counter.n.Load()
		time.Sleep(10 * time.Second)
		n := counter.n.Load() - start
		fmt.Printf("lease store load (real time, 1s timers): %d nodes, 1000 ranges, 10s: %d statements = %.1f statements/s\n", nodes, n, float64(n)/10)
	}
}

// loadCluster starts nodes drivers (3 regions) on a fresh database with
// ranges ranges homed round-robin across the regions; each node has its
// own pool, all counted by one tracer. virtual: fake clock and manual
// heartbeats.
func loadCluster(t *testing.T, nodes, ranges int, virtual bool) (*statementCounter, []*Homes, *fakeClock) {
	setup, url := newSQLStore(t)
	regions := []string{"us", "eu", "ap"}
	specs := make([]HomeSpec, ranges)
	for r := range ranges {
		specs[r] = HomeSpec{Key: RangeKey{Stream: "load", Range: uint32(r)}, Region: regions[r%len(regions)]}
	}
	if _, err := setup.CreateHomes(ctxT(t), specs); err != nil {
		t.Fatal(err)
	}
	counter := &statementCounter{}
	clock := &fakeClock{}
	clock.Set(time.Hour)
	var homes []*Homes
	for i := range nodes {
		cfg := Config{NodeID: uint64(i + 1), Region: regions[i%len(regions)],
			Store: openSQLAt(t, url, func(c *SQLConfig) { c.Tracer = counter; c.MaxConns = 2 })}
		if virtual {
			// A heartbeat is not cut off, however busy the machine: the
			// counts are the subject here, not the timeouts.
			cfg.Now, cfg.ManualHeartbeats, cfg.HeartbeatTimeout = clock.Now, true, time.Minute
		}
		h, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		homes = append(homes, h)
	}
	return counter, homes, clock
}
