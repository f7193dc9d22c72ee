package client_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestAttemptTimeoutLeavesSilentLeader: a leader that stops answering (it
// appends the first batch and never replies, then holds every request, as
// a paused process does) holds the range's records only for the attempt
// timeout: the range resends to the next node, which the others elected
// meanwhile; the batch the silent node appended is answered as a
// duplicate with its original offset, and every record is in the log once.
// The records' delivery timeout is a minute: without the attempt deadline
// the test's 15-second wait for the acks fails.
func TestAttemptTimeoutLeavesSilentLeader(t *testing.T) {
	c := startCluster(t, 3)
	c.MustCreateStream("s", 1)
	cl := newClient(t, c.AddrList())
	p := newProducer(t, cl, "s", client.AppendAttemptTimeout(300*time.Millisecond), client.DeliveryTimeout(time.Minute))
	ctx := testCtx(t)
	warm := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("warm")}, warm.cb(0))
	warm.wait(t)

	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	c.Node(0).SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		if n == 1 {
			return clienttest.Fault{SkipReply: true} // appended, never answered
		}
		return clienttest.Fault{Hold: never}
	})
	rs := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("v0")}, rs.cb(0))
	waitFor(t, "the silent leader to append v0", func() bool { return len(c.Node(0).Records("s", 0)) == 2 })
	c.SetLeader(1) // the others elect node 1
	for i := 1; i < 4; i++ {
		p.Produce(ctx, &client.Record{Key: []byte("k"), Value: fmt.Appendf(nil, "v%d", i)}, rs.cb(i))
	}
	rs.wait(t)
	for i := range 4 {
		if err := rs.errs[i]; err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if got := rs.res[i].Offset; got != uint64(i+1) {
			t.Fatalf("record %d acked at offset %d, want %d", i, got, i+1)
		}
	}
	if !rs.res[0].Duplicate {
		t.Fatalf("the batch the silent leader appended was not answered as a duplicate: %+v", rs.res[0])
	}
	if n := len(c.Node(1).Records("s", 0)); n != 5 {
		t.Fatalf("the log holds %d records, want 5", n)
	}
}

// TestAttemptTimeoutOff: with AppendAttemptTimeout(0) a range waits on a
// silent leader (until the delivery timeout here), as before the option.
func TestAttemptTimeoutOff(t *testing.T) {
	c := startCluster(t, 2)
	c.MustCreateStream("s", 1)
	cl := newClient(t, c.AddrList())
	p := newProducer(t, cl, "s", client.AppendAttemptTimeout(0), client.DeliveryTimeout(time.Second))
	ctx := testCtx(t)
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	c.Node(0).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Hold: never} })
	c.SetLeader(1)
	rs := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("v")}, rs.cb(0))
	rs.wait(t)
	if rs.errs[0] == nil {
		t.Fatalf("acked through a silent leader with the attempt timeout off: %+v", rs.res[0])
	}
}

// TestAttemptTimeoutAvoidsSilentNode: after giving up on a silent node,
// a range does not go back to it within the attempt timeout, neither by
// the followers' hints (which still name it: no new leader yet) nor by
// the ring once the pool's short backoff for it has passed. Once another
// node leads, the records are acked there.
func TestAttemptTimeoutAvoidsSilentNode(t *testing.T) {
	c := startCluster(t, 3)
	c.MustCreateStream("s", 1)
	cl := newClient(t, c.AddrList())
	p := newProducer(t, cl, "s", client.AppendAttemptTimeout(2*time.Second), client.DeliveryTimeout(time.Minute))
	ctx := testCtx(t)
	warm := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("warm")}, warm.cb(0))
	warm.wait(t)
	streams0 := c.Node(0).Stats().AppendStreams

	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	c.Node(0).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Hold: never} })
	rs := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("v0")}, rs.cb(0))
	refusals := func() int64 { return c.Node(1).Stats().NotLeaderReplies + c.Node(2).Stats().NotLeaderReplies }
	waitFor(t, "the range to give up on node 0", func() bool { return refusals() > 0 })
	gaveUp := time.Now()
	// The followers answer NOT_LEADER naming node 0 again and again (the
	// client's backoff is at most 20 ms): four refusals take a small part
	// of the 2 s timeout, during which the range must not open a stream to
	// node 0 again. (On a machine too slow for four in 2 s the check is
	// skipped.)
	streams := func() int64 { return c.Node(0).Stats().AppendStreams }
	waitFor(t, "four refusals or a stream to node 0", func() bool { return refusals() >= 4 || streams() != streams0 })
	if n := streams(); n != streams0 && time.Since(gaveUp) < 2*time.Second {
		t.Fatalf("the range went back to the silent node within the attempt timeout (%d streams there, %d before)", n, streams0)
	}
	c.SetLeader(2)
	rs.wait(t)
	if err := rs.errs[0]; err != nil {
		t.Fatalf("record: %v", err)
	}
}

