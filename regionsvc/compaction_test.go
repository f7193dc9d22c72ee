package regionsvc

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// compactingNode is a node that compacts soon and often: small segments,
// maintenance every 30 ms, a decision at most every 50 ms.
func compactingNode() func(*Config) {
	return func(cfg *Config) {
		cfg.SegmentBytesMax = 4 << 10
		cfg.MaintenanceInterval = 30 * time.Millisecond
		cfg.CompactionInterval = 50 * time.Millisecond
	}
}

// readRange reads a whole range from offset 0 through the API, following
// next offsets over holes, and returns "offset:key=value" (a tombstone's
// value "~") per record and the offsets it was told to read from.
func readRange(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string, rng uint32, consistency geologv1.Consistency, min uint64) []string {
	t.Helper()
	return readRangeForm(t, ctx, c, stream, rng, consistency, min, false)
}

// readRangeForm is readRange in the frame form (want_frames) if frames is
// set.
func readRangeForm(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string, rng uint32, consistency geologv1.Consistency, min uint64, frames bool) []string {
	t.Helper()
	var out []string
	for from := uint64(0); ; {
		res, err := c.Read(ctx, &geologv1.ReadRequest{Stream: stream, Range: rng, FromOffset: from, MaxRecords: 7,
			Consistency: consistency, MinOffset: min, WantFrames: frames})
		if err != nil {
			t.Fatalf("read from %d: %v", from, err)
		}
		if frames && len(res.GetRecords()) > 0 {
			t.Fatalf("read from %d asked for frames, got records", from)
		}
		for _, r := range append(res.GetRecords(), framesAsRecords(t, res.GetFrames())...) {
			out = append(out, recordText(r))
		}
		if res.GetNextOffset() == res.GetTailOffset() {
			return out
		}
		if res.GetNextOffset() <= from {
			t.Fatalf("read from %d made no progress (next %d, tail %d)", from, res.GetNextOffset(), res.GetTailOffset())
		}
		from = res.GetNextOffset()
	}
}

func recordText(r *geologv1.StoredRecord) string {
	v := string(r.GetValue())
	if r.GetTombstone() {
		v = "~"
	}
	return fmt.Sprintf("%d:%s=%s", r.GetOffset(), r.GetKey(), v)
}

// latestOf is what a compacted range must hold once compaction covered
// every record in offsets: the newest record of each key, tombstones gone
// (delete retention none), in offset order.
func latestOf(offsets map[string]uint64, values map[string]string) []string {
	var out []string
	type kv struct {
		off  uint64
		text string
	}
	var all []kv
	for k, off := range offsets {
		if values[k] == "~" {
			continue
		}
		all = append(all, kv{off, fmt.Sprintf("%d:%s=%s", off, k, values[k])})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].off < all[j].off })
	for _, e := range all {
		out = append(out, e.text)
	}
	return out
}

// TestCompactedStreamOnANode: a stream created with cleanup compact keeps,
// once its range compacted, the newest record of each key at its offset
// (tombstones gone past a delete retention of none), read end to end
// through Read and Subscribe over the holes; an idempotent retry of a
// batch whose records compaction removed is still a duplicate; records
// without a key and tombstones with a value are refused with typed
// errors; and all of it survives a restart.
func TestCompactedStreamOnANode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, compactingNode())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "kv", RangeCount: 1,
		Cleanup:    geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT,
		Compaction: &geologv1.CompactionPolicy{DeleteRetentionMs: -1, MinLagMs: -1}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "kv"})
	if err != nil || d.GetStream().GetCleanup() != geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT ||
		d.GetStream().GetCompaction().GetDeleteRetentionMs() != -1 {
		t.Fatalf("describe: %v %v", d, err)
	}
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "kv", Records: []*geologv1.Record{{Value: []byte("x")}}})
	wantCode(t, err, apierr.KeyRequired)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "kv", Records: []*geologv1.Record{{Key: []byte("k"), Value: []byte("x"), Tombstone: true}}})
	wantCode(t, err, apierr.InvalidArgument)

	offsets, values := map[string]uint64{}, map[string]string{}
	type sent struct {
		seq  uint64
		recs []*geologv1.Record
		base uint64
	}
	var batches []sent
	var seq uint64
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
		res, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "kv", Records: rs, ProducerId: 77, BaseSequence: seq})
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
		batches = append(batches, sent{seq: seq, recs: rs, base: res.GetBaseOffset()})
		seq += uint64(len(rs))
	}
	want := latestOf(offsets, values)
	waitUntil(t, ctx, 30*time.Second, "the range to compact below its tail", func() bool {
		got := readRange(t, ctx, c, "kv", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0)
		// The last marker sits past the records: everything is below a point.
		return strings.Join(got, " ") == strings.Join(want, " ")
	})
	// An idle range stops deciding: at most one more marker (for the last
	// one's offset) follows.
	tail := func() uint64 {
		r, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "kv", FromOffset: 0, MaxRecords: 1})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetTailOffset()
	}
	before := tail()
	time.Sleep(20 * 50 * time.Millisecond) // twenty decision intervals
	if after := tail(); after > before+1 {
		t.Fatalf("an idle range went on deciding: tail %d, then %d", before, after)
	}
	// A retry of a batch whose records are gone is a duplicate.
	old := batches[len(batches)-10]
	res, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "kv", Records: old.recs, ProducerId: 77, BaseSequence: old.seq})
	if err != nil || !res.GetDuplicate() || res.GetBaseOffset() != old.base {
		t.Fatalf("retry of sequence %d after compaction: %v %v, want a duplicate at %d", old.seq, res, err, old.base)
	}
	if got := readRangeForm(t, ctx, c, "kv", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0, true); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("frame form:\n got  %v\n want %v", got, want)
	}
	checkSubscribe(t, ctx, c, want)

	// A restart keeps the compacted log and the decision.
	n.Close()
	_, c2 := testNode(t, dir, compactingNode())
	if got := readRange(t, ctx, c2, "kv", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after a restart:\n got  %v\n want %v", got, want)
	}
	res, err = c2.Append(ctx, &geologv1.AppendRequest{Stream: "kv", Records: old.recs, ProducerId: 77, BaseSequence: old.seq})
	if err != nil || !res.GetDuplicate() || res.GetBaseOffset() != old.base {
		t.Fatalf("retry after a restart: %v %v", res, err)
	}
}

