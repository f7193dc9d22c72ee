package client_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// keyLog collects the values of each key a reader received, in the order
// received.
type keyLog struct {
	mu     sync.Mutex
	values map[string][]int
	ranges map[uint32]int // records per range
	total  int
}

func newKeyLog() *keyLog { return &keyLog{values: map[string][]int{}, ranges: map[uint32]int{}} }

func (l *keyLog) add(rec client.StoredRecord) {
	v, err := strconv.Atoi(strings.TrimPrefix(string(rec.Value), "v-"))
	if err != nil {
		panic(fmt.Sprintf("value %q", rec.Value))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.values[string(rec.Key)] = append(l.values[string(rec.Key)], v)
	l.ranges[rec.Range]++
	l.total++
}

func (l *keyLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// distinct is the number of distinct (key, value) pairs received.
func (l *keyLog) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, vs := range l.values {
		seen := map[int]bool{}
		for _, v := range vs {
			seen[v] = true
		}
		n += len(seen)
	}
	return n
}

// check requires every value 0..rounds-1 of each of keys, with each
// value's first receipt in order (per-key order, no gap); exactly once
// if once. It returns how many receipts were repeats.
func (l *keyLog) check(t *testing.T, what string, keys []string, rounds int, once bool) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	repeats := 0
	for _, k := range keys {
		next := 0 // the value expected first next
		for _, v := range l.values[k] {
			switch {
			case v == next:
				next++
			case v < next && !once:
				repeats++ // redelivered (at least once)
			default:
				t.Fatalf("%s: key %s got v-%d after %v: out of order, lost or twice", what, k, v, l.values[k][:min(len(l.values[k]), 40)])
			}
		}
		if next != rounds {
			t.Fatalf("%s: key %s got values up to v-%d, want up to v-%d", what, k, next-1, rounds-1)
		}
	}
	if len(l.values) != len(keys) {
		t.Fatalf("%s: %d keys received, want %d", what, len(l.values), len(keys))
	}
	return repeats
}

// TestNodeReadersAcrossSplit: a keyed producer writes to a real node
// while range 1 of the stream splits (Admin.SplitRange), and readers
// follow it from the start, concurrently: a subscriber of range 1, a
// subscriber of one of its keys, and a consumer group of two members on
// the whole stream; a second group starts once everything is written.
// The subscriber gets every record of range 1's keys exactly once, in
// per-key order: the parent up to its split offset, then the children (it
// follows the parent's end, RANGE_SPLIT naming the children); the key's
// subscriber its key's records, exactly once, in order. Each group gets every record of every key, each key's records in order
// with no gap (at least once: a repeat only ever re-delivers a key's
// earlier record; the late group shows disorder if a child is handed out
// before the parent is finished), and its committed cursors end at the
// split offset for the parent and at the tail of every other range.
func TestNodeReadersAcrossSplit(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, n.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "sr", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	const keys, rounds = 16, 150
	var all, ofRange1 []string
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("key-%d", k)
		all = append(all, key)
		if keyspace.RangeForKey([]byte(key), 2) == 1 {
			ofRange1 = append(ofRange1, key)
		}
	}
	sub, group := newKeyLog(), newKeyLog()
	var wg sync.WaitGroup
	rctx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rec, err := range c.Subscribe(rctx, "sr", 1, client.StartAt{}) {
			if err != nil {
				if rctx.Err() == nil {
					t.Errorf("subscription: %v", err)
				}
				return
			}
			sub.add(rec)
		}
	}()
	// A subscriber of one key of range 1 follows the child that owns it.
	byKey := newKeyLog()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rec, err := range c.SubscribeKey(rctx, "sr", 1, []byte(ofRange1[0]), client.StartAt{}) {
			if err != nil {
				if rctx.Err() == nil {
					t.Errorf("key subscription: %v", err)
				}
				return
			}
			byKey.add(rec)
		}
	}()
	members := startSplitGroup(t, rctx, c, "g", group, &wg)

	resp := produceAcrossSplit(t, ctx, c, n.Addr(), keys, rounds)
	// A second group starts once everything is written: the parent's
	// records and the children's are all there to fetch at once, so a
	// child handed out before the parent is finished shows as disorder.
	late := newKeyLog()
	lateMembers := startSplitGroup(t, rctx, c, "late", late, &wg)
	waitUntil(t, ctx, "the subscriber read range 1's keys", func() bool { return sub.count() >= len(ofRange1)*rounds })
	waitUntil(t, ctx, "the groups read every key", func() bool {
		return group.distinct() >= keys*rounds && late.distinct() >= keys*rounds
	})
	time.Sleep(200 * time.Millisecond) // a record past the expected ones would show now
	waitUntil(t, ctx, "the key subscriber read its key", func() bool { return byKey.count() >= rounds })
	sub.check(t, "subscriber", ofRange1, rounds, true)
	byKey.check(t, "key subscriber", ofRange1[:1], rounds, true)
	if sub.ranges[2]+sub.ranges[3] == 0 || sub.ranges[0] != 0 {
		t.Fatalf("subscriber's records by range: %v", sub.ranges)
	}
	repeats := group.check(t, "group", all, rounds, false)
	lateRepeats := late.check(t, "late group", all, rounds, false)
	t.Logf("split at offset %d; subscriber %v; key subscriber %v; group %v, %d repeats; late group %v, %d repeats",
		resp.GetSplitOffset(), sub.ranges, byKey.ranges, group.ranges, repeats, late.ranges, lateRepeats)
	checkGroupCursors(t, ctx, c, "g", resp.GetSplitOffset(), members)
	checkGroupCursors(t, ctx, c, "late", resp.GetSplitOffset(), lateMembers)
	stopReaders()
	wg.Wait()
}