// TestCutOffLeaderNotFollowedBack: a leader that answers NOT_LEADER with
// leader_cut_off (it leads, but has heard from no quorum) is not where the
// range goes next, although its followers, which have not elected another
// leader yet, keep naming it; and while they elect, the range asks them
// again at its shortest backoff instead of a growing one, so that it finds
// the new leader soon after the election. Here the shortest backoff is
// 50 ms and the longest 5 s: twelve refusals take about 0.6 s paced and
// over 20 s with an exponential backoff; the test allows 15 s.
func TestCutOffLeaderNotFollowedBack(t *testing.T) {
	c := startCluster(t, 3)
	c.MustCreateStream("s", 1)
	cl := newClient(t, c.AddrList(), client.RetryBackoff(50*time.Millisecond, 5*time.Second))
	p := newProducer(t, cl, "s", client.AppendAttemptTimeout(time.Minute), client.DeliveryTimeout(2*time.Minute))
	ctx := testCtx(t)
	warm := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("warm")}, warm.cb(0))
	warm.wait(t)
	streams0 := c.Node(0).Stats().AppendStreams

	cutOff := apierr.New(apierr.NotLeader, "node 0 leads but has heard from no quorum")
	cutOff.LeaderCutOff = true
	c.Node(0).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Err: cutOff} })
	rs := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("v0")}, rs.cb(0))
	refusals := func() int64 { return c.Node(1).Stats().NotLeaderReplies + c.Node(2).Stats().NotLeaderReplies }
	waitFor(t, "a follower's refusal", func() bool { return refusals() > 0 })
	start := time.Now()
	waitFor(t, "twelve refusals", func() bool { return refusals() >= 12 })
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("twelve refusals took %v: the range backed off as if no election were under way", d)
	}
	if n := c.Node(0).Stats().AppendStreams; n != streams0 {
		t.Fatalf("the range went back to the cut-off leader: %d streams there, %d before the fault", n, streams0)
	}
	c.SetLeader(2)
	rs.wait(t)
	if err := rs.errs[0]; err != nil {
		t.Fatalf("record: %v", err)
	}
	if got := rs.res[0].Offset; got != 1 {
		t.Fatalf("acked at offset %d, want 1", got)
	}
}

// TestStaleNotHomeHintNotWaitedOn: while the home's other replicas elect a
// leader to replace a cut-off one, a mirror region's node answers NOT_HOME
// naming the cut-off leader (its view of the home is from before the
// fault). The range neither follows that hint nor keeps asking the mirror
// node at a growing backoff (it would sit there until the mirror heard of
// the new leader, or for seconds of backoff): it moves on along the ring
// and asks the home's follower and the mirror node in turn at the
// shortest backoff, 50 ms here (the longest is 5 s). Twelve requests to
// each take about 1.2 s paced; the test allows 15 s.
func TestStaleNotHomeHintNotWaitedOn(t *testing.T) {
	c := startCluster(t, 3)
	c.MustCreateStream("s", 1)
	cl := newClient(t, c.AddrList(), client.RetryBackoff(50*time.Millisecond, 5*time.Second))
	p := newProducer(t, cl, "s", client.AppendAttemptTimeout(time.Minute), client.DeliveryTimeout(2*time.Minute))
	ctx := testCtx(t)
	warm := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("warm")}, warm.cb(0))
	warm.wait(t)
	streams0 := c.Node(0).Stats().AppendStreams

	cutOff := apierr.New(apierr.NotLeader, "node 0 leads but has heard from no quorum")
	cutOff.LeaderCutOff = true
	c.Node(0).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Err: cutOff} })
	notHome := apierr.New(apierr.NotHome, "range 0 is homed in region us; region eu holds a read-only mirror")
	notHome.LeaderHint = c.Node(0).Addr()
	c.Node(1).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Err: notHome} })
	requests := func(i int) int64 { return c.Node(i).Stats().AppendRequests }
	base1, base2 := requests(1), requests(2)
	rs := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("v0")}, rs.cb(0))
	waitFor(t, "a request to the mirror node", func() bool { return requests(1) > base1 })
	start := time.Now()
	for time.Since(start) < 15*time.Second && (requests(1)-base1 < 12 || requests(2)-base2 < 12) {
		time.Sleep(10 * time.Millisecond)
	}
	if n1, n2 := requests(1)-base1, requests(2)-base2; n1 < 12 || n2 < 12 {
		t.Fatalf("in %v the mirror node got %d requests and the home's follower %d, want 12 each: the range waited on the stale NOT_HOME", time.Since(start), n1, n2)
	}
	if n := c.Node(0).Stats().AppendStreams; n != streams0 {
		t.Fatalf("the range followed the stale hint back to the cut-off leader: %d streams there, %d before the fault", n, streams0)
	}
	c.SetLeader(2)
	rs.wait(t)
	if err := rs.errs[0]; err != nil {
		t.Fatalf("record: %v", err)
	}
	if got := rs.res[0].Offset; got != 1 {
		t.Fatalf("acked at offset %d, want 1", got)
	}
}

