package regionsvc_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestRegionGrowsThreeToSixProc: real geologd processes with TLS. A region
// of three nodes serves a stream of 18 ranges while a producer writes
// keyed records to it; nodes 4, 5 and 6 join, one after another, with
// nothing but --join. The rebalancer moves replicas onto them and leader
// balancing moves leaders, until every node holds replicas and leaders
// within 20% of an even share and every range has three voters. Then node
// 6 drains, still under the producer, until every range has three voters
// none on it, and is decommissioned. Then the producer stops: no append
// failed, and reading every range back from offset 0 finds each
// acknowledged record exactly once, at the offset its ack named. It fails
// if the new nodes stay empty, a share stays uneven, a drain leaves a
// range with more or fewer than three voters or ever gives one five (two
// moves of it at once), a move loses or duplicates a record, or an append
// fails while replicas move.
func TestRegionGrowsThreeToSixProc(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	const ranges = 18
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	flags := []string{"--tick", "50ms", "--superusers", "alice", "--rebalance-interval", "1s",
		"--rebalance-moves-max", "3", "--leader-balance-interval", "1s"}
	procs := nodeproc.TLSRegion(t, p, "us", 3, flags...)
	alice := p.ClientDir("alice")
	c := tlsClient(t, procAddrs(procs), alice)
	waitFor(t, ctx, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "grow", RangeCount: ranges})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	prod := startAckedProducer(t, ctx, c, "grow", 200)

	for id := uint64(4); id <= 6; id++ {
		addr := nodeproc.FreeAddr(t)
		procs = append(procs, nodeproc.Start(t, t.TempDir(), addr, append([]string{"--region", "us",
			"--node-id", fmt.Sprint(id), "--join", procs[0].Addr, "--certs-dir", p.NodeDir("us", id)}, flags...)...))
		waitListedAt(t, ctx, procs, alice, id, addr)
	}
	var admins []geologv1.AdminClient
	for _, pr := range procs {
		admins = append(admins, geologv1.NewAdminClient(nodeproc.Dial(t, pr.Addr, alice)))
	}
	joined := time.Now()
	var last string
	waitFor(t, ctx, "replicas and leaders within 20% of even over six nodes", func() bool {
		ok, state := evenOverNodes(ctx, admins, "grow", ranges, 6)
		if state != last {
			t.Logf("placement: %s", state)
			last = state
		}
		return ok
	})
	t.Logf("even over six nodes %v after the last join", time.Since(joined).Round(time.Second))
	drainAndDecommission(t, ctx, admins, "grow", ranges, 6)
	acked := prod.stop(t)
	if len(acked) < 200 {
		t.Fatalf("only %d records acked while the region grew", len(acked))
	}
	checkEachAckedOnce(t, ctx, procs, alice, "grow", ranges, acked)
}

// drainAndDecommission drains node id (SetNodeState DRAINING) and waits
// until every range of stream has exactly three voters, none on id, and
// no learner; it fails if a range is ever seen with five voters (a move
// has four for a moment: the new voter is promoted before the old one
// goes; five is two moves of one range at once). Then it decommissions
// id, asking again while the region refuses (a learner not yet removed).
func drainAndDecommission(t *testing.T, ctx context.Context, admins []geologv1.AdminClient, stream string, ranges uint32, id uint64) {
	t.Helper()
	setState := func(st geologv1.NodeState) error {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := admins[0].SetNodeState(sctx, &geologv1.SetNodeStateRequest{NodeId: id, State: st})
		return err
	}
	if err := setState(geologv1.NodeState_NODE_STATE_DRAINING); err != nil {
		t.Fatalf("drain node %d: %v", id, err)
	}
	start := time.Now()
	var last string
	waitFor(t, ctx, fmt.Sprintf("every range on three voters, none on node %d", id), func() bool {
		ok, state := drained(ctx, admins, stream, ranges, id)
		if state != last {
			t.Logf("drain: %s", state)
			last = state
		}
		if strings.Contains(state, "voters at once") {
			t.Fatalf("drain: %s", state)
		}
		return ok
	})
	t.Logf("node %d drained in %v", id, time.Since(start).Round(10*time.Millisecond))
	var lastErr string
	waitFor(t, ctx, fmt.Sprintf("node %d decommissioned", id), func() bool {
		err := setState(geologv1.NodeState_NODE_STATE_DECOMMISSIONED)
		if err != nil && err.Error() != lastErr {
			t.Logf("decommission of node %d: %v", id, err)
			lastErr = err.Error()
		}
		return err == nil
	})
	t.Logf("node %d decommissioned", id)
}

