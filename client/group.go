package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
)

// GroupConsumer consumes a stream as a member of a consumer group: the
// group's coordinator assigns it ranges (moving as few as possible when
// members come and go, and handing a range over only once its previous
// owner released it), it fetches them, and commits the positions of the
// records processed. Delivery is at least once: a record is committed
// only after it was processed, so a member that dies redelivers, through
// the range's next owner, what it processed since its last commit.
//
//	g, err := c.NewGroupConsumer("orders", "billing")
//	defer g.Close()
//	for rec, err := range g.Records(ctx) {
//		if err != nil { ... break }
//		process(rec) // processed once the loop asks for the next record
//	}
//
// # Member contract
//
// One goroutine owns the membership (join, heartbeats, assignments):
//
//  1. It joins (member epoch 0), then heartbeats every interval the
//     coordinator gives (and at once after releasing ranges), reporting the
//     ranges it still owns.
//  2. On an assignment with new ranges it calls OnAssigned, then starts one
//     fetcher per range (a Fetch stream, at the committed position, else at
//     StartFrom's end), which feeds Records.
//  3. On an assignment without some of its ranges it stops their fetchers
//     (records of them not yet yielded are dropped), calls OnRevoked,
//     commits their processed positions, forgets them, and heartbeats.
//  4. It commits processed positions every AutoCommitInterval.
//  5. When the coordinator no longer knows it (UNKNOWN_MEMBER,
//     STALE_MEMBER_EPOCH), or it had no answer to a heartbeat for a session
//     timeout (measured from when that heartbeat was sent, so it stops
//     before the coordinator can give its ranges away), it stops every
//     fetcher, calls OnLost, and joins again as a new incarnation.
//  6. Close stops the fetchers, commits, and leaves the group (a static
//     member leaves temporarily, keeping its ranges for a session timeout).
//  7. A range that split ends once its records are delivered: the member
//     marks its split offset once every record it yielded of it is marked,
//     commits it and heartbeats; the coordinator then moves the group on to
//     the range's children, from offset 0 (splitread.go).
type GroupConsumer struct {
	c             *Client
	stream, group string
	cfg           groupConfig
	log           hclog.Logger

	deliveries   chan delivery
	heartbeatNow chan struct{}

	mu     sync.Mutex
	ranges map[uint32]*groupRange // owned
	epoch  uint64                 // member epoch; 0 while not a member
	fatal  error
	token  uint64 // counts range assignments

	commitMu sync.Mutex // one commit at a time

	ctx    context.Context
	cancel context.CancelFunc
	// leaving asks the membership goroutine to commit and leave (Close);
	// abandon to stop without either (Abandon).
	leaving, abandon bool
	done             chan struct{}
	closeOnce        sync.Once
}

// groupRange is one owned range.
type groupRange struct {
	rng        uint32
	token      uint64 // tells this ownership from an earlier one
	generation uint64 // the cursor's reset generation when assigned
	committed  uint64 // the position committed (or where fetching began)
	marked     uint64 // the offset after the last processed record
	markEpoch  uint64
	// yielded is the offset after the last record Records yielded; once
	// the range's end (a split) is delivered, ended is set and the split
	// offset is marked as soon as every yielded record is (splitread.go).
	yielded     uint64
	ended       bool
	splitOffset uint64
	cancel      context.CancelFunc
	fetched     chan struct{} // closed when its fetcher returns
}

// delivery is one fetched batch of a range, or its end (a split: ended,
// at splitOffset, after every record of the range was delivered).
type delivery struct {
	rng         uint32
	token       uint64
	recs        []StoredRecord
	ended       bool
	splitOffset uint64
}

// NewGroupConsumer returns a member of group consuming stream; it joins
// in the background and its Records start flowing once ranges are
// assigned. Close it when done.
func (c *Client) NewGroupConsumer(stream, group string, opts ...GroupOpt) (*GroupConsumer, error) {
	cfg := defaultGroupConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if stream == "" || group == "" {
		return nil, apierr.New(apierr.InvalidArgument, "a group consumer needs a stream and a group")
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &GroupConsumer{c: c, stream: stream, group: group, cfg: cfg,
		log:          c.log.Named("group").With("group", group, "member", cfg.memberID),
		deliveries:   make(chan delivery, cfg.bufferedBatchesMax),
		heartbeatNow: make(chan struct{}, 1),
		ranges:       map[uint32]*groupRange{}, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go g.run()
	return g, nil
}

// MemberID is the member's id.
func (g *GroupConsumer) MemberID() string { return g.cfg.memberID }

// MemberEpoch is the member's current epoch (0 while not a member).
func (g *GroupConsumer) MemberEpoch() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch
}

// Assigned returns the ranges the member owns now, sorted.
func (g *GroupConsumer) Assigned() []uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(maps.Keys(g.ranges))
}

// Records yields the records of the member's ranges as they are fetched,
// in offset order within each range. Unless ManualCommit is set, a record
// counts as processed once the loop asks for the next one (so a record
// the loop breaks on is not). The sequence ends after yielding one error:
// ctx's, ErrClosed after Close, or a final error of the group (for
// example a stream the group does not consume). Call it from one
// goroutine at a time.
func (g *GroupConsumer) Records(ctx context.Context) iter.Seq2[StoredRecord, error] {
	return func(yield func(StoredRecord, error) bool) {
		for {
			select {
			case d := <-g.deliveries:
				if d.ended {
					g.endRange(d.rng, d.token, d.splitOffset)
					continue
				}
				for _, rec := range d.recs {
					if !g.yielding(d.rng, d.token, rec) {
						break // revoked since it was fetched
					}
					if !yield(rec, nil) {
						return
					}
					if !g.cfg.manualCommit {
						g.mark(d.rng, d.token, rec)
					}
				}
			case <-ctx.Done():
				yield(StoredRecord{}, ctx.Err())
				return
			case <-g.ctx.Done():
				yield(StoredRecord{}, g.closedErr())
				return
			}
		}
	}
}

