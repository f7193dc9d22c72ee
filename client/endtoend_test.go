package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	"github.com/geolog/geolog/client/e2e"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

func newKey(t *testing.T, id string) e2e.Key {
	t.Helper()
	k, err := e2e.NewKey(id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// storedHas reports whether any stored value or header value of a range
// holds marker.
func storedHas(fake *clienttest.Server, stream string, rng uint32, marker string) bool {
	for _, r := range fake.Records(stream, rng) {
		if bytes.Contains(r.GetValue(), []byte(marker)) {
			return true
		}
		for _, h := range r.GetHeaders() {
			if bytes.Contains(h.GetValue(), []byte(marker)) || strings.Contains(h.GetKey(), marker) {
				return true
			}
		}
	}
	return false
}

func TestSealWithRoundTrip(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("chat", 2)
	keys := e2e.NewKeyring()
	for _, conv := range []string{"room-1", "room-2", "room-3"} {
		if err := keys.Add("chat", []byte(conv), newKey(t, conv+"/1")); err != nil {
			t.Fatal(err)
		}
	}
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "chat", client.SealWith(keys, "sender"))
	var recs []*client.Record
	for i := range 30 {
		conv := fmt.Sprintf("room-%d", i%3+1)
		recs = append(recs, &client.Record{Key: []byte(conv), Value: []byte(fmt.Sprintf("SECRET-VALUE-%d", i)),
			Headers: []client.Header{{Key: "sender", Value: []byte(fmt.Sprintf("SECRET-SENDER-%d", i))}, {Key: "trace", Value: []byte("clear-trace")}}})
	}
	res, err := p.ProduceSync(testCtx(t), recs...)
	if err != nil {
		t.Fatal(err)
	}
	byOffset := map[[2]uint64]*client.Record{}
	for i, r := range res {
		if r.Record != recs[i] || !strings.HasPrefix(string(r.Record.Value), "SECRET-VALUE-") {
			t.Fatalf("result %d carries %q, not the record as given", i, r.Record.Value)
		}
		byOffset[[2]uint64{uint64(r.Range), r.Offset}] = recs[i]
	}
	ctx := testCtx(t)
	for rng := range uint32(2) {
		if storedHas(fake, "chat", rng, "SECRET") {
			t.Fatalf("range %d stores plaintext", rng)
		}
		if !storedHas(fake, "chat", rng, "clear-trace") {
			t.Fatalf("range %d lost the clear header", rng)
		}
		raw, err := c.Read(ctx, "chat", rng, 0, client.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		opened, err := c.Read(ctx, "chat", rng, 0, client.ReadOptions{}, client.OpenWith(keys))
		if err != nil {
			t.Fatal(err)
		}
		if len(opened.Records) != len(raw.Records) || len(raw.Records) == 0 {
			t.Fatalf("range %d: %d opened of %d", rng, len(opened.Records), len(raw.Records))
		}
		for _, got := range opened.Records {
			checkOpened(t, got, byOffset[[2]uint64{uint64(rng), got.Offset}])
		}
		n := 0
		for got, err := range c.Subscribe(ctx, "chat", rng, client.StartAt{}, client.OpenWith(keys)) {
			if err != nil {
				t.Fatal(err)
			}
			checkOpened(t, got, byOffset[[2]uint64{uint64(rng), got.Offset}])
			if n++; n == len(raw.Records) {
				break
			}
		}
	}
}

func checkOpened(t *testing.T, got client.StoredRecord, want *client.Record) {
	t.Helper()
	if want == nil {
		t.Fatalf("range %d offset %d was not produced", got.Range, got.Offset)
	}
	if !bytes.Equal(got.Value, want.Value) || !bytes.Equal(got.Key, want.Key) || !got.ProducerTime.Equal(want.ProducerTime) ||
		fmt.Sprint(got.Headers) != fmt.Sprint(want.Headers) {
		t.Fatalf("offset %d opened to %q %q %v, want %q %q %v", got.Offset, got.Key, got.Value, got.Headers, want.Key, want.Value, want.Headers)
	}
}

// policyLog is a one-range stream holding, at offsets 0 to 7: a good
// record of room-1, one appended without sealing, one under a key the
// reader lacks, a copy of offset 0 with a ciphertext byte flipped, a copy
// of offset 0 moved to room-2, a good record of room-2, one under the
// reader's key id with another secret, and a good record of room-3.
func policyLog(t *testing.T) (*client.Client, *e2e.Keyring) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("chat", 1)
	c := newClient(t, fake.Addr())
	ctx := testCtx(t)
	reader, stranger, impostor := e2e.NewKeyring(), e2e.NewKeyring(), e2e.NewKeyring()
	k := newKey(t, "chat/1")
	reader.AddStream("chat", k)
	stranger.AddStream("chat", newKey(t, "chat/other"))
	impostor.AddStream("chat", newKey(t, "chat/1"))
	sealed := newProducer(t, c, "chat", client.SealWith(reader))
	plain := newProducer(t, c, "chat")
	produce := func(p *client.Producer, key, value string, headers ...client.Header) {
		t.Helper()
		if _, err := p.ProduceSync(ctx, &client.Record{Key: []byte(key), Value: []byte(value), Headers: headers}); err != nil {
			t.Fatal(err)
		}
	}
	produce(sealed, "room-1", "good 0")
	first, err := c.Read(ctx, "chat", 0, 0, client.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orig := first.Records[0]
	produce(plain, "room-1", "plaintext 1")
	produce(newProducer(t, c, "chat", client.SealWith(stranger)), "room-1", "stranger 2")
	flipped := bytes.Clone(orig.Value)
	flipped[len(flipped)-1] ^= 1
	// A copy keeps the producer time: it is bound too.
	copyOf := func(key string, value []byte) *client.Record {
		return &client.Record{Key: []byte(key), Value: value, Headers: orig.Headers, ProducerTime: orig.ProducerTime}
	}
	if _, err := plain.ProduceSync(ctx, copyOf("room-1", flipped), copyOf("room-2", orig.Value)); err != nil {
		t.Fatal(err)
	}
	produce(sealed, "room-2", "good 5")
	produce(newProducer(t, c, "chat", client.SealWith(impostor)), "room-1", "impostor 6")
	produce(sealed, "room-3", "good 7")
	return c, reader
}

// policyWant is why each offset of policyLog fails to open; nil opens.
var policyWant = []error{nil, e2e.ErrNotSealed, e2e.ErrUnknownKey, e2e.ErrTampered, e2e.ErrTampered, nil, e2e.ErrWrongKey, nil}

func checkOpenError(t *testing.T, err error, offset uint64) {
	t.Helper()
	var oe *client.OpenError
	if !errors.As(err, &oe) || oe.Offset != offset || oe.Stream != "chat" || !errors.Is(err, policyWant[offset]) {
		t.Fatalf("offset %d: %v, want an *OpenError wrapping %v", offset, err, policyWant[offset])
	}
}

func TestOpenWithFailPolicy(t *testing.T) {
	c, keys := policyLog(t)
	ctx := testCtx(t)
	for off, want := range policyWant {
		r, err := c.Read(ctx, "chat", 0, uint64(off), client.ReadOptions{MaxRecords: 1}, client.OpenWith(keys))
		if want == nil {
			if err != nil || len(r.Records) != 1 || !strings.HasPrefix(string(r.Records[0].Value), "good ") {
				t.Fatalf("offset %d: %v", off, err)
			}
			continue
		}
		if r != nil {
			t.Fatalf("offset %d: a result with the error", off)
		}
		checkOpenError(t, err, uint64(off))
	}
	// A read over several records fails at the first that does not open.
	if _, err := c.Read(ctx, "chat", 0, 0, client.ReadOptions{}, client.OpenWith(keys)); err == nil {
		t.Fatal("read of the whole range opened")
	} else {
		checkOpenError(t, err, 1)
	}
	var got []string
	var end error
	for rec, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{}, client.OpenWith(keys)) {
		if err != nil {
			end = err
			break
		}
		got = append(got, string(rec.Value))
	}
	if fmt.Sprint(got) != "[good 0]" || client.IsRetriable(end) {
		t.Fatalf("subscription yielded %q, then %v", got, end)
	}
	checkOpenError(t, end, 1)
}

func TestOpenWithSkipPolicy(t *testing.T) {
	c, keys := policyLog(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var mu sync.Mutex
	reported := map[uint64]error{}
	skip := client.SkipUnopenable(func(rec client.StoredRecord, err error) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := reported[rec.Offset]; ok {
			t.Errorf("offset %d reported twice", rec.Offset)
		}
		reported[rec.Offset] = err
	})
	check := func(what string, got []string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(got) != "[good 0 good 5 good 7]" {
			t.Fatalf("%s yielded %q", what, got)
		}
		for off, want := range policyWant {
			err, ok := reported[uint64(off)]
			if want == nil {
				if ok {
					t.Fatalf("%s reported offset %d: %v", what, off, err)
				}
				continue
			}
			checkOpenError(t, err, uint64(off))
		}
		clear(reported)
	}
	r, err := c.Read(ctx, "chat", 0, 0, client.ReadOptions{}, client.OpenWith(keys), skip)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range r.Records {
		got = append(got, string(rec.Value))
	}
	if r.NextOffset != 8 {
		t.Fatalf("next offset %d after skipping", r.NextOffset)
	}
	check("Read", got)
	got = nil
	for rec, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{}, client.OpenWith(keys), skip) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(rec.Value))
		if rec.Offset == 7 {
			break
		}
	}
	check("Subscribe", got)
}

