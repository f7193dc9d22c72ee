package regionsvc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"github.com/hashicorp/go-hclog"
)

// groupHomedIn returns a group name whose cursor range is homed in region
// (the cursor stream spreads its homes over the sorted regions).
func groupHomedIn(regions []string, region string) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("billing-%d", i)
		r := keyspace.RangeForKey([]byte(name), cursorRangesDefault)
		if regions[int(r)%len(regions)] == region {
			return name
		}
	}
}

// processedLog is what a test's group members processed, per range.
type processedLog struct {
	mu    sync.Mutex
	first map[string]map[uint32]uint64 // member → range → first offset
	seen  map[uint32]map[uint64]bool
}

func newProcessedLog() *processedLog {
	return &processedLog{first: map[string]map[uint32]uint64{}, seen: map[uint32]map[uint64]bool{}}
}

func (p *processedLog) add(member string, rec client.StoredRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first[member] == nil {
		p.first[member] = map[uint32]uint64{}
	}
	if _, ok := p.first[member][rec.Range]; !ok {
		p.first[member][rec.Range] = rec.Offset
	}
	if p.seen[rec.Range] == nil {
		p.seen[rec.Range] = map[uint64]bool{}
	}
	p.seen[rec.Range][rec.Offset] = true
}

func (p *processedLog) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.seen {
		n += len(s)
	}
	return n
}

// runMember consumes as g until ctx ends, logging what it processed.
func runMember(ctx context.Context, g *client.GroupConsumer, log *processedLog, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rec, err := range g.Records(ctx) {
			if err != nil {
				return
			}
			log.add(g.MemberID(), rec)
		}
	}()
}

// TestGroupRegionFailover: a group consumes a stream homed in us, its
// coordinator (its cursor range) homed in us too. Every node of us is
// killed; eu takes the homes over (the stream's and the cursor range's),
// and a member started in eu joins the same group: once the dead member's
// session runs out at the new coordinator, it gets every range and
// resumes at the positions eu's copy of the cursor stream holds, which are
// those the dead member committed and us shipped before it died; it then
// processes every record of eu's copy from there. No commit in eu's log
// regresses or comes from an old incarnation.
func TestGroupRegionFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	regions := []string{"eu", "us"}
	w := newHomingWorld(t, regions, *homingRegionSize)
	createHomedStream(t, ctx, w.world, "orders", 4, "us")
	group := groupHomedIn(regions, "us")
	stop := make(chan struct{})
	var pwg sync.WaitGroup
	var acks ackLog
	produceLoop(t, ctx, w.world, "orders", "us", 100, stop, &acks, &pwg)

	us, err := client.New(w.regionAddrs("us"), client.RetryBackoff(10*time.Millisecond, 100*time.Millisecond),
		client.Logger(hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Info, Name: "member"})))
	if err != nil {
		t.Fatal(err)
	}
	defer us.Close()
	log := newProcessedLog()
	a, err := us.NewGroupConsumer("orders", group, client.GroupMemberID("a"), client.SessionTimeout(2*time.Second),
		client.AutoCommitInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var mwg sync.WaitGroup
	actx, acancel := context.WithCancel(ctx)
	runMember(actx, a, log, &mwg)
	// Generous: on a loaded machine the lease store can stall for tens of
	// seconds, and nothing is admitted meanwhile.
	waitUntil(t, ctx, 2*time.Minute, "a processed records", func() bool {
		if n := log.count(); n < 300 {
			acks.mu.Lock()
			t.Logf("a processed %d records of %d acked, owns ranges %v", n, len(acks.acks), a.Assigned())
			acks.mu.Unlock()
			time.Sleep(time.Second)
			return false
		}
		return true
	})
	// Let a commit, and us ship it, before the region dies.
	time.Sleep(500 * time.Millisecond)
	close(stop)
	pwg.Wait()
	for id := range w.nodes["us"] {
		w.stop("us", id)
	}
	acancel()
	mwg.Wait()
	a.Abandon()
	t.Logf("killed us after a processed %d records", log.count())

	cr := keyspace.RangeForKey([]byte(group), cursorRangesDefault)
	waitUntil(t, ctx, time.Minute, "eu homes the stream and the cursor range", func() bool {
		home, _ := rangeHome(ctx, w.world, "eu", cursorStreamName, cr)
		if home != "eu" {
			return false
		}
		for r := uint32(0); r < 4; r++ {
			if h, _ := rangeHome(ctx, w.world, "eu", "orders", r); h != "eu" {
				return false
			}
		}
		return true
	})
	eu, err := client.New(w.regionAddrs("eu"), client.RetryBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer eu.Close()
	var positions []client.CursorPosition
	waitUntil(t, ctx, time.Minute, "the cursor at eu's coordinator", func() bool {
		positions, err = eu.GetCursors(ctx, group, "orders", client.ConsistencyHome)
		return err == nil
	})
	if len(positions) == 0 {
		t.Fatal("eu's copy of the cursor stream holds no position of the group: nothing was shipped before us died")
	}
	b, err := eu.NewGroupConsumer("orders", group, client.GroupMemberID("b"), client.SessionTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	runMember(ctx, b, log, &mwg)
	tails := euTails(t, ctx, w, "orders", 4)
	waitUntil(t, ctx, time.Minute, "b processed eu's copy to its tail", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		for r, tail := range tails {
			from := startOf(positions, r)
			for off := from; off < tail; off++ {
				if !log.seen[r][off] {
					return false
				}
			}
		}
		return true
	})
	log.mu.Lock()
	for r := range tails {
		first, ok := log.first["b"][r]
		if want := startOf(positions, r); ok && first != want {
			t.Errorf("range %d: b started at %d, the group's position at eu is %d", r, first, want)
		}
	}
	log.mu.Unlock()
	t.Logf("b resumed at %v", positions)
	checkRegionCursorLog(t, ctx, w, "eu", cr)
}

func startOf(ps []client.CursorPosition, r uint32) uint64 {
	for _, p := range ps {
		if p.Range == r {
			return p.Offset
		}
	}
	return 0
}

// euTails reads each range's committed tail on region's copy.
func euTails(t *testing.T, ctx context.Context, w *homingWorld, stream string, ranges uint32) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for _, c := range w.conns["eu"] {
		for r := uint32(0); r < ranges; r++ {
			resp, err := c.Read(ctx, &geologv1.ReadRequest{Stream: stream, Range: r, MaxRecords: 1})
			if err != nil {
				t.Fatal(err)
			}
			out[r] = resp.TailOffset
		}
		break
	}
	return out
}

