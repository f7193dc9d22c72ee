package client_test

// Routing tests against a fake cluster (clienttest.Cluster): several nodes
// sharing one log per range, where only the range's leader appends and the
// others answer NOT_LEADER, with or without a hint.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

func startCluster(t testing.TB, nodes int) *clienttest.Cluster {
	t.Helper()
	c, err := clienttest.StartCluster(nodes, clienttest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	addr := portlock.Addr(t) // held, and nothing listens on it
	return addr
}

// keyedRecords returns keys x perKey records, produce order = seq-major,
// whose values say "key|seq|padding".
func keyedRecords(keys, perKey int) []*client.Record {
	var recs []*client.Record
	for seq := range perKey {
		for k := range keys {
			recs = append(recs, &client.Record{
				Key:   fmt.Appendf(nil, "key-%d", k),
				Value: fmt.Appendf(nil, "key-%d|%d|%s", k, seq, strings.Repeat("p", (seq*7+k*13)%200)),
			})
		}
	}
	return recs
}

// checkExactlyOnce checks the producer's invariants after every record in
// recs was produced with rs.cb(i): no record failed, each range's log holds
// every key's records exactly once and in produce order, and every ack
// names the offset holding its record.
func checkExactlyOnce(t *testing.T, fake *clienttest.Server, stream string, rangeCount uint32, recs []*client.Record, rs *results) {
	t.Helper()
	if len(rs.errs) != 0 {
		for i, err := range rs.errs {
			t.Errorf("record %d: %v", i, err)
		}
		t.FailNow()
	}
	next := make(map[string]int)
	total := 0
	for rng := range rangeCount {
		for _, rec := range fake.Records(stream, rng) {
			parts := strings.SplitN(string(rec.GetValue()), "|", 3)
			seq, _ := strconv.Atoi(parts[1])
			if parts[0] != string(rec.GetKey()) || next[parts[0]] != seq {
				t.Fatalf("range %d offset %d: %s #%d, want #%d", rng, rec.GetOffset(), parts[0], seq, next[parts[0]])
			}
			next[parts[0]]++
			total++
		}
	}
	if total != len(recs) {
		t.Fatalf("log holds %d records, want %d", total, len(recs))
	}
	for i, res := range rs.res {
		if want := keyspace.RangeForKey(recs[i].Key, rangeCount); res.Range != want {
			t.Fatalf("record %d acked in range %d, want %d", i, res.Range, want)
		}
		stored := fake.Records(stream, res.Range)[res.Offset]
		if !bytes.Equal(stored.GetValue(), recs[i].Value) {
			t.Fatalf("record %d acked at %d/%d, which holds %q", i, res.Range, res.Offset, stored.GetValue())
		}
	}
}

func sumStats(c *clienttest.Cluster) clienttest.Stats {
	var sum clienttest.Stats
	for _, n := range c.Nodes() {
		s := n.Stats()
		sum.AppendRequests += s.AppendRequests
		sum.Duplicates += s.Duplicates
		sum.AppendStreams += s.AppendStreams
		sum.Subscriptions += s.Subscriptions
		sum.NotLeaderReplies += s.NotLeaderReplies
	}
	return sum
}

// TestClusterProducerFollowsLeaderMoves: leadership moves again and again,
// for all ranges and for single ones, while a pipelined producer appends
// and acks are lost now and then. The client knows only node 0 at first and
// learns the others from hints. Every record lands once, in per-key order,
// and every ack carries its record's offset.
func TestClusterProducerFollowsLeaderMoves(t *testing.T) {
	// A fixed seed by default (goroutine interleavings still vary);
	// GEOLOG_TEST_SEED explores others.
	seed := uint64(1)
	if v, err := strconv.ParseUint(os.Getenv("GEOLOG_TEST_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d", seed)
	cl := startCluster(t, 3)
	const ranges = 3
	cl.MustCreateStream("s", ranges)
	cl.SetLeader(1) // node 0, the only one the client knows, redirects
	c := newClient(t, cl.Node(0).Addr())
	p := newProducer(t, c, "s", client.InflightBatchesMax(5), client.BatchBytesMax(2<<10),
		client.ProducerRetryBackoff(time.Millisecond, 10*time.Millisecond))
	ctx := testCtx(t)

	// Lost acks (applied, then the stream drops) on every node, so that
	// batches resent to a new leader must come back as duplicates with
	// their original offsets.
	var faultMu sync.Mutex
	rnd := rand.New(rand.NewPCG(seed, 1))
	for _, n := range cl.Nodes() {
		n.SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault {
			faultMu.Lock()
			defer faultMu.Unlock()
			// 10% of requests: with ~130 reaching a leader, the chance that
			// no ack is lost at all (and the duplicate check below could
			// not hold) is about 1e-6.
			if rnd.IntN(100) < 10 {
				return clienttest.Fault{DropAfterApply: true}
			}
			return clienttest.Fault{}
		})
	}

	recs := keyedRecords(12, 150)
	rs := newResults()
	var acked atomic.Int64
	for i, rec := range recs {
		cb := rs.cb(i)
		p.Produce(ctx, rec, func(res client.ProduceResult, err error) {
			cb(res, err)
			acked.Add(1)
		})
	}
	// Move leadership every 100 acks while the rest is in flight:
	// alternately every range to the next node in turn (so that each node
	// leads for a while), and one range to a random node.
	moves := 0
	for threshold := int64(100); threshold < int64(len(recs)); threshold += 100 {
		waitFor(t, fmt.Sprintf("%d acks", threshold), func() bool { return acked.Load() >= threshold })
		if moves%2 == 0 {
			cl.SetLeader((moves/2 + 2) % 3)
		} else {
			faultMu.Lock()
			node, rng := rnd.IntN(3), uint32(rnd.IntN(ranges))
			faultMu.Unlock()
			cl.SetRangeLeader("s", rng, node)
		}
		moves++
	}
	rs.wait(t)
	checkExactlyOnce(t, cl.Node(0), "s", ranges, recs, rs)

	stats := sumStats(cl)
	t.Logf("%d moves; stats %+v; addrs %v", moves, stats, c.Addrs())
	if stats.NotLeaderReplies == 0 || stats.Duplicates == 0 {
		t.Fatalf("moves or lost acks did not happen: %+v", stats)
	}
	// Which nodes got to append depends on timing (a leadership window can
	// pass while the producer is backing off); that appends moved at least
	// once, to an address learned from a hint, does not.
	appended := 0
	for _, n := range cl.Nodes() {
		if s := n.Stats(); s.AppendRequests-s.NotLeaderReplies > 0 {
			appended++
		}
	}
	if appended < 2 {
		t.Fatalf("appends never moved off one node: %+v", stats)
	}
	if got := c.Addrs(); len(got) < 2 {
		t.Fatalf("client knows %v: no address was learned from a hint", got)
	}
}

// TestClusterProducerSurvivesLeaderDeath: the leader dies with batches in
// flight: in each range the first it applied without answering (an ack
// lost), the second it held, the rest wait behind. Another node is
// elected. The producer, whose streams were on the dead node, moves to the
// next address (node 1), which redirects it to the new leader (node 2):
// there the applied batches come back as duplicates with their original
// offsets and the others are appended after them, in order.
func TestClusterProducerSurvivesLeaderDeath(t *testing.T) {
	cl := startCluster(t, 3)
	const ranges = 3
	cl.MustCreateStream("s", ranges)
	c := newClient(t, cl.AddrList())
	p := newProducer(t, c, "s", client.ProducerRetryBackoff(time.Millisecond, 10*time.Millisecond))
	ctx := testCtx(t)

	const keys = 12 // keys 0-11 cover the 3 ranges
	recs := keyedRecords(keys, 20)
	rs := newResults()
	res, err := p.ProduceSync(ctx, recs[:keys]...) // every range's producer id is known
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		rs.res[i] = r
	}

	var faultMu sync.Mutex
	requests := make(map[uint32]int)
	cl.Node(0).SetAppendFault(func(_ int64, req *geologv1.AppendRequest) clienttest.Fault {
		faultMu.Lock()
		defer faultMu.Unlock()
		requests[req.GetRange()]++
		switch requests[req.GetRange()] {
		case 1:
			return clienttest.Fault{SkipReply: true}
		default:
			return clienttest.Fault{Hold: make(chan struct{})} // until the node dies
		}
	})
	batchesBefore := make([]int, ranges)
	for rng := range uint32(ranges) {
		batchesBefore[rng] = len(cl.Node(0).Batches("s", rng))
	}
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			p.Produce(ctx, recs[i], rs.cb(i))
		}
	}
	produce(keys, 2*keys)
	waitFor(t, "a batch applied without an answer in every range", func() bool {
		for rng := range uint32(ranges) {
			if len(cl.Node(0).Batches("s", rng)) == batchesBefore[rng] {
				return false
			}
		}
		return true
	})
	produce(2*keys, 3*keys)
	waitFor(t, "a held batch in every range", func() bool {
		for rng := range uint32(ranges) {
			if cl.Node(0).Outstanding("s", rng) == 0 {
				return false
			}
		}
		return true
	})
	produce(3*keys, len(recs))
	notLeader1 := cl.Node(1).Stats().NotLeaderReplies
	cl.Kill(0)
	cl.SetLeader(2)
	rs.wait(t)
	checkExactlyOnce(t, cl.Node(0), "s", ranges, recs, rs)

	dups, fresh := 0, 0
	for i, r := range rs.res {
		switch {
		case i < keys:
		case r.Duplicate:
			dups++
		default:
			fresh++
		}
	}
	if dups == 0 || fresh == 0 {
		t.Fatalf("%d duplicates and %d fresh appends after the move, want both", dups, fresh)
	}
	if cl.Node(1).Stats().NotLeaderReplies == notLeader1 {
		t.Fatal("node 1 did not redirect the producer")
	}
	t.Logf("%d records acked as duplicates, %d appended at the new leader; node stats %+v %+v",
		dups, fresh, cl.Node(1).Stats(), cl.Node(2).Stats())
}

