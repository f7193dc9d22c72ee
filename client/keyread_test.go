package client_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	"github.com/geolog/geolog/keyspace"
)

// produceRooms produces n records to stream: record i has key
// "room-<i%rooms>" and value "msg <i>", every fifth none. It returns them.
func produceRooms(t *testing.T, p *client.Producer, from, n, rooms int) []*client.Record {
	t.Helper()
	var recs []*client.Record
	for i := from; i < from+n; i++ {
		r := &client.Record{Key: fmt.Appendf(nil, "room-%d", i%rooms), Value: fmt.Appendf(nil, "msg %d", i)}
		if i%5 == 4 {
			r.Key = nil
		}
		recs = append(recs, r)
	}
	if _, err := p.ProduceSync(testCtx(t), recs...); err != nil {
		t.Fatal(err)
	}
	return recs
}

// readByKey reads key in range rng from offset 0 to the tail, in pages of
// 3 records.
func readByKey(t *testing.T, c *client.Client, stream string, rng uint32, key []byte) []client.StoredRecord {
	t.Helper()
	var out []client.StoredRecord
	var next uint64
	for {
		r, err := c.Read(testCtx(t), stream, rng, next, client.ReadOptions{ByKey: true, Key: key, MaxRecords: 3})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Records...)
		if r.NextOffset >= r.TailOffset {
			return out
		}
		if r.NextOffset <= next {
			t.Fatalf("read by key from %d: next %d", next, r.NextOffset)
		}
		next = r.NextOffset
	}
}

// filterKey returns the records of recs with key key.
func filterKey(recs []client.StoredRecord, key []byte) []client.StoredRecord {
	return slices.DeleteFunc(slices.Clone(recs), func(r client.StoredRecord) bool { return !bytes.Equal(r.Key, key) })
}

func sameStored(a, b []client.StoredRecord) bool {
	return slices.EqualFunc(a, b, func(x, y client.StoredRecord) bool {
		return x.Offset == y.Offset && bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value)
	})
}

// TestNodeReadByKey: against a node, RangeOfKey names each key's range,
// a Read by key gives exactly that key's records (paged by NextOffset),
// the empty key the keyless ones, SubscribeKey follows one key, and a key
// of another range is a final CodeInvalidArgument.
func TestNodeReadByKey(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, n.Addr())
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "chat", RangeCount: 3}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, "chat")
	produceRooms(t, p, 0, 300, 7)
	for i := range 7 {
		key := fmt.Appendf(nil, "room-%d", i)
		rng, err := c.RangeOfKey(ctx, "chat", key)
		if err != nil || rng != keyspace.RangeForKey(key, 3) {
			t.Fatalf("RangeOfKey(%s) = %d, %v", key, rng, err)
		}
		all := readAll(t, c, "chat", rng)
		if got, want := readByKey(t, c, "chat", rng, key), filterKey(all, key); len(want) == 0 || !sameStored(got, want) {
			t.Fatalf("read by key %s: %d records, want %d", key, len(got), len(want))
		}
		_, err = c.Read(ctx, "chat", (rng+1)%3, 0, client.ReadOptions{ByKey: true, Key: key})
		if client.CodeOf(err) != client.CodeInvalidArgument || client.IsRetriable(err) {
			t.Fatalf("read of %s in another range: %v", key, err)
		}
	}
	for rng := range uint32(3) {
		all := readAll(t, c, "chat", rng)
		for _, key := range [][]byte{nil, {}} {
			if got, want := readByKey(t, c, "chat", rng, key), filterKey(all, nil); !sameStored(got, want) {
				t.Fatalf("read of the keyless records of range %d: %d, want %d", rng, len(got), len(want))
			}
		}
	}
	if _, err := c.RangeOfKey(ctx, "chat", nil); err == nil {
		t.Fatal("RangeOfKey of the empty key")
	}
	if _, err := c.Read(ctx, "chat", 0, 0, client.ReadOptions{Key: []byte("room-1")}); client.CodeOf(err) != client.CodeInvalidArgument {
		t.Fatalf("a key without ByKey: %v", err)
	}

	// SubscribeKey follows one key from an offset.
	key := []byte("room-3")
	rng := keyspace.RangeForKey(key, 3)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan []client.StoredRecord)
	want := 0
	go func() {
		var got []client.StoredRecord
		for rec, err := range c.SubscribeKey(sctx, "chat", rng, key, client.StartAt{Offset: 5}) {
			if err != nil {
				break
			}
			if got = append(got, rec); len(got) == 60 {
				break
			}
		}
		done <- got
	}()
	for len(filterKey(readAll(t, c, "chat", rng), key)) < 70 {
		produceRooms(t, p, 300+want, 50, 7)
		want += 50
	}
	got := <-done
	all := filterKey(readAll(t, c, "chat", rng), key)
	i := slices.IndexFunc(all, func(r client.StoredRecord) bool { return r.Offset >= 5 })
	if !sameStored(got, all[i:i+60]) {
		t.Fatalf("SubscribeKey delivered %d records, not the first 60 of the key from offset 5", len(got))
	}
	for rec, err := range c.SubscribeKey(ctx, "chat", (rng+1)%3, key, client.StartAt{}) {
		if client.CodeOf(err) != client.CodeInvalidArgument {
			t.Fatalf("SubscribeKey in another range: %+v, %v", rec, err)
		}
		break
	}
}

// TestFakeReadByKey: the fake server filters by key too, so that SDK users
// can test key reads against it.
func TestFakeReadByKey(t *testing.T) {
	fake := startFake(t, clienttest.Config{SubscribeRecordsMax: 4})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	produceRooms(t, newProducer(t, c, "s"), 0, 100, 3)
	all := readAll(t, c, "s", 0)
	key := []byte("room-1")
	if got, want := readByKey(t, c, "s", 0, key), filterKey(all, key); len(want) == 0 || !sameStored(got, want) {
		t.Fatalf("read by key: %d records, want %d", len(got), len(want))
	}
	var got []client.StoredRecord
	for rec, err := range c.SubscribeKey(testCtx(t), "s", 0, key, client.StartAt{}) {
		if err != nil {
			t.Fatal(err)
		}
		if got = append(got, rec); len(got) == len(filterKey(all, key)) {
			break
		}
	}
	if !sameStored(got, filterKey(all, key)) {
		t.Fatal("SubscribeKey on the fake delivered other records")
	}
}