// checkSubscribe subscribes from offset 0, in the records form and in the
// frame form, and checks that each delivers want, then stops.
func checkSubscribe(t *testing.T, ctx context.Context, c geologv1.LogClient, want []string) {
	t.Helper()
	for _, frames := range []bool{false, true} {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		sub, err := c.Subscribe(sctx, &geologv1.SubscribeRequest{Stream: "kv", Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: 0}, WantFrames: frames})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for len(got) < len(want) {
			resp, err := sub.Recv()
			if err == io.EOF || err != nil {
				t.Fatalf("subscribe: %v after %v", err, got)
			}
			for _, r := range append(resp.GetRecords(), framesAsRecords(t, resp.GetFrames())...) {
				got = append(got, recordText(r))
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("subscribe (frames %v) delivered\n %v\nwant\n %v", frames, got, want)
		}
	}
}

// TestCompactedStreamTwoRegions: a compacted stream homed in us with a
// mirror in eu, three nodes each, WAN latency between them. Records
// produced in us (keys rewritten over and over, tombstones among them),
// once compaction ran, read end to end through the API from every node of
// both regions as the same records at the same offsets: the newest of each
// key. The mirror compacted at the home's decisions (markers shipped with
// the data), with its own segment boundaries.
func TestCompactedStreamTwoRegions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorldWith(t, []string{"us", "eu"}, 3, 20*time.Millisecond, 0, nil, func(region string, id uint64, cfg *Config) {
		compactingNode()(cfg)
		if region == "eu" {
			cfg.SegmentBytesMax = 6 << 10 // other segment boundaries than the home's
		}
	})
	c, err := client.New(w.regionAddrs("us"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitUntil(t, ctx, time.Minute, "stream created in both regions", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "kv", RangeCount: 1, Regions: w.regions, HomeRegion: "us",
			Cleanup: client.CleanupCompact, DeleteRetention: -1, MinCompactionLag: -1})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	p, err := c.NewProducer("kv")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	offsets, values := map[string]uint64{}, map[string]string{}
	began := time.Now()
	var mu sync.Mutex
	for i := range 400 {
		key := fmt.Sprintf("k%d", i%23)
		rec := &client.Record{Key: []byte(key), Value: []byte(fmt.Sprintf("%s@%d", key, i))}
		if i%17 == 16 {
			rec.Value, rec.Tombstone = nil, true
		}
		p.Produce(ctx, rec, func(res client.ProduceResult, err error) {
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if off, ok := offsets[key]; !ok || res.Offset > off {
				offsets[key], values[key] = res.Offset, string(rec.Value)
				if rec.Tombstone {
					values[key] = "~"
				}
			}
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := strings.Join(latestOf(offsets, values), " ")
	t.Logf("produced in %v", time.Since(began))
	for _, region := range w.regions {
		for id := uint64(1); id <= 3; id++ {
			conn := w.conns[region][id]
			var last string
			waitUntil(t, ctx, time.Minute, fmt.Sprintf("%s node %d to hold the compacted range", region, id), func() bool {
				last = strings.Join(readRange(t, ctx, conn, "kv", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0), " ")
				return last == want
			})
		}
	}
	// The same records in every region, with the home's epoch and append
	// time: compare every field.
	var ref []*geologv1.StoredRecord
	for _, region := range w.regions {
		got, err := w.conns[region][1].Read(ctx, &geologv1.ReadRequest{Stream: "kv", FromOffset: 0, MaxRecords: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if ref == nil {
			ref = got.GetRecords()
			continue
		}
		if len(got.GetRecords()) != len(ref) {
			t.Fatalf("%s holds %d records from 0, us %d", region, len(got.GetRecords()), len(ref))
		}
		for i, r := range got.GetRecords() {
			if !sameRecord(r, ref[i]) || r.GetTombstone() != ref[i].GetTombstone() {
				t.Fatalf("%s record %d differs: %v vs %v", region, i, r, ref[i])
			}
		}
	}
	t.Logf("%d records kept of 400 produced, identical in us and eu", len(ref))
}