// checkRegionCursorLog runs cursors.CheckLog on a region's copy of one
// cursor range.
func checkRegionCursorLog(t *testing.T, ctx context.Context, w *homingWorld, region string, r uint32) {
	for _, c := range w.conns[region] {
		var recs []cursors.Record
		for from := uint64(0); ; {
			resp, err := c.Read(ctx, &geologv1.ReadRequest{Stream: cursorStreamName, Range: r, FromOffset: from})
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range resp.Records {
				recs = append(recs, cursors.Record{Key: rec.Key, Value: rec.Value, Tombstone: rec.Tombstone})
			}
			if resp.NextOffset >= resp.TailOffset {
				break
			}
			from = resp.NextOffset
		}
		for _, v := range cursors.CheckLog(recs) {
			t.Errorf("%s's cursor range %d: %v", region, r, v)
		}
		t.Logf("%s's cursor range %d: %d records checked", region, r, len(recs))
		return
	}
}

// TestCursorOrphansMergedBack: a commit acknowledged by the home of a
// cursor range and never shipped (us cut off, then killed) is missing at
// the new home (eu), which moves on; when us returns, its copy forks, the
// commit lands in its orphan log, and us merges it back: the cursor rises
// to it at eu (it was above what eu held), and eu's log stays clean.
func TestCursorOrphansMergedBack(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	regions := []string{"eu", "us"}
	w := newHomingWorld(t, regions, *homingRegionSize)
	createHomedStream(t, ctx, w.world, "chat", 1, "us")
	cursor := groupHomedIn(regions, "us")
	us := regionClient(t, w, "us")
	eu := regionClient(t, w, "eu")
	p, err := us.NewProducer("chat")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		p.Produce(ctx, &client.Record{Value: []byte("m")}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close()
	commitAt := func(c *client.Client, off uint64) {
		t.Helper()
		waitUntil(t, ctx, time.Minute, fmt.Sprintf("commit %d", off), func() bool {
			_, err := c.CommitCursors(ctx, cursor, client.CursorPosition{Stream: "chat", Range: 0, Offset: off})
			return err == nil
		})
	}
	positionAt := func(c *client.Client, consistency client.Consistency) uint64 {
		ps, err := c.GetCursors(ctx, cursor, "chat", consistency)
		if err != nil || len(ps) == 0 {
			return 0
		}
		return ps[0].Offset
	}
	commitAt(us, 10)
	waitUntil(t, ctx, time.Minute, "eu's copy has the commit", func() bool { return positionAt(eu, client.ConsistencyLocal) == 10 })
	var cut []*wan.Link
	for _, l := range w.net.Links() {
		if l.From() == "us" && l.To() == "eu" {
			// A reset cut: a blackholed link would deliver what it held
			// once healed.
			if err := l.Cut(wan.CutReset); err != nil {
				t.Fatal(err)
			}
			cut = append(cut, l)
		}
	}
	commitAt(us, 50) // acknowledged by us, never shipped
	for id := range w.nodes["us"] {
		w.stop("us", id)
	}
	for _, l := range cut {
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	cr := keyspace.RangeForKey([]byte(cursor), cursorRangesDefault)
	waitUntil(t, ctx, time.Minute, "eu homes the cursor range", func() bool {
		home, epoch := rangeHome(ctx, w.world, "eu", cursorStreamName, cr)
		return home == "eu" && epoch >= 2
	})
	if got := positionAt(eu, client.ConsistencyHome); got != 10 {
		t.Fatalf("eu holds %d before us returns, want the shipped 10", got)
	}
	commitAt(eu, 30) // the new home moves on
	for id := uint64(1); id <= uint64(w.size); id++ {
		w.start("us", id)
	}
	waitUntil(t, ctx, 2*time.Minute, "the stranded commit merged back", func() bool { return positionAt(eu, client.ConsistencyHome) == 50 })
	checkRegionCursorLog(t, ctx, w, "eu", cr)
}

func regionClient(t *testing.T, w *homingWorld, region string) *client.Client {
	c, err := client.New(w.regionAddrs(region), client.RetryBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