// TestClusterNotLeaderWithoutHint: followers that do not know the leader
// (no hint) make the producer try the next address in turn; the learned
// leader is cached in the client for later producers.
func TestClusterNotLeaderWithoutHint(t *testing.T) {
	cl := startCluster(t, 3)
	cl.MustCreateStream("s", 2)
	cl.SetLeaderHints(false)
	cl.SetLeader(2)
	c := newClient(t, cl.AddrList())
	ctx := testCtx(t)

	p1 := newProducer(t, c, "s")
	produceN(t, p1, 0, 20)
	for i := range 2 {
		if cl.Node(i).Stats().NotLeaderReplies == 0 {
			t.Fatalf("node %d answered no NOT_LEADER: the producer did not start at node 0 and go round", i)
		}
	}

	// A new producer of the same client starts at the cached leader.
	before := []int64{cl.Node(0).Stats().AppendRequests, cl.Node(1).Stats().AppendRequests}
	p2 := newProducer(t, c, "s")
	produceN(t, p2, 20, 20)
	if after := []int64{cl.Node(0).Stats().AppendRequests, cl.Node(1).Stats().AppendRequests}; !slices.Equal(before, after) {
		t.Fatalf("a producer with a cached leader sent to followers: requests %v -> %v", before, after)
	}

	// No leader at all (an election): the range goes round every node
	// until one is elected.
	cl.SetLeader(-1)
	notLeader := sumStats(cl).NotLeaderReplies
	rs := newResults()
	p2.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("40")}, rs.cb(0))
	waitFor(t, "the producer to go round the nodes", func() bool {
		for _, n := range cl.Nodes() {
			if n.Stats().NotLeaderReplies == 0 {
				return false
			}
		}
		return sumStats(cl).NotLeaderReplies >= notLeader+4
	})
	cl.SetLeader(1)
	rs.wait(t)
	if len(rs.errs) != 0 {
		t.Fatal(rs.errs)
	}
	r := keyspace.RangeForKey([]byte("k"), 2)
	for i, rec := range cl.Node(0).Records("s", r) {
		if string(rec.GetValue()) != strconv.Itoa(i) {
			t.Fatalf("offset %d holds %q", i, rec.GetValue())
		}
	}
	if n := len(cl.Node(0).Records("s", r)); n != 41 {
		t.Fatalf("log holds %d records", n)
	}
}