// startSplitGroup starts two members of group name on stream "sr",
// feeding l until ctx ends.
func startSplitGroup(t *testing.T, ctx context.Context, c *client.Client, name string, l *keyLog, wg *sync.WaitGroup) []*client.GroupConsumer {
	t.Helper()
	var out []*client.GroupConsumer
	for _, id := range []string{"a", "b"} {
		g, err := c.NewGroupConsumer("sr", name, client.GroupMemberID(id), client.AutoCommitInterval(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		out = append(out, g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rec, err := range g.Records(ctx) {
				if err != nil {
					return
				}
				l.add(rec)
			}
		}()
	}
	return out
}

// checkGroupCursors: once the members commit, group's cursor on range 1
// is its split offset and on each other range its tail.
func checkGroupCursors(t *testing.T, ctx context.Context, c *client.Client, group string, split uint64, members []*client.GroupConsumer) {
	t.Helper()
	tails := map[uint32]uint64{1: split}
	for _, r := range []uint32{0, 2, 3} {
		rr, err := c.Read(ctx, "sr", r, 0, client.ReadOptions{MaxRecords: 1})
		if err != nil {
			t.Fatal(err)
		}
		tails[r] = rr.TailOffset
	}
	waitUntil(t, ctx, "the group's cursors at the tails", func() bool {
		for _, g := range members {
			_ = g.Commit(ctx)
		}
		ps, err := c.GetCursors(ctx, group, "sr", client.ConsistencyHome)
		if err != nil {
			return false
		}
		at := map[uint32]uint64{}
		for _, p := range ps {
			at[p.Range] = p.Offset
		}
		for r, tail := range tails {
			if at[r] != tail {
				return false
			}
		}
		return true
	})
}

// produceAcrossSplit produces rounds values v-0.. of keys key-0..
// to stream "sr", splitting range 1 a third of the way in; every record
// must be acknowledged.
func produceAcrossSplit(t *testing.T, ctx context.Context, c *client.Client, addr string, keys, rounds int) *geologv1.SplitRangeResponse {
	t.Helper()
	p := newProducer(t, c, "sr", client.Linger(time.Millisecond))
	var mu sync.Mutex
	var errs []error
	split := make(chan *geologv1.SplitRangeResponse, 1)
	var resp *geologv1.SplitRangeResponse
	for i := 0; i < rounds; i++ {
		for k := 0; k < keys; k++ {
			key, value := fmt.Sprintf("key-%d", k), fmt.Sprintf("v-%d", i)
			p.Produce(ctx, &client.Record{Key: []byte(key), Value: []byte(value)}, func(res client.ProduceResult, err error) {
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s %s: %w", key, value, err))
					mu.Unlock()
				}
			})
		}
		if i == rounds/3 {
			go func() { split <- splitRange(t, ctx, addr, "sr", 1) }()
		}
		if i == 2*rounds/3 {
			// The last third after the split: some records in the children
			// whatever the pace of the producer.
			resp = <-split
		}
		if i%10 == 0 {
			time.Sleep(5 * time.Millisecond) // spread the rounds over the split
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 || resp == nil {
		t.Fatalf("%d records failed (%v); split %v", len(errs), errs, resp)
	}
	return resp
}
