package regionsvc

import (
	"context"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// replyBytesHeld is what a read reply of maxBytes holds while it is read
// and sent: the frames read (the records alias them) and the encoded reply.
func replyBytesHeld(maxBytes int) int64 { return 2 * int64(maxBytes) }

// holdReadReply holds a read's reply bytes of the read budget until the
// RPC ends, or refuses the read with OVERLOADED (its principal over quota,
// or the node sending too much already).
func (n *Node) holdReadReply(ctx context.Context, maxBytes int) error {
	l := n.limits
	p := l.quotas.principal(ctx)
	if wait := l.quotas.take(p, 0, 0); wait > 0 {
		return l.overloaded(ctx, "quota", wait, "%s is over its quota; retry in %v", p, wait)
	}
	h := holdOf(ctx)
	if h == nil {
		return nil // an in-process call
	}
	bytes := replyBytesHeld(maxBytes)
	if !l.reads.tryAcquire(bytes) {
		return l.overloaded(ctx, "reads", jittered(overloadRetryAfter), "node is sending %d bytes of reads", l.reads.inUse())
	}
	if !h.keep(l.reads, bytes) {
		l.reads.release(bytes)
		return apierr.New(apierr.Timeout, "read ended")
	}
	return nil
}

// recordBytes is the key and value bytes of recs (what a read's quota
// counts).
func recordBytes(recs []*geologv1.StoredRecord) int64 {
	var n int64
	for _, r := range recs {
		n += int64(len(r.GetKey()) + len(r.GetValue()))
	}
	return n
}

// subscribe serves a subscription: it reads the range from the start the
// request names and sends what is committed, then follows the tail.
// Each message holds its bytes of the node's read budget from its read
// until it is sent (the budget may make it wait up to
// SubscriberSendTimeout); a subscriber that does not take a message in
// that time is cut off with SLOW_CONSUMER. A message waits for its
// principal's byte quota rather than fail.
func (n *Node) subscribe(req *geologv1.SubscribeRequest, stream geologv1.Log_SubscribeServer) error {
	ctx := stream.Context()
	rd, err := n.readRangeOf(ctx, req.GetStream(), req.GetRange(), req.Key)
	if err != nil {
		return err
	}
	next, err := subscribeStart(rd, req)
	if err != nil {
		return err
	}
	_, maxBytes := clampRead(0, req.GetMaxBytes())
	send := newSubscriptionSender(stream)
	defer send.close()
	send.cutOff = func() {
		n.limits.count("slow_consumer")
		n.metrics.overloads.Add(ctx, 1, limitAttr("slow_consumer"))
	}
	timeout := n.cfg.Limits.SubscriberSendTimeout
	principal := n.limits.quotas.principal(ctx)
	var behind time.Time // since when next is past the servable end
	for {
		// A replica that left the range's group (or never was in it)
		// ends the subscription: its copy no longer grows.
		if err := rd.readable(); err != nil {
			return err
		}
		if err := n.waitQuota(ctx, principal); err != nil {
			return err
		}
		changed := rd.changed()
		release, err := n.limits.holdRead(ctx, replyBytesHeld(maxBytes), timeout)
		if err != nil {
			return err
		}
		lim := readLimits{maxRecords: readRecordsDefault, maxBytes: maxBytes, frames: req.GetWantFrames()}
		out, nx, wait, err := subscribeRead(rd, req.Key, next, lim, &behind)
		if err != nil {
			release()
			return err
		}
		if out.count == 0 && req.Key != nil {
			// A read by key skipped other keys' records: its subscriber
			// hears of its key only.
			next = max(next, nx)
		}
		if nx > next {
			// Records, or holes only (compaction by key): either way the
			// subscriber learns where to resume.
			from := next
			next = nx
			n.limits.quotas.charge(principal, out.quotaBytes())
			msg := &geologv1.SubscribeResponse{Records: out.recs, Frames: out.frames, NextOffset: next, TailOffset: rd.readTail()}
			if err := send.send(ctx, msg, from, release, timeout); err != nil {
				return err
			}
			continue
		}
		release()
		select {
		case <-changed:
		case <-wait:
		case <-ctx.Done():
			return apierr.As(ctx.Err())
		case <-n.closing:
			return apierr.New(apierr.ShuttingDown, "node is shutting down")
		}
	}
}

// subscribeRead reads a subscription's next message from next on. A read
// past what this copy serves (it lags, or fences off a divergent tail) is
// waited out for a while (subscribeWait): nothing is read, and wait fires
// when to look again.
func subscribeRead(rd *rangeDriver, key []byte, next uint64, lim readLimits, behind *time.Time) (out readOut, nx uint64, wait <-chan time.Time, err error) {
	out, nx, err = rd.read(key, next, lim)
	if rpcerr.CodeOf(err) != apierr.PastLocalTail {
		*behind = time.Time{}
		return out, nx, nil, err
	}
	left, err := rd.subscribeWait(next, behind)
	if err != nil || left <= 0 {
		return readOut{}, next, nil, err
	}
	return readOut{}, next, time.After(left), nil
}

// subscribeStart is the first offset a subscription sends.
func subscribeStart(rd *rangeDriver, req *geologv1.SubscribeRequest) (uint64, error) {
	switch start := req.GetStart().(type) {
	case *geologv1.SubscribeRequest_FromOffset:
		return start.FromOffset, nil
	case *geologv1.SubscribeRequest_FromTimeUnixNanos:
		return rd.offsetForTime(start.FromTimeUnixNanos)
	default:
		return 0, nil
	}
}

// waitQuota waits while principal's quota is spent.
func (n *Node) waitQuota(ctx context.Context, principal string) error {
	for {
		wait := n.limits.quotas.take(principal, 0, 0)
		if wait <= 0 {
			return nil
		}
		if err := backoff.Sleep(ctx, wait); err != nil {
			return apierr.As(err)
		}
	}
}

// subscriptionSender sends a subscription's messages on a goroutine of its
// own, so that the handler can stop waiting for a subscriber that does not
// read: Send blocks once the subscriber's flow-control window is full, and
// returns only when the subscriber reads or the RPC ends. The goroutine
// ends with the RPC (when the handler returns, gRPC ends the stream, and a
// Send in progress returns).
type subscriptionSender struct {
	msgs chan subscriptionMsg
	sent chan error // one per message
	// cutOff, if set, is called when the subscriber is cut off.
	cutOff func()
}

type subscriptionMsg struct {
	resp    *geologv1.SubscribeResponse
	release func()
}

func newSubscriptionSender(stream geologv1.Log_SubscribeServer) *subscriptionSender {
	s := &subscriptionSender{msgs: make(chan subscriptionMsg), sent: make(chan error, 1)}
	go func() {
		// Send returns once gRPC queued the message (its write quota is
		// far smaller than a message), not once it is on the wire: a
		// message holds its budget until the next Send returns (gRPC
		// then wrote all but the quota of it), or until the RPC ends
		// (gRPC then drops what it still queued).
		prev := func() {}
		defer func() { prev() }()
		for m := range s.msgs {
			err := stream.Send(m.resp)
			prev()
			prev = m.release
			s.sent <- err
		}
	}()
	return s
}

// send hands msg, read from offset from, over and waits until it is sent
// or timeout passes (the subscriber is then too slow).
func (s *subscriptionSender) send(ctx context.Context, msg *geologv1.SubscribeResponse, from uint64, release func(), timeout time.Duration) error {
	s.msgs <- subscriptionMsg{resp: msg, release: release}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-s.sent:
		return err
	case <-t.C:
		if s.cutOff != nil {
			s.cutOff()
		}
		e := apierr.New(apierr.SlowConsumer, "the subscriber took no message for %v; subscribe again from offset %d", timeout, from)
		e.RetryAfter = overloadRetryAfter
		return e
	case <-ctx.Done():
		return apierr.As(ctx.Err())
	}
}

// close ends the goroutine once its message in progress, if any, is done.
func (s *subscriptionSender) close() { close(s.msgs) }