// TestBootstrapListWithDeadAddress: a dead address in the bootstrap list,
// first or last, given in New's list or through Addrs, costs nothing but a
// detour: admin calls (CreateStream too), produce, read and subscribe work.
func TestBootstrapListWithDeadAddress(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	dead := deadAddr(t)
	cases := []struct {
		name string
		addr string
		opts []client.Opt
	}{
		{"dead first", dead + "," + fake.Addr(), nil},
		{"dead last", fake.Addr() + ", " + dead, nil},
		{"Addrs option", dead, []client.Opt{client.Addrs(fake.Addr())}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, tc.addr, tc.opts...)
			if got := c.Addrs(); len(got) != 2 {
				t.Fatalf("Addrs() = %v", got)
			}
			ctx := testCtx(t)
			stream := fmt.Sprintf("s%d", i)
			if _, err := c.CreateStream(ctx, client.StreamConfig{Name: stream, RangeCount: 1}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.DescribeStream(ctx, stream); err != nil {
				t.Fatal(err)
			}
			if list, err := c.ListStreams(ctx); err != nil || len(list) != i+1 {
				t.Fatalf("list %v, %v", list, err)
			}
			produceN(t, newProducer(t, c, stream), 0, 10)
			r, err := c.Read(ctx, stream, 0, 0, client.ReadOptions{})
			if err != nil || len(r.Records) != 10 {
				t.Fatalf("read %+v, %v", r, err)
			}
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			n := 0
			for rec, err := range c.Subscribe(sctx, stream, 0, client.StartAt{}) {
				if err != nil {
					t.Fatal(err)
				}
				if rec.Offset != uint64(n) {
					t.Fatalf("subscribe delivered %d, want %d", rec.Offset, n)
				}
				if n++; n == 10 {
					break
				}
			}
			if _, err := c.API().ListStreams(ctx, &geologv1.ListStreamsRequest{}); err != nil {
				t.Fatalf("API() after failover: %v", err)
			}
		})
	}
}