// drained reports whether every range of stream has exactly three voters,
// none on node id, and no learner, with a summary of the first range
// that has not (naming a range seen with five or more voters so: "voters
// at once").
func drained(ctx context.Context, admins []geologv1.AdminClient, stream string, ranges uint32, id uint64) (bool, string) {
	for r := uint32(0); r < ranges; r++ {
		d, err := describeAtLeader(ctx, admins, stream, r)
		if err != nil {
			return false, fmt.Sprintf("range %d: %v", r, err)
		}
		var voters, learners []uint64
		for _, rs := range d.GetReplicas() {
			if rs.GetRole() == "voter" {
				voters = append(voters, rs.GetNodeId())
			} else {
				learners = append(learners, rs.GetNodeId())
			}
		}
		if len(voters) >= 5 {
			return false, fmt.Sprintf("range %d had %d voters at once: %v", r, len(voters), voters)
		}
		if len(voters) != 3 || len(learners) > 0 || slices.Contains(voters, id) {
			return false, fmt.Sprintf("range %d: voters %v learners %v", r, voters, learners)
		}
	}
	return true, "drained"
}

// describeAtLeader describes range r of stream at its leader.
func describeAtLeader(ctx context.Context, admins []geologv1.AdminClient, stream string, r uint32) (*geologv1.DescribeReplicasResponse, error) {
	var last error = fmt.Errorf("range %d has no leader", r)
	for _, admin := range admins {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := admin.DescribeReplicas(actx, &geologv1.DescribeReplicasRequest{Stream: stream, Range: r})
		cancel()
		if err == nil && resp.GetLeaderId() != 0 {
			return resp, nil
		}
		if err != nil {
			last = err
		}
	}
	return nil, last
}

// evenOverNodes reports whether every range of stream has three voters and
// no learner, and the voters and leaders per node are within 20% of an
// even share over nodes nodes (rounded outward), with a summary.
func evenOverNodes(ctx context.Context, admins []geologv1.AdminClient, stream string, ranges uint32, nodes int) (bool, string) {
	voters, leaders := map[uint64]int{}, map[uint64]int{}
	for r := uint32(0); r < ranges; r++ {
		d, err := describeAtLeader(ctx, admins, stream, r)
		if err != nil {
			return false, fmt.Sprintf("range %d: %v", r, err)
		}
		n := 0
		for _, rs := range d.GetReplicas() {
			if rs.GetRole() != "voter" {
				return false, fmt.Sprintf("range %d has a %s on node %d", r, rs.GetRole(), rs.GetNodeId())
			}
			voters[rs.GetNodeId()]++
			n++
		}
		if n != 3 {
			return false, fmt.Sprintf("range %d has %d voters", r, n)
		}
		leaders[d.GetLeaderId()]++
	}
	state := fmt.Sprintf("voters %v leaders %v", voters, leaders)
	within := func(count map[uint64]int, total int) bool {
		even := float64(total) / float64(nodes)
		for id := uint64(1); id <= uint64(nodes); id++ {
			if n := float64(count[id]); n < even*0.8-0.5 || n > even*1.2+0.5 {
				return false
			}
		}
		return true
	}
	return within(voters, 3*int(ranges)) && within(leaders, int(ranges)), state
}

// ackPos is where a producer's ack placed a record.
type ackPos struct {
	rng    uint32
	offset uint64
}

// ackedProducer produces keyed records at about rate per second and keeps
// every ack; a failed record fails the test at stop.
type ackedProducer struct {
	p        *client.Producer
	stopping chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	acked    map[string]ackPos
	fails    []error
}

