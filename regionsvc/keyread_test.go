package regionsvc

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// chatLog is what a test appended: per range, every record in offset
// order.
type chatLog map[uint32][]*geologv1.StoredRecord

// chatProducers numbers the producers of appendChat.
var chatProducers atomic.Uint64

// appendFunc appends one batch.
type appendFunc func(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error)

// appendChat appends n records to stream (of rangeCount ranges) with
// send: record i has key "room-<i%rooms>" and goes to that key's range,
// except every tenth, which is keyless and goes to range i%rangeCount.
// Records go in batches of up to 8 per range, under a producer id of
// their own, so that send may retry any retriable failure. It adds what
// was appended to log.
func appendChat(t *testing.T, ctx context.Context, send appendFunc, stream string, rangeCount uint32, n, rooms int, log chatLog) {
	t.Helper()
	pending := map[uint32][]*geologv1.Record{}
	producer, seqs := chatProducers.Add(1), map[uint32]uint64{}
	flush := func(r uint32) {
		if len(pending[r]) == 0 {
			return
		}
		resp, err := send(ctx, &geologv1.AppendRequest{Stream: stream, Range: r, Records: pending[r],
			ProducerId: producer, BaseSequence: seqs[r]})
		if err != nil {
			t.Fatalf("append to range %d: %v", r, err)
		}
		seqs[r] += uint64(len(pending[r]))
		for i, rec := range pending[r] {
			log[r] = append(log[r], &geologv1.StoredRecord{Offset: resp.BaseOffset + uint64(i), Key: rec.Key, Value: rec.Value})
		}
		pending[r] = nil
	}
	for i := range n {
		key := fmt.Appendf(nil, "room-%d", i%rooms)
		r := keyspace.RangeForKey(key, rangeCount)
		if i%10 == 9 {
			key, r = nil, uint32(i)%rangeCount
		}
		pending[r] = append(pending[r], &geologv1.Record{Key: key, Value: fmt.Appendf(nil, "message %d (%s)", i, key)})
		if len(pending[r]) == 8 {
			flush(r)
		}
	}
	for r := range rangeCount {
		flush(r)
	}
}

// ctxLong is the context of a test that makes many calls: generous, for
// a loaded machine.
func ctxLong(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// nodeAppend appends through c.
func nodeAppend(c geologv1.LogClient) appendFunc {
	return func(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
		return c.Append(ctx, req)
	}
}

// tail returns the offset after the last record of range r.
func (l chatLog) tail(r uint32) uint64 {
	if len(l[r]) == 0 {
		return 0
	}
	return l[r][len(l[r])-1].Offset + 1
}

// want returns the records of key in range r of the log at offsets >= from.
func (l chatLog) want(r uint32, key []byte, from uint64) []*geologv1.StoredRecord {
	var out []*geologv1.StoredRecord
	for _, rec := range l[r] {
		if rec.Offset >= from && bytes.Equal(rec.Key, key) {
			out = append(out, rec)
		}
	}
	return out
}

// sameRecords reports whether got holds the offsets, keys and values of
// want.
func sameRecords(got, want []*geologv1.StoredRecord) bool {
	return slices.EqualFunc(got, want, func(a, b *geologv1.StoredRecord) bool {
		return a.Offset == b.Offset && bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value)
	})
}

// readKeyAll reads key in range r from offset from to the tail through c,
// in pages of pageRecords, checking that next_offset moves forward and
// ends at the tail. A retriable error (a follower that lost its leader
// for a moment) is retried, as clients do.
func readKeyAll(ctx context.Context, c geologv1.LogClient, req *geologv1.ReadRequest, pageRecords uint32) ([]*geologv1.StoredRecord, error) {
	var out []*geologv1.StoredRecord
	req.MaxRecords = pageRecords
	for {
		resp, err := c.Read(ctx, req)
		if rpcerr.IsRetriable(err) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Records...)
		if resp.NextOffset == resp.TailOffset {
			return out, nil
		}
		if resp.NextOffset <= req.FromOffset || len(resp.Records) == 0 {
			return nil, fmt.Errorf("read from %d: %d records, next %d, tail %d", req.FromOffset, len(resp.Records), resp.NextOffset, resp.TailOffset)
		}
		req.FromOffset = resp.NextOffset
	}
}