// TestClusterSubscribeResumesOnAnotherNode: the node serving a
// subscription dies; the subscription resumes at the next node, which is
// behind (frozen) and skipped, then at the one after, from the last
// delivered offset + 1, without a gap or a repeat.
func TestClusterSubscribeResumesOnAnotherNode(t *testing.T) {
	cl := startCluster(t, 3)
	cl.MustCreateStream("s", 1)
	c := newClient(t, cl.AddrList())
	p := newProducer(t, c, "s", client.ProducerRetryBackoff(time.Millisecond, 10*time.Millisecond))
	produceN(t, p, 0, 20)
	cl.Node(1).FreezeReads() // node 1 stops at 20
	produceN(t, p, 20, 80)

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	produced := make(chan error, 1)
	var next uint64
	for rec, err := range c.Subscribe(ctx, "s", 0, client.StartAt{}) {
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatalf("at %d: %v", next, err)
		}
		if rec.Offset != next || string(rec.Value) != strconv.FormatUint(next, 10) {
			t.Fatalf("got offset %d (%q), want %d", rec.Offset, rec.Value, next)
		}
		next++
		switch next {
		case 50:
			if cl.Node(0).Stats().Subscriptions != 1 {
				t.Fatal("the subscription did not start at node 0")
			}
			cl.Kill(0)
			cl.SetLeader(2)
			go func() {
				// More records while the subscription moves; the
				// producer moves too.
				var recs []*client.Record
				for i := 100; i < 150; i++ {
					recs = append(recs, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
				}
				_, err := p.ProduceSync(testCtx(t), recs...)
				produced <- err
			}()
		case 150:
			cancel()
		}
	}
	if next != 150 {
		t.Fatalf("stopped at %d", next)
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	if cl.Node(1).Stats().Subscriptions == 0 || cl.Node(2).Stats().Subscriptions == 0 {
		t.Fatalf("subscriptions per node: %d %d %d, want the lagging node 1 tried, then node 2",
			cl.Node(0).Stats().Subscriptions, cl.Node(1).Stats().Subscriptions, cl.Node(2).Stats().Subscriptions)
	}

	// A read with a minimum offset at the lagging node waits for it to
	// catch up.
	lagging := newClient(t, cl.Node(1).Addr())
	got := make(chan error, 1)
	go func() {
		r, err := lagging.Read(testCtx(t), "s", 0, 140, client.ReadOptions{Consistency: client.ConsistencyMinOffset, MinOffset: 150})
		if err == nil && (len(r.Records) != 10 || r.TailOffset != 150) {
			err = fmt.Errorf("read %d records, tail %d", len(r.Records), r.TailOffset)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("min-offset read returned before the node caught up: %v", err)
	case <-time.After(20 * time.Millisecond):
		// Not proof that it waits, but a read that does not wait
		// returns much sooner.
	}
	cl.Node(1).ThawReads()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestClusterAdminFailover: admin and read calls go to the next node while
// nodes die, come back to a restarted one, and fail (retriably) only when
// every node is down.
func TestClusterAdminFailover(t *testing.T) {
	cl := startCluster(t, 3)
	c := newClient(t, cl.AddrList())
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "a", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	produceN(t, newProducer(t, c, "a"), 0, 10)
	r := keyspace.RangeForKey([]byte("k"), 2)

	check := func(step string, wantStreams int, leader string) {
		t.Helper()
		list, err := c.ListStreams(ctx)
		if err != nil || len(list) != wantStreams {
			t.Fatalf("%s: list %v, %v", step, list, err)
		}
		d, err := c.DescribeStream(ctx, "a")
		if err != nil || d.Ranges[r].TailOffset != 10 || d.Ranges[r].Leader != leader {
			t.Fatalf("%s: describe %+v, %v", step, d, err)
		}
		res, err := c.Read(ctx, "a", r, 0, client.ReadOptions{})
		if err != nil || len(res.Records) != 10 {
			t.Fatalf("%s: read %+v, %v", step, res, err)
		}
	}
	check("all up", 1, cl.Node(0).Addr())

	cl.Kill(0)
	cl.SetLeader(1)
	check("node 0 down", 1, cl.Node(1).Addr())
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "b", RangeCount: 1}); err != nil {
		t.Fatalf("create with node 0 down: %v", err)
	}

	cl.Kill(1)
	cl.SetLeader(2)
	check("nodes 0 and 1 down", 2, cl.Node(2).Addr())

	if err := cl.Restart(0); err != nil {
		t.Fatal(err)
	}
	cl.Kill(2)
	cl.SetLeader(0)
	check("node 0 back, 1 and 2 down", 2, cl.Node(0).Addr())
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "c", RangeCount: 1}); err != nil {
		t.Fatalf("create at the restarted node: %v", err)
	}

	cl.Kill(0)
	short := newClient(t, cl.AddrList(), client.RetriesMax(3))
	_, err := short.ListStreams(ctx)
	if !client.IsRetriable(err) || client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("every node down: %v, want a retriable UNAVAILABLE", err)
	}
	_, err = short.CreateStream(ctx, client.StreamConfig{Name: "d", RangeCount: 1})
	if !client.IsRetriable(err) || client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("create with every node down: %v, want a retriable UNAVAILABLE", err)
	}
}

