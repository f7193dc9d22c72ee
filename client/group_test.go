package client_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
)

// produceN appends n keyed records to stream and waits for their acks.
func produceKeyed(t *testing.T, ctx context.Context, c *client.Client, stream string, from, n int) {
	t.Helper()
	p, err := c.NewProducer(stream)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for i := from; i < from+n; i++ {
		wg.Add(1)
		p.Produce(ctx, &client.Record{Key: fmt.Appendf(nil, "k%d", i%97), Value: fmt.Appendf(nil, "v%d", i)}, func(_ client.ProduceResult, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
}

// seen collects what the members of a group processed.
type seen struct {
	mu  sync.Mutex
	got map[string]int // value → times processed
	by  map[uint32]map[string]bool
}

func newSeen() *seen { return &seen{got: map[string]int{}, by: map[uint32]map[string]bool{}} }

func (s *seen) add(member string, rec client.StoredRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got[string(rec.Value)]++
	if s.by[rec.Range] == nil {
		s.by[rec.Range] = map[string]bool{}
	}
	s.by[rec.Range][member] = true
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// consume runs a member's Records loop until ctx ends.
func consume(ctx context.Context, g *client.GroupConsumer, s *seen, wg *sync.WaitGroup) {
	defer wg.Done()
	for rec, err := range g.Records(ctx) {
		if err != nil {
			return
		}
		s.add(g.MemberID(), rec)
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestGroupConsumer runs a group on one node: a member takes every range,
// a second joins and the ranges split without a range ever consumed by
// both at once, the first leaves and the second takes everything; every
// record is processed, and the committed positions cover them all.
func TestGroupConsumer(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c, err := client.New(n.Addr(), client.RetryBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "orders", RangeCount: 6}); err != nil {
		t.Fatal(err)
	}
	produceKeyed(t, ctx, c, "orders", 0, 600)
	s := newSeen()
	var assigned, revoked sync.Map
	opts := func(name string) []client.GroupOpt {
		return []client.GroupOpt{client.GroupMemberID(name), client.AutoCommitInterval(100 * time.Millisecond),
			client.OnAssigned(func(r []uint32) { assigned.Store(name, r) }),
			client.OnRevoked(func(r []uint32) { revoked.Store(name, r) })}
	}
	a, err := c.NewGroupConsumer("orders", "billing", opts("a")...)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	actx, acancel := context.WithCancel(ctx)
	wg.Add(1)
	go consume(actx, a, s, &wg)
	waitUntil(t, ctx, "a consumed everything", func() bool { return s.count() == 600 })
	if got := a.Assigned(); len(got) != 6 {
		t.Fatalf("a owns %v", got)
	}
	b, err := c.NewGroupConsumer("orders", "billing", opts("b")...)
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go consume(ctx, b, s, &wg)
	waitUntil(t, ctx, "the ranges split", func() bool { return len(a.Assigned()) == 3 && len(b.Assigned()) == 3 })
	if _, ok := revoked.Load("a"); !ok {
		t.Fatal("a's OnRevoked was not called")
	}
	for _, r := range a.Assigned() {
		if slices.Contains(b.Assigned(), r) {
			t.Fatalf("range %d owned by both", r)
		}
	}
	produceKeyed(t, ctx, c, "orders", 600, 600)
	waitUntil(t, ctx, "both consumed the new records", func() bool { return s.count() == 1200 })
	acancel()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "b takes every range", func() bool { return len(b.Assigned()) == 6 })
	produceKeyed(t, ctx, c, "orders", 1200, 300)
	waitUntil(t, ctx, "b consumed the rest", func() bool { return s.count() == 1500 })
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := c.DescribeGroup(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range d.Ranges {
		if r.LagRecords != 0 || !r.HasPosition || r.Owner != "b" {
			t.Fatalf("range %+v after b committed everything", r)
		}
	}
	if len(d.Members) != 1 || d.State != "stable" {
		t.Fatalf("group %+v", d)
	}
	b.Close()
	wg.Wait()
	// A plain cursor next to the group.
	res, err := c.CommitCursors(ctx, "device-1", client.CursorPosition{Stream: "orders", Range: 2, Offset: 5})
	if err != nil || !res[0].Applied {
		t.Fatalf("commit: %v %v", res, err)
	}
	ps, err := c.GetCursors(ctx, "device-1", "orders", client.ConsistencyHome)
	if err != nil || len(ps) != 1 || ps[0].Offset != 5 {
		t.Fatalf("get: %v %v", ps, err)
	}
	groups, err := c.ListGroups(ctx, "orders")
	if err != nil || len(groups) != 1 || groups[0].State != "empty" {
		t.Fatalf("groups: %v %v", groups, err)
	}
}

// TestGroupConsumerResumes: a member that processed part of the stream and
// closed is followed by another that starts at the committed positions
// (nothing before them again), and a reset moves the group back.
func TestGroupConsumerResumes(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c, err := client.New(n.Addr(), client.RetryBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "s", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	produceKeyed(t, ctx, c, "s", 0, 100)
	first := newSeen()
	g, err := c.NewGroupConsumer("s", "g")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	gctx, gcancel := context.WithCancel(ctx)
	wg.Add(1)
	go consume(gctx, g, first, &wg)
	waitUntil(t, ctx, "first member consumed", func() bool { return first.count() == 100 })
	gcancel()
	wg.Wait()
	g.Close() // commits and leaves
	produceKeyed(t, ctx, c, "s", 100, 50)
	second := newSeen()
	g2, err := c.NewGroupConsumer("s", "g", client.StartFrom(client.StartLatest))
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go consume(ctx, g2, second, &wg)
	waitUntil(t, ctx, "second member consumed the new records", func() bool { return second.count() == 50 })
	time.Sleep(200 * time.Millisecond)
	if second.count() != 50 {
		t.Fatalf("the second member processed %d records; the first had committed all but 50", second.count())
	}
	g2.Close()
	wg.Wait()
	// Reset to the earliest offsets: a third member processes everything.
	if _, err := c.ResetGroup(ctx, "g", "s", client.ResetToEarliest()); err != nil {
		t.Fatal(err)
	}
	third := newSeen()
	g3, err := c.NewGroupConsumer("s", "g")
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go consume(ctx, g3, third, &wg)
	waitUntil(t, ctx, "third member consumed everything after the reset", func() bool { return third.count() == 150 })
	g3.Close()
	wg.Wait()
}