func startAckedProducer(t *testing.T, ctx context.Context, c *client.Client, stream string, rate int) *ackedProducer {
	p, err := c.NewProducer(stream, client.ProducerRetryBackoff(10*time.Millisecond, 200*time.Millisecond), client.DeliveryTimeout(3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ap := &ackedProducer{p: p, stopping: make(chan struct{}), done: make(chan struct{}), acked: map[string]ackPos{}}
	go func() {
		defer close(ap.done)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ap.stopping:
				return
			case <-tick.C:
			}
			value := fmt.Sprintf("v%d", i)
			p.Produce(ctx, &client.Record{Key: []byte(fmt.Sprintf("k%d", i%64)), Value: []byte(value)}, func(res client.ProduceResult, err error) {
				ap.mu.Lock()
				defer ap.mu.Unlock()
				if err != nil {
					ap.fails = append(ap.fails, err)
					return
				}
				ap.acked[value] = ackPos{rng: res.Range, offset: res.Offset}
			})
		}
	}()
	return ap
}

// stop ends producing, flushes, and returns the acks.
func (ap *ackedProducer) stop(t *testing.T) map[string]ackPos {
	close(ap.stopping)
	<-ap.done
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := ap.p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	ap.p.Close()
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if len(ap.fails) > 0 {
		t.Fatalf("%d records failed (first: %v)", len(ap.fails), ap.fails[0])
	}
	return ap.acked
}

// checkEachAckedOnce reads every range of stream from offset 0 to its
// end and checks that each acked record is stored exactly once, at its
// acked offset.
func checkEachAckedOnce(t *testing.T, ctx context.Context, procs []*nodeproc.Proc, dir, stream string, ranges uint32, acked map[string]ackPos) {
	t.Helper()
	seen := map[string]ackPos{}
	ends := make([]uint64, ranges)
	for _, a := range acked {
		ends[a.rng] = max(ends[a.rng], a.offset+1)
	}
	for r := uint32(0); r < ranges; r++ {
		for _, rec := range readRangeTo(t, ctx, procs, dir, stream, r, ends[r]) {
			v := string(rec.GetValue())
			if prev, dup := seen[v]; dup {
				t.Fatalf("record %q stored twice: range %d offset %d and range %d offset %d", v, prev.rng, prev.offset, r, rec.GetOffset())
			}
			seen[v] = ackPos{rng: r, offset: rec.GetOffset()}
		}
	}
	for v, want := range acked {
		if got, ok := seen[v]; !ok || got != want {
			t.Fatalf("acked record %q at range %d offset %d: stored at %+v (found %v)", v, want.rng, want.offset, got, ok)
		}
	}
	t.Logf("%d acked records each stored once (%d stored)", len(acked), len(seen))
}

// readRangeTo reads range r of stream from offset 0 up to end at least
// (further, to the tail of the copy that answers), from any node whose
// copy holds end.
func readRangeTo(t *testing.T, ctx context.Context, procs []*nodeproc.Proc, dir, stream string, r uint32, end uint64) []*geologv1.StoredRecord {
	t.Helper()
	var logs []geologv1.LogClient
	for _, pr := range procs {
		logs = append(logs, geologv1.NewLogClient(nodeproc.Dial(t, pr.Addr, dir)))
	}
	var out []*geologv1.StoredRecord
	var next uint64
	for {
		var resp *geologv1.ReadResponse
		var lastErr error
		waitFor(t, ctx, fmt.Sprintf("read range %d at %d (last error: %v)", r, next, lastErr), func() bool {
			for _, lc := range logs {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				got, err := lc.Read(rctx, &geologv1.ReadRequest{Stream: stream, Range: r, FromOffset: next, MaxRecords: 1000,
					Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: end})
				cancel()
				if err == nil {
					resp = got
					return true
				}
				lastErr = err
			}
			return false
		})
		for _, rec := range resp.GetRecords() {
			if rec.GetOffset() < next {
				t.Fatalf("range %d: read offset %d after %d", r, rec.GetOffset(), next)
			}
			next = rec.GetOffset() + 1
			out = append(out, rec)
		}
		next = max(next, resp.GetNextOffset())
		if next >= resp.GetTailOffset() {
			return out
		}
		if len(resp.GetRecords()) == 0 {
			t.Fatalf("range %d: a read at %d below the tail %d returned nothing", r, next, resp.GetTailOffset())
		}
	}
}