// keyedRead is one way checkKeyedReads reads a key.
type keyedRead struct {
	consistency geologv1.Consistency
	page        uint32
	fromHalf    bool // from the middle of the range rather than 0
}

// keyedReads are the reads checkKeyedReads makes of each key. MIN_OFFSET
// comes first: it waits for the local copy (a follower or mirror may lag),
// so that the LOCAL reads after it see it all.
var keyedReads = []keyedRead{
	{geologv1.Consistency_CONSISTENCY_MIN_OFFSET, 1000, false},
	{geologv1.Consistency_CONSISTENCY_LOCAL, 1000, true},
	{geologv1.Consistency_CONSISTENCY_LOCAL, 7, false},
	{geologv1.Consistency_CONSISTENCY_HOME, 1000, false},
}

// checkKeyedReads reads every room key and the empty key of every range
// through c, whole and paged, at each consistency, and checks them
// against log.
func checkKeyedReads(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string, rangeCount uint32, rooms int, log chatLog) {
	t.Helper()
	keys := [][]byte{{}}
	for i := range rooms {
		keys = append(keys, fmt.Appendf(nil, "room-%d", i))
	}
	for _, key := range keys {
		for r := range rangeCount {
			if len(key) > 0 && keyspace.RangeForKey(key, rangeCount) != r {
				continue
			}
			tail := log.tail(r)
			for _, kr := range keyedReads {
				from := uint64(0)
				if kr.fromHalf {
					from = tail / 2
				}
				got, err := readKeyAll(ctx, c, &geologv1.ReadRequest{Stream: stream, Range: r, FromOffset: from, Key: key,
					Consistency: kr.consistency, MinOffset: tail}, kr.page)
				if err != nil {
					t.Fatalf("read key %q of range %d from %d (%v, pages of %d): %v", key, r, from, kr.consistency, kr.page, err)
				}
				if want := log.want(r, key, from); !sameRecords(got, want) {
					t.Fatalf("read key %q of range %d from %d (%v, pages of %d): %d records, want %d", key, r, from, kr.consistency, kr.page, len(got), len(want))
				}
			}
		}
	}
}

// TestReadByKey: on a single node with small segments, reads filtered by
// key return exactly that key's records (the empty key: the keyless ones)
// at every consistency, whole or paged by next_offset; a key of another
// range and an oversized key are refused with INVALID_ARGUMENT; and all
// of it holds again after a restart (recovery rebuilds the indexes).
func TestReadByKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	small := func(c *Config) { c.SegmentBytesMax = 4096 }
	n, c := testNode(t, dir, small)
	createStream(t, c, "chat", 3)
	ctx := ctxLong(t)
	log := chatLog{}
	appendChat(t, ctx, nodeAppend(c), "chat", 3, 600, 9, log)
	checkKeyedReads(t, ctx, c, "chat", 3, 9, log)

	// A read from the middle skips what lies between the key's records.
	key := []byte("room-4")
	r := keyspace.RangeForKey(key, 3)
	recs := log.want(r, key, 0)
	resp, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", Range: r, FromOffset: recs[1].Offset + 1, Key: key, MaxRecords: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Records) != 1 || resp.Records[0].Offset != recs[2].Offset || resp.NextOffset != recs[2].Offset+1 {
		t.Fatalf("one record from %d: %v next %d, want offset %d", recs[1].Offset+1, resp.Records, resp.NextOffset, recs[2].Offset)
	}
	// Its last record, then nothing up to the tail.
	last := recs[len(recs)-1].Offset
	resp, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", Range: r, FromOffset: recs[len(recs)-2].Offset + 1, Key: key, MaxRecords: 5})
	if err != nil || len(resp.Records) != 1 || resp.Records[0].Offset != last || resp.NextOffset != resp.TailOffset {
		t.Fatalf("read of the key's last record: %v, %v next %d tail %d", err, resp.GetRecords(), resp.GetNextOffset(), resp.GetTailOffset())
	}

	// Refused: a key of another range, an oversized key, an offset
	// beyond the tail.
	_, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", Range: (r + 1) % 3, Key: key})
	wantCode(t, err, apierr.InvalidArgument)
	_, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", Range: r, Key: make([]byte, 2<<20)})
	wantCode(t, err, apierr.InvalidArgument)
	_, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", Range: r, Key: key, FromOffset: resp.TailOffset + 1})
	wantCode(t, err, apierr.OffsetOutOfRange)
	sub, err := c.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: "chat", Range: (r + 1) % 3, Key: key})
	if err == nil {
		_, err = sub.Recv()
	}
	wantCode(t, err, apierr.InvalidArgument)

	// Without a key the read is unfiltered, as before.
	resp, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", Range: r, MaxRecords: 1000})
	if err != nil || !sameRecords(resp.Records, log[r]) {
		t.Fatalf("unfiltered read: %v, %d records, want %d", err, len(resp.GetRecords()), len(log[r]))
	}

	// After a restart.
	n.Close()
	_, c = testNode(t, dir, small)
	checkKeyedReads(t, ctx, c, "chat", 3, 9, log)
}

