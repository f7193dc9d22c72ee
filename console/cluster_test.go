package console

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/regionsvc"
	"github.com/hashicorp/go-hclog"
)

// testCluster is in-process regionsvc nodes: regions of size nodes each,
// every region reaching the others directly (no WAN emulator: the console
// is about what the nodes report, not about latency).
type testCluster struct {
	regions []string
	addrs   map[string][]string // by region, in Raft id order
	nodes   map[string][]*regionsvc.Node
}

func startCluster(t testing.TB, sizes map[string]int) *testCluster {
	t.Helper()
	tc := &testCluster{addrs: map[string][]string{}, nodes: map[string][]*regionsvc.Node{}}
	for r := range sizes {
		tc.regions = append(tc.regions, r)
	}
	slices.Sort(tc.regions)
	for _, r := range tc.regions {
		for range sizes[r] {
			tc.addrs[r] = append(tc.addrs[r], portlock.Addr(t))
		}
	}
	for _, r := range tc.regions {
		peers := map[uint64]string{}
		for i, a := range tc.addrs[r] {
			peers[uint64(i+1)] = a
		}
		remote := map[string][]string{}
		for _, o := range tc.regions {
			if o != r {
				remote[o] = tc.addrs[o]
			}
		}
		for i := range tc.addrs[r] {
			n, err := regionsvc.New(regionsvc.Config{
				DataDir: t.TempDir(), ListenAddr: tc.addrs[r][i], Region: r, Regions: remote,
				NodeID: uint64(i + 1), Peers: peers,
				// A 50 ms tick, as regionsvc's multi-region tests: shorter
				// ones depose leaders on a busy machine.
				TickInterval: 50 * time.Millisecond, Fsync: 1, // FsyncNever: nothing here is about durability
				Logger: hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn, Name: fmt.Sprintf("%s.n%d", r, i+1)}),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := n.Start(); err != nil {
				n.Close()
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			tc.nodes[r] = append(tc.nodes[r], n)
		}
	}
	return tc
}

// client is an SDK client of a region's nodes.
func (tc *testCluster) client(t testing.TB, region string) *client.Client {
	t.Helper()
	c, err := client.New(tc.addrs[region][0], client.Addrs(tc.addrs[region]...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// createStream creates a stream (retrying while the regions elect their
// leaders) and waits until every node describes it.
func (tc *testCluster) createStream(t testing.TB, ctx context.Context, sc client.StreamConfig) {
	t.Helper()
	c := tc.client(t, tc.regions[0])
	waitFor(t, ctx, "stream "+sc.Name+" created", func() bool {
		_, err := c.CreateStream(ctx, sc)
		if err != nil {
			t.Logf("create %s: %v", sc.Name, err)
		}
		return err == nil
	})
	waitFor(t, ctx, "stream "+sc.Name+" described by every node", func() bool {
		for _, r := range sc.Regions {
			for _, a := range tc.addrs[r] {
				if _, err := describeAt(ctx, a, sc.Name); err != nil {
					return false
				}
			}
		}
		return true
	})
}

// describeAt is one node's own DescribeStream.
func describeAt(ctx context.Context, addr, stream string) (*client.StreamDescription, error) {
	c, err := client.New(addr, client.RetriesMax(0))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.DescribeStream(cctx, stream)
}

// waitFor polls cond every 100 ms until it holds or ctx ends.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting: %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func testLogger(t testing.TB, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn, Name: name})
}
