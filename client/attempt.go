package client

import (
	"time"

	"github.com/geolog/geolog/apierr"
)

// The append attempt deadline (AppendAttemptTimeout): a range whose append
// stream has batches in flight and has answered nothing for the attempt
// timeout gives up on that node as for a connection that failed, instead
// of waiting for the connection's keepalive to notice (tens of seconds): a
// leader that is paused (SIGSTOP, a long GC or VM pause) or cut off from
// its followers answers nothing, while the others elect a new leader in
// about a second.
//
// The deadline runs from the later of the oldest unanswered batch's send
// and the stream's last reply (a stream that answers is alive, however
// slowly its batches commit), plus attemptAllowancePerMiB per MiB of that
// batch (a large batch on a slow link takes time to arrive). When it
// passes, the range marks the node down in the pool, forgets it as the
// range's leader, resends every unacknowledged batch (same producer id and
// sequences: the range answers a batch it already has as a duplicate, with
// its original offsets) at once to the next address, and for the attempt
// timeout follows no leader hint back to that node (a follower that has
// not noticed yet would send it straight back).

// AppendAttemptTimeoutDefault is AppendAttemptTimeout's default.
const AppendAttemptTimeoutDefault = time.Second

// attemptAllowancePerMiB lengthens the attempt deadline per MiB of the
// oldest unanswered batch.
const attemptAllowancePerMiB = time.Second

// attemptTimeoutCapped is the producer's attempt timeout, capped at its delivery
// timeout; 0: off.
func (c *producerConfig) attemptTimeoutCapped() time.Duration {
	t := c.attemptTimeout
	if c.deliveryTimeout > 0 && t > c.deliveryTimeout {
		t = c.deliveryTimeout
	}
	return t
}

// attemptDue returns when the current stream's attempt deadline passes, or
// the zero time if none runs (off, no open stream, nothing in flight).
func (d *rangeDriver) attemptDue() time.Time {
	timeout := d.p.cfg.attemptTimeoutCapped()
	c := d.conn
	if timeout <= 0 || c == nil || c.stream == nil || c.broken {
		return time.Time{}
	}
	for _, b := range d.batches {
		if b.requestID == 0 || b.resp != nil {
			continue
		}
		from := b.sentAt
		if c.lastReply.After(from) {
			from = c.lastReply
		}
		return from.Add(timeout + time.Duration(int64(attemptAllowancePerMiB)*int64(b.sizeBytes)>>20))
	}
	return time.Time{}
}

// checkAttempt gives up on the current node once the attempt deadline
// passed (see the comment at the top of this file).
func (d *rangeDriver) checkAttempt(now time.Time) {
	due := d.attemptDue()
	if due.IsZero() || now.Before(due) {
		return
	}
	timeout := d.p.cfg.attemptTimeoutCapped()
	from := d.conn.addr // attemptDue found a stream
	pool := d.p.c.pool
	pool.failed(from)
	pool.forgetLeader(d.p.stream, d.rng, from)
	d.markUnresponsive(from, now)
	d.addr = d.nextAddr(from)
	e := apierr.New(apierr.Timeout, "no reply from %s within the append attempt timeout (%v): resending to %s", from, timeout, d.addr)
	d.log.Debug("append attempt timed out", "from", from, "to", d.addr, "inflight_batches", len(d.batches))
	d.rewind(e)
	d.backoffUntil = time.Time{} // another node: no reason to wait
}

// givenUpMax bounds the addresses a range remembers giving up on.
const givenUpMax = 8

// markUnresponsive records addr as an address the range gave up on for
// want of a reply (or because it leads cut off from its followers, or its
// home's lease expired), for the attempt timeout from now
// (AppendAttemptTimeoutDefault when off).
func (d *rangeDriver) markUnresponsive(addr string, now time.Time) {
	timeout := d.p.cfg.attemptTimeoutCapped()
	if timeout <= 0 {
		timeout = AppendAttemptTimeoutDefault
	}
	if d.givenUp == nil {
		d.givenUp = make(map[string]time.Time, 1)
	}
	soonest := ""
	for a, until := range d.givenUp {
		if !now.Before(until) {
			delete(d.givenUp, a)
		} else if soonest == "" || until.Before(d.givenUp[soonest]) {
			soonest = a
		}
	}
	if _, ok := d.givenUp[addr]; !ok && len(d.givenUp) >= givenUpMax {
		delete(d.givenUp, soonest)
	}
	d.givenUp[addr] = now.Add(timeout)
}

// givingUp reports whether the range gave up on some address within the
// attempt timeout before now.
func (d *rangeDriver) givingUp(now time.Time) bool {
	for _, until := range d.givenUp {
		if now.Before(until) {
			return true
		}
	}
	return false
}

// electing says whether the range's last error, err, is a NOT_LEADER or a
// NOT_HOME while it has given up on its leader (isUnresponsive): the other
// replicas are electing a new one, which takes about an election timeout,
// so the range asks them again at the shortest backoff rather than a
// growing one (an exponential backoff would overshoot the election by up
// to as long again). A mirror region's node redirects to the home leader
// it heard of last, so its NOT_HOME is part of the same search.
func (d *rangeDriver) electing(err error) bool {
	e := apierr.As(err)
	return e != nil && (e.Code == apierr.NotLeader || e.Code == apierr.NotHome) && d.givingUp(time.Now())
}

// staleNotHome says whether e is a NOT_HOME whose hint names the address
// the range gave up on (isUnresponsive): the mirror region's view of the
// home's leader predates the election under way, so asking that node
// again brings nothing new until the home's next heartbeat reaches it.
func (d *rangeDriver) staleNotHome(e *Error, from string) bool {
	return e.Code == apierr.NotHome && d.isUnresponsive(leaderHint(e, from))
}

// isUnresponsive says whether addr is an address the range gave up on
// (markUnresponsive) within the attempt timeout.
func (d *rangeDriver) isUnresponsive(addr string) bool {
	until, ok := d.givenUp[addr]
	return addr != "" && ok && time.Now().Before(until)
}

// usableHint is the leader hint of e (leaderHint), unless it names the
// address the range gave up on as unresponsive (isUnresponsive).
func (d *rangeDriver) usableHint(e *Error, from string) string {
	if hint := leaderHint(e, from); !d.isUnresponsive(hint) {
		return hint
	}
	return ""
}

// skipUnresponsive returns addr, or the ring's first address after it
// that the range did not give up on (the pool marks an address down only
// for a short backoff, after which the ring would lead straight back to
// it); if it gave up on every one it passes, the last.
func (d *rangeDriver) skipUnresponsive(addr string) string {
	for i := 0; i < givenUpMax && d.isUnresponsive(addr); i++ {
		addr = d.p.c.pool.next(addr)
	}
	return addr
}