// TestClusterReadFollowsHint: a retriable read error with a leader hint
// sends the retry to the hinted node.
func TestClusterReadFollowsHint(t *testing.T) {
	cl := startCluster(t, 2)
	cl.MustCreateStream("s", 1)
	c := newClient(t, cl.Node(0).Addr())
	produceN(t, newProducer(t, c, "s"), 0, 5)
	cl.Node(0).SetReadFault(func(int64) error {
		e := apierr.New(apierr.NotLeader, "linearizable reads at the leader")
		e.LeaderHint = cl.Node(1).Addr()
		return e
	})
	r, err := c.Read(testCtx(t), "s", 0, 0, client.ReadOptions{Consistency: client.ConsistencyHome})
	if err != nil || len(r.Records) != 5 {
		t.Fatalf("read %+v, %v", r, err)
	}
	if !slices.Contains(c.Addrs(), cl.Node(1).Addr()) {
		t.Fatalf("hinted address not learned: %v", c.Addrs())
	}
}

func TestAddrLists(t *testing.T) {
	c, err := client.New(" 127.0.0.1:1, 127.0.0.1:2,,127.0.0.1:1", client.Addrs("127.0.0.1:3,127.0.0.1:2", "[::1]:4"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, want := c.Addrs(), []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "[::1]:4"}; !slices.Equal(got, want) {
		t.Fatalf("Addrs() = %v, want %v", got, want)
	}
	c2, err := client.New("", client.Addrs("127.0.0.1:5"))
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()

	var many []string
	for i := range client.AddrsMax + 1 {
		many = append(many, fmt.Sprintf("127.0.0.1:%d", 1000+i))
	}
	for _, bad := range []string{"", " , ", "127.0.0.1", "127.0.0.1:7400,nohost", "http://x:1", strings.Join(many, ",")} {
		if _, err := client.New(bad); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
	if _, err := client.New(strings.Join(many[:client.AddrsMax], ",")); err != nil {
		t.Errorf("%d addresses refused: %v", client.AddrsMax, err)
	}
}

// TestClusterCloseEndsEverything: Close on a client with producers and a
// subscription spread over several nodes returns, and later calls fail
// with ErrClosed.
func TestClusterCloseEndsEverything(t *testing.T) {
	cl := startCluster(t, 3)
	cl.MustCreateStream("s", 3)
	cl.SetRangeLeader("s", 1, 1)
	cl.SetRangeLeader("s", 2, 2)
	c, err := client.New(cl.AddrList(), client.Logger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if _, err := p.ProduceSync(ctx, keyedRecords(12, 2)...); err != nil {
		t.Fatal(err)
	}
	subErr := make(chan error, 1)
	go func() {
		for _, err := range c.Subscribe(ctx, "s", 0, client.StartAt{}) {
			if err != nil {
				subErr <- err
				return
			}
		}
	}()
	waitFor(t, "the subscription", func() bool { return sumStats(cl).Subscriptions > 0 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-subErr:
		if !errors.Is(err, client.ErrClosed) {
			t.Fatalf("subscription ended with %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("subscription did not end on Close")
	}
	if _, err := p.ProduceSync(ctx, &client.Record{Value: []byte("x")}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("produce after close: %v", err)
	}
}

// TestClusterProducerReturnsToRestartedNode: the leader dies, another
// leads, the dead node comes back and is elected again; the producer
// follows to it over a fresh connection.
func TestClusterProducerReturnsToRestartedNode(t *testing.T) {
	cl := startCluster(t, 3)
	cl.MustCreateStream("s", 1)
	c := newClient(t, cl.AddrList())
	p := newProducer(t, c, "s", client.ProducerRetryBackoff(time.Millisecond, 10*time.Millisecond))
	produceN(t, p, 0, 10)

	cl.Kill(0)
	cl.SetLeader(1)
	produceN(t, p, 10, 10)

	if err := cl.Restart(0); err != nil {
		t.Fatal(err)
	}
	cl.SetLeader(0)
	before := cl.Node(0).Stats().AppendRequests
	produceN(t, p, 20, 10)
	if cl.Node(0).Stats().AppendRequests == before {
		t.Fatal("the restarted leader got no appends")
	}
	for i, rec := range cl.Node(0).Records("s", 0) {
		if string(rec.GetValue()) != strconv.Itoa(i) {
			t.Fatalf("offset %d holds %q", i, rec.GetValue())
		}
	}
	if n := len(cl.Node(0).Records("s", 0)); n != 30 {
		t.Fatalf("log holds %d records", n)
	}
}

// TestClusterLeaseExpiredGoesBackToBootstrap: a range that followed a hint
// to another node (a home in another region) and is answered LEASE_EXPIRED
// there goes back to the client's own nodes, which redirect it to wherever
// the range went, instead of retrying the node that cannot renew its lease.
func TestClusterLeaseExpiredGoesBackToBootstrap(t *testing.T) {
	cl := startCluster(t, 3)
	cl.MustCreateStream("s", 1)
	cl.SetLeader(2) // node 0, the only one the client knows, redirects to 2
	c := newClient(t, cl.Node(0).Addr())
	p := newProducer(t, c, "s", client.ProducerRetryBackoff(time.Millisecond, 10*time.Millisecond))
	ctx := testCtx(t)
	produceN(t, p, 0, 10)
	if n := cl.Node(2).Stats().AppendRequests; n == 0 {
		t.Fatal("the producer never reached node 2 through the hint")
	}
	// Node 2 loses its lease; node 1 takes the range over.
	expired := apierr.New(apierr.LeaseExpired, "the home's lease may have expired")
	expired.Retriable = true
	cl.Node(2).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Err: expired} })
	cl.SetLeader(1)
	rs := newResults()
	for i := range 10 {
		p.Produce(ctx, &client.Record{Value: []byte(strconv.Itoa(10 + i))}, rs.cb(i))
	}
	rs.wait(t)
	if len(rs.errs) != 0 {
		t.Fatal(rs.errs)
	}
	if got := len(cl.Node(0).Records("s", 0)); got != 20 {
		t.Fatalf("log holds %d records, want 20", got)
	}
	if n := cl.Node(1).Stats().AppendRequests; n == 0 {
		t.Fatal("the records reached the new leader without it serving an append")
	}
}