func (g *GroupConsumer) closedErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fatal != nil {
		return g.fatal
	}
	return ErrClosed
}

// current reports whether token is still the range's ownership.
func (g *GroupConsumer) current(rng uint32, token uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr, ok := g.ranges[rng]
	return ok && gr.token == token
}

// Mark marks rec processed: its position is committed by the next commit
// (Commit, or automatically). A record of a range the member no longer
// owns is ignored.
func (g *GroupConsumer) Mark(rec StoredRecord) {
	g.mu.Lock()
	gr, ok := g.ranges[rec.Range]
	g.mu.Unlock()
	if ok {
		g.mark(rec.Range, gr.token, rec)
	}
}

func (g *GroupConsumer) mark(rng uint32, token uint64, rec StoredRecord) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gr, ok := g.ranges[rng]; ok && gr.token == token && rec.Offset+1 > gr.marked {
		gr.marked, gr.markEpoch = rec.Offset+1, rec.Epoch
		gr.markEnd()
	}
}

// Commit commits the positions of the records processed so far, and
// returns once they are durable. An error means nothing was committed
// (the positions stay marked for the next commit).
func (g *GroupConsumer) Commit(ctx context.Context) error {
	return g.commit(ctx, nil)
}

// commit commits the processed positions of the given ranges (nil: all
// owned), serialised with every other commit.
func (g *GroupConsumer) commit(ctx context.Context, only []uint32) error {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	g.mu.Lock()
	epoch := g.epoch
	var ps []CursorPosition
	for rng, gr := range g.ranges {
		if gr.marked > gr.committed && (only == nil || slices.Contains(only, rng)) {
			ps = append(ps, CursorPosition{Stream: g.stream, Range: rng, Offset: gr.marked, Epoch: gr.markEpoch, Generation: gr.generation})
		}
	}
	g.mu.Unlock()
	if len(ps) == 0 || epoch == 0 {
		return nil
	}
	if _, err := g.c.commitCursors(ctx, g.group, g.cfg.memberID, epoch, ps); err != nil {
		switch CodeOf(err) {
		case CodeStaleMemberEpoch, CodeRangeNotAssigned, CodeUnknownMember:
			g.kick() // the assignment moved: learn it
		}
		return err
	}
	g.mu.Lock()
	for _, p := range ps {
		if gr, ok := g.ranges[p.Range]; ok && p.Offset > gr.committed {
			gr.committed = p.Offset
		}
	}
	g.mu.Unlock()
	return nil
}

// kick asks the membership goroutine for a heartbeat now.
func (g *GroupConsumer) kick() {
	select {
	case g.heartbeatNow <- struct{}{}:
	default:
	}
}

// Close stops fetching, commits what was processed, leaves the group and
// ends Records (with ErrClosed). It waits for the membership goroutine.
func (g *GroupConsumer) Close() error {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.leaving = true
		g.mu.Unlock()
		g.cancel()
	})
	<-g.done
	return nil
}

// Abandon stops the member as a crash would: no commit, no leave; the
// coordinator gives its ranges away once its session times out. For tests
// and tools that measure exactly that.
func (g *GroupConsumer) Abandon() {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.abandon = true
		g.mu.Unlock()
		g.cancel()
	})
	<-g.done
}

// fail ends the consumer with a final error.
func (g *GroupConsumer) fail(err error) {
	g.mu.Lock()
	if g.fatal == nil {
		g.fatal = err
	}
	g.mu.Unlock()
	g.log.Error("group consumer stopped", "error", err)
	g.cancel()
}

var errFenced = errors.New("client: fenced by the group's coordinator")

// fencedErr reports whether err means the coordinator does not know this
// incarnation of the member.
func fencedErr(err error) bool {
	c := CodeOf(err)
	return c == CodeUnknownMember || c == CodeStaleMemberEpoch
}

func (g *GroupConsumer) String() string {
	return fmt.Sprintf("member %s of group %s (%s)", g.cfg.memberID, g.group, g.stream)
}

// joinRequest is the member's join.
func (g *GroupConsumer) joinRequest() *geologv1.JoinGroupRequest {
	return &geologv1.JoinGroupRequest{Group: g.group, MemberId: g.cfg.memberID, InstanceId: g.cfg.instanceID, Stream: g.stream,
		SessionTimeoutMs: uint32(g.cfg.sessionTimeout.Milliseconds()), RebalanceTimeoutMs: uint32(g.cfg.rebalanceTimeout.Milliseconds())}
}

// heartbeatTimeout bounds one heartbeat (retries included): half the
// session, so that a slow coordinator (a heartbeat that grants or
// releases waits for an append) is waited for, and a second attempt still
// fits before the member fences itself.
func (g *GroupConsumer) heartbeatTimeout() time.Duration {
	return max(g.cfg.sessionTimeout/2, 200*time.Millisecond)
}