// TestLeaseExpiredHomeNotReturnedTo: the home's leader (node 0) cannot
// renew its lease and answers LEASE_EXPIRED; the client's own nodes (1
// and 2, a mirror region: the only addresses it was given) answer
// NOT_HOME naming it until another region takes the range over. The
// range does not follow that hint back to the expired home (its mark
// lasts the attempt timeout, a minute here) and asks its own nodes at the
// shortest backoff (50 ms; the longest is a minute), so that it finds the
// new home as soon as they know it. The new home's first answer is
// PRODUCER_STATE_LOST (the takeover cut the producer's batches off): the
// range resends under a fresh id at once, not after the growing backoff
// of the retries before (a minute by then). Twelve requests to each of
// nodes 1 and 2 take about 1.2 s paced, the resend milliseconds; the
// test allows 15 s for each, a quarter of the backoff it must not wait.
func TestLeaseExpiredHomeNotReturnedTo(t *testing.T) {
	c := startCluster(t, 3)
	c.MustCreateStream("s", 1)
	c.SetLeader(0)
	cl := newClient(t, c.Node(1).Addr()+","+c.Node(2).Addr(), client.RetryBackoff(50*time.Millisecond, time.Minute))
	p := newProducer(t, cl, "s", client.AppendAttemptTimeout(time.Minute), client.DeliveryTimeout(5*time.Minute))
	ctx := testCtx(t)
	warm := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("warm")}, warm.cb(0))
	warm.wait(t)
	requests := func(i int) int64 { return c.Node(i).Stats().AppendRequests }
	base0, base1, base2 := requests(0), requests(1), requests(2)

	expired := apierr.New(apierr.LeaseExpired, "node 0 may serve until its lease's expiry; last heartbeat failed")
	expired.Retriable = true
	c.Node(0).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Err: expired} })
	notHome := apierr.New(apierr.NotHome, "range 0 is homed in region us (epoch 1); region eu holds a read-only mirror")
	notHome.LeaderHint = c.Node(0).Addr()
	for _, i := range []int{1, 2} {
		c.Node(i).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Err: notHome} })
	}
	rs := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("v0")}, rs.cb(0))
	waitFor(t, "the expired home's answer", func() bool { return requests(0) > base0 })
	start := time.Now()
	for time.Since(start) < 15*time.Second && (requests(1)-base1 < 12 || requests(2)-base2 < 12) {
		time.Sleep(10 * time.Millisecond)
	}
	if n1, n2 := requests(1)-base1, requests(2)-base2; n1 < 12 || n2 < 12 {
		t.Fatalf("in %v the client's nodes got %d and %d requests, want 12 each: the range backed off on the expired home's region", time.Since(start), n1, n2)
	}
	if n := requests(0) - base0; n != 1 {
		t.Fatalf("the expired home got %d requests, want 1: the range followed the stale NOT_HOME back to it", n)
	}

	// Region eu takes the range over: node 2 leads it, node 1 redirects
	// there, and node 2's first answer is PRODUCER_STATE_LOST.
	var lost atomic.Bool
	stateLost := apierr.New(apierr.ProducerStateLost, "this range holds no batch of the producer; a failover cut its last ones off")
	c.Node(2).SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault {
		if lost.CompareAndSwap(false, true) {
			return clienttest.Fault{Err: stateLost}
		}
		return clienttest.Fault{}
	})
	c.Node(1).SetAppendFault(nil)
	c.SetLeader(2)
	rs.wait(t)
	if err := rs.errs[0]; err != nil {
		t.Fatalf("record: %v", err)
	}
	if !lost.Load() {
		t.Fatal("the new home never answered PRODUCER_STATE_LOST: the test did not test the resend")
	}
	if got := rs.res[0].Offset; got != 1 {
		t.Fatalf("acked at offset %d, want 1", got)
	}
}