// TestReadByKeyAcrossRetention: with retention deleting old segments, a
// read by key from the start offset returns the retained records of the
// key, and one from below it is OFFSET_OUT_OF_RANGE with the start.
func TestReadByKeyAcrossRetention(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), func(c *Config) { c.SegmentBytesMax = 2048; c.MaintenanceInterval = 20 * time.Millisecond })
	ctx := ctxLong(t)
	if _, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "chat", RangeCount: 1,
		Retention: &geologv1.RetentionPolicy{MaxBytes: 8192}}); err != nil {
		t.Fatal(err)
	}
	log := chatLog{}
	appendChat(t, ctx, nodeAppend(c), "chat", 1, 500, 5, log)
	var start uint64
	pollUntil(t, ctx, "retention to delete segments", func() bool {
		resp, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", MaxRecords: 1})
		start = rpcerr.FromError(err).StartOffset
		return resp == nil && start > 0
	})
	for _, key := range [][]byte{[]byte("room-0"), []byte("room-3"), {}} {
		got, err := readKeyAll(ctx, c, &geologv1.ReadRequest{Stream: "chat", FromOffset: start, Key: key}, 7)
		for attempt := 0; rpcerr.CodeOf(err) == apierr.OffsetOutOfRange && attempt < 10; attempt++ {
			// Retention moved on meanwhile: start again at its start.
			start = rpcerr.FromError(err).StartOffset
			got, err = readKeyAll(ctx, c, &geologv1.ReadRequest{Stream: "chat", FromOffset: start, Key: key}, 7)
		}
		if err != nil {
			t.Fatalf("read key %q from %d: %v", key, start, err)
		}
		if want := log.want(0, key, start); len(got) == 0 || !sameRecords(got, want) {
			t.Fatalf("read key %q from %d: %d records, want %d", key, start, len(got), len(want))
		}
	}
	_, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "chat", FromOffset: start - 1, Key: []byte("room-0")})
	wantCode(t, err, apierr.OffsetOutOfRange)
}

// keyFollower is a subscription by key and what it delivered.
type keyFollower struct {
	t    *testing.T
	ctx  context.Context
	got  chan *geologv1.StoredRecord
	errs chan error
	seen []*geologv1.StoredRecord
}

// followKey subscribes to key in range r of stream through c from offset
// from.
func followKey(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string, r uint32, key []byte, from uint64) *keyFollower {
	t.Helper()
	sub, err := c.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: stream, Range: r, Key: key,
		Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: from}})
	if err != nil {
		t.Fatal(err)
	}
	f := &keyFollower{t: t, ctx: ctx, got: make(chan *geologv1.StoredRecord, 1000), errs: make(chan error, 1)}
	go func() {
		for {
			resp, err := sub.Recv()
			if err != nil {
				f.errs <- err
				return
			}
			for _, rec := range resp.Records {
				f.got <- rec
			}
		}
	}()
	return f
}