func TestSealWithRefuses(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("chat", 1)
	c := newClient(t, fake.Addr())
	if _, err := c.NewProducer("chat", client.SealWith(nil)); err == nil {
		t.Fatal("SealWith(nil) accepted")
	}
	if _, err := c.NewProducer("chat", client.SealWith(e2e.NewKeyring(), e2e.HeaderName)); !errors.Is(err, e2e.ErrReservedHeader) {
		t.Fatalf("sealing the marker header: %v", err)
	}
	keys := e2e.NewKeyring()
	keys.Add("chat", []byte("room-1"), newKey(t, "room-1/1"))
	p := newProducer(t, c, "chat", client.SealWith(keys))
	ctx := testCtx(t)
	if _, err := p.ProduceSync(ctx, &client.Record{Key: []byte("room-2"), Value: []byte("x")}); !errors.Is(err, e2e.ErrUnknownKey) || client.IsRetriable(err) {
		t.Fatalf("conversation without a key: %v", err)
	}
	if _, err := p.ProduceSync(ctx, &client.Record{Key: []byte("room-1"), Value: []byte("x"),
		Headers: []client.Header{{Key: e2e.HeaderName, Value: []byte("1")}}}); !errors.Is(err, e2e.ErrReservedHeader) {
		t.Fatalf("reserved header: %v", err)
	}
	if n := len(fake.Records("chat", 0)); n != 0 {
		t.Fatalf("%d records appended by failed seals", n)
	}
	// The sealed size counts against the batch bound.
	small := newProducer(t, c, "chat", client.SealWith(keys), client.BatchBytesMax(200), client.BufferedBytesMax(1<<20))
	_, err := small.ProduceSync(ctx, &client.Record{Key: []byte("room-1"), Value: bytes.Repeat([]byte("v"), 150)})
	if client.CodeOf(err) != client.CodeRecordTooLarge {
		t.Fatalf("150-byte value sealed past a 200-byte batch bound: %v", err)
	}
	if _, err := c.Read(ctx, "chat", 0, 0, client.ReadOptions{}, client.SkipUnopenable(func(client.StoredRecord, error) {})); err == nil {
		t.Fatal("SkipUnopenable without OpenWith accepted by Read")
	}
	for _, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{}, client.OpenWith(nil)) {
		if err == nil {
			t.Fatal("OpenWith(nil) accepted by Subscribe")
		}
		break
	}
}