// collect waits until the subscription delivered n records in all.
func (f *keyFollower) collect(n int) {
	f.t.Helper()
	for len(f.seen) < n {
		select {
		case rec := <-f.got:
			f.seen = append(f.seen, rec)
		case err := <-f.errs:
			f.t.Fatalf("subscription: %v", err)
		case <-f.ctx.Done():
			f.t.Fatalf("subscription delivered %d records, want %d", len(f.seen), n)
		}
	}
}

// check checks that the subscription delivered exactly want.
func (f *keyFollower) check(want []*geologv1.StoredRecord) {
	f.t.Helper()
	f.collect(len(want))
	if !sameRecords(f.seen, want) {
		f.t.Fatalf("subscription delivered %d records, not the %d wanted", len(f.seen), len(want))
	}
	select {
	case rec := <-f.got:
		f.t.Fatalf("an extra record at offset %d, key %q", rec.Offset, rec.Key)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestSubscribeByKey: a subscription filtered by key delivers that key's
// records in offset order, the retained ones first and then those
// appended while it follows the tail, and nothing of other keys.
func TestSubscribeByKey(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), func(c *Config) { c.SegmentBytesMax = 4096 })
	createStream(t, c, "chat", 2)
	ctx := ctxLong(t)
	log := chatLog{}
	appendChat(t, ctx, nodeAppend(c), "chat", 2, 200, 5, log)
	key := []byte("room-2")
	r := keyspace.RangeForKey(key, 2)
	f := followKey(t, ctx, c, "chat", r, key, 1)
	f.collect(len(log.want(r, key, 1)))
	// Follow the tail: more records of every key, in several rounds.
	for range 3 {
		appendChat(t, ctx, nodeAppend(c), "chat", 2, 50, 5, log)
		f.collect(len(log.want(r, key, 1)))
	}
	f.check(log.want(r, key, 1))
	// The empty key follows the keyless records of a range.
	e := followKey(t, ctx, c, "chat", 0, []byte{}, 0)
	appendChat(t, ctx, nodeAppend(c), "chat", 2, 50, 5, log)
	e.check(log.want(0, nil, 0))
}

// TestReadByKeyReplicated: in a replicated region every node, follower or
// leader, answers reads by key at every consistency with the records of
// the key, and its subscription by key follows the tail.
func TestReadByKeyReplicated(t *testing.T) {
	t.Parallel()
	tr := newTestRegionWith(t, 3, 3, func(c *Config) { c.SegmentBytesMax = 4096 })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "chat", RangeCount: 2})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	log := chatLog{}
	appendChat(t, ctx, tr.leaderAppend, "chat", 2, 300, 6, log)
	key := []byte("room-1")
	r := keyspace.RangeForKey(key, 2)
	var followers []*keyFollower
	for id, c := range tr.clients {
		t.Logf("node %d", id)
		checkKeyedReads(t, ctx, c, "chat", 2, 6, log)
		followers = append(followers, followKey(t, ctx, c, "chat", r, key, 0))
	}
	appendChat(t, ctx, tr.leaderAppend, "chat", 2, 100, 6, log)
	for _, f := range followers {
		f.check(log.want(r, key, 0))
	}
}

// leaderAppend sends an idempotent append to each node in turn until one
// takes it: the others refuse with NOT_LEADER, or another retriable error
// while leaders change (a retry of a batch that did land is answered with
// its offsets).
func (tr *testRegion) leaderAppend(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
	for ctx.Err() == nil {
		for id := uint64(1); id <= uint64(len(tr.peers)); id++ {
			c, ok := tr.clients[id]
			if !ok {
				continue
			}
			resp, err := c.Append(ctx, req)
			if !rpcerr.IsRetriable(err) {
				return resp, err
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, ctx.Err()
}

// TestReadByKeyOnMirror: two regions, one range homed in each; reads by
// key in either region, of its home range or of its mirror, at every
// consistency, return the records of the key, and subscriptions by key
// follow the tail in both.
func TestReadByKeyOnMirror(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorldWith(t, []string{"us", "eu"}, 1, 5*time.Millisecond, time.Millisecond, nil,
		func(_ string, _ uint64, c *Config) { c.SegmentBytesMax = 4096 })
	homes := createGeoStream(t, ctx, w, "chat", 2)
	log := chatLog{}
	home := func(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
		for {
			resp, err := w.conns[homes[req.Range]][1].Append(ctx, req)
			if !rpcerr.IsRetriable(err) || ctx.Err() != nil {
				return resp, err
			}
			time.Sleep(20 * time.Millisecond) // the home is still taking its lease
		}
	}
	appendChat(t, ctx, home, "chat", 2, 300, 6, log)
	var followers []*keyFollower
	for _, region := range w.regions {
		t.Logf("region %s (homes %v)", region, homes)
		checkKeyedReads(t, ctx, w.conns[region][1], "chat", 2, 6, log)
		followers = append(followers, followKey(t, ctx, w.conns[region][1], "chat", 1, []byte{}, 0))
	}
	appendChat(t, ctx, home, "chat", 2, 100, 6, log)
	for _, f := range followers {
		f.check(log.want(1, nil, 0))
	}
}

// TestReadByKeyCompacted: on a stream compacted by key, a read by key
// returns what the compacted range holds of the key (its newest record at
// its offset, nothing for a deleted key), paging over the holes; a keyed
// subscription delivers the same; and a restart, which checks the key
// index files of the rewritten segments, keeps it so.
func TestReadByKeyCompacted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, compactingNode())
	ctx := ctxLong(t)
	_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "kv", RangeCount: 1,
		Cleanup:    geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT,
		Compaction: &geologv1.CompactionPolicy{DeleteRetentionMs: -1, MinLagMs: -1}})
	if err != nil {
		t.Fatal(err)
	}
	offsets, values := map[string]uint64{}, map[string]string{}
	for round := range 40 {
		var rs []*geologv1.Record
		for k := range 5 {
			key := fmt.Sprintf("k%d", (round*5+k)%12)
			r := &geologv1.Record{Key: []byte(key), Value: []byte(fmt.Sprintf("%s@%d", key, round))}
			if round%7 == 6 && k == 0 {
				r.Value, r.Tombstone = nil, true
			}
			rs = append(rs, r)
		}
		res, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "kv", Records: rs})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rs {
			v := string(r.GetValue())
			if r.GetTombstone() {
				v = "~"
			}
			offsets[string(r.GetKey())], values[string(r.GetKey())] = res.GetBaseOffset()+uint64(i), v
		}
	}
	want := latestOf(offsets, values)
	waitUntil(t, ctx, 60*time.Second, "the range to compact below its tail", func() bool {
		return slices.Equal(readRange(t, ctx, c, "kv", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0), want)
	})
	check := func(c geologv1.LogClient) {
		t.Helper()
		for k := range 12 {
			key := fmt.Sprintf("k%d", k)
			var keyWant []string
			if values[key] != "~" {
				keyWant = []string{fmt.Sprintf("%d:%s=%s", offsets[key], key, values[key])}
			}
			for _, page := range []uint32{1, 100} {
				recs, err := readKeyAll(ctx, c, &geologv1.ReadRequest{Stream: "kv", Key: []byte(key)}, page)
				if err != nil {
					t.Fatalf("read %s: %v", key, err)
				}
				var got []string
				for _, r := range recs {
					got = append(got, recordText(r))
				}
				if !slices.Equal(got, keyWant) {
					t.Fatalf("read %s by key (pages of %d): %v, want %v", key, page, got, keyWant)
				}
			}
		}
	}
	check(c)
	live := "k1"
	if values[live] == "~" {
		t.Fatal("the test wants k1 alive")
	}
	f := followKey(t, ctx, c, "kv", 0, []byte(live), 0)
	f.collect(1)
	if got := recordText(f.seen[0]); got != fmt.Sprintf("%d:%s=%s", offsets[live], live, values[live]) {
		t.Fatalf("keyed subscription delivered %s", got)
	}
	n.Close()
	_, c2 := testNode(t, dir, compactingNode())
	check(c2)
}