// TestSealedOnceAcrossResends: a batch resent after a lost ack carries the
// same sealed bytes, so the server answers it as the duplicate it is.
func TestSealedOnceAcrossResends(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("chat", 1)
	var mu sync.Mutex
	var sent [][]byte
	fake.SetAppendFault(func(n int64, req *geologv1.AppendRequest) clienttest.Fault {
		mu.Lock()
		defer mu.Unlock()
		recs, err := clienttest.AppendRecords(req)
		if err != nil {
			t.Errorf("append %d: %v", n, err)
			return clienttest.Fault{}
		}
		sent = append(sent, bytes.Clone(recs[0].GetValue()))
		if n == 1 {
			return clienttest.Fault{DropAfterApply: true}
		}
		return clienttest.Fault{}
	})
	keys := e2e.NewKeyring()
	keys.AddStream("chat", newKey(t, "chat/1"))
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "chat", client.SealWith(keys))
	res, err := p.ProduceSync(testCtx(t), &client.Record{Key: []byte("room-1"), Value: []byte("once")})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) < 2 || !bytes.Equal(sent[0], sent[1]) || !res[0].Duplicate {
		t.Fatalf("%d sends, duplicate %v: the resend was sealed again", len(sent), res[0].Duplicate)
	}
	if n := len(fake.Records("chat", 0)); n != 1 {
		t.Fatalf("%d records in the log", n)
	}
}

// A tombstone has no value: a sealing producer sends it as a tombstone and
// an opening consumer passes it through, instead of sealing an empty value
// (which compaction would then keep as a live record) or failing to open it.
func TestSealWithTombstone(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("chat", 1)
	keys := e2e.NewKeyring()
	if err := keys.Add("chat", []byte("room-1"), newKey(t, "room-1/1")); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "chat", client.SealWith(keys))
	recs := []*client.Record{{Key: []byte("room-1"), Value: []byte("SECRET")}, {Key: []byte("room-1"), Tombstone: true}}
	if _, err := p.ProduceSync(testCtx(t), recs...); err != nil {
		t.Fatal(err)
	}
	stored := fake.Records("chat", 0)
	if len(stored) != 2 || stored[0].GetTombstone() || !stored[1].GetTombstone() || len(stored[1].GetValue()) != 0 {
		t.Fatalf("stored %v, want a sealed record then a bare tombstone", stored)
	}
	got, err := c.Read(testCtx(t), "chat", 0, 0, client.ReadOptions{}, client.OpenWith(keys))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != 2 || string(got.Records[0].Value) != "SECRET" || !got.Records[1].Tombstone {
		t.Fatalf("opened %+v, want the value then the tombstone", got.Records)
	}
}
