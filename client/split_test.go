package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/geolog/geolog/client"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// keyedAck is one acknowledged record of a key.
type keyedAck struct {
	value  string
	rng    uint32
	offset uint64
}

// TestNodeProducerAcrossSplit: a keyed producer appends continuously to a
// real node while one of the stream's ranges splits (Admin.SplitRange).
// Every record is acknowledged, none fails; per key, the records the
// split range took are below its split offset, every later one is in the
// one child the new map gives the key, in produce order; reading the
// parent up to its split offset and then that child gives each key's
// values exactly once, in produce order. A new producer routes by the map
// from its first record.
func TestNodeProducerAcrossSplit(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, n.Addr())
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "sp", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, "sp", client.Linger(time.Millisecond))
	const keys, rounds = 16, 150
	var mu sync.Mutex
	acks := map[string][]keyedAck{}
	var errs []error
	var wg sync.WaitGroup
	split := make(chan *geologv1.SplitRangeResponse, 1)
	for i := 0; i < rounds; i++ {
		for k := 0; k < keys; k++ {
			key, value := fmt.Sprintf("key-%d", k), fmt.Sprintf("v-%d", i)
			wg.Add(1)
			p.Produce(ctx, &client.Record{Key: []byte(key), Value: []byte(value)}, func(res client.ProduceResult, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w", key, value, err))
					return
				}
				acks[key] = append(acks[key], keyedAck{value: value, rng: res.Range, offset: res.Offset})
			})
		}
		if i == rounds/3 {
			go func() { split <- splitRange(t, ctx, n.Addr(), "sp", 1) }()
		}
		if i%10 == 0 {
			time.Sleep(5 * time.Millisecond) // spread the rounds over the split
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	resp := <-split
	if len(errs) > 0 {
		t.Fatalf("%d records failed, first: %v", len(errs), errs[0])
	}
	desc, err := c.DescribeStream(ctx, "sp")
	if err != nil {
		t.Fatal(err)
	}
	m, err := desc.RangeMap()
	if err != nil || m.Version != 1 {
		t.Fatalf("map %+v, %v", m, err)
	}
	moved := 0
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("key-%d", k)
		home := m.LookupKey([]byte(key))
		got := acks[key]
		if len(got) != rounds {
			t.Fatalf("%s: %d acks, want %d", key, len(got), rounds)
		}
		inChild := false
		for i, a := range got {
			if a.value != fmt.Sprintf("v-%d", i) {
				t.Fatalf("%s: ack %d is %s: callbacks out of produce order", key, i, a.value)
			}
			switch {
			case a.rng == 1 && (inChild || a.offset >= resp.GetSplitOffset()):
				t.Fatalf("%s: %s in the split range at %d (split offset %d, after the child: %v)", key, a.value, a.offset, resp.GetSplitOffset(), inChild)
			case a.rng != 1 && a.rng != home:
				t.Fatalf("%s: %s in range %d, the map gives %d", key, a.value, a.rng, home)
			case a.rng == home && home != 0:
				inChild = true
				moved++
			}
		}
	}
	if moved == 0 {
		t.Fatal("no record went to a child: the split came after the last record")
	}
	checkReadBack(t, ctx, c, resp.GetSplitOffset(), acks, m.LookupKey)

	// A producer that starts after the split routes by the map at once.
	p2 := newProducer(t, c, "sp")
	res, err := p2.ProduceSync(ctx, &client.Record{Key: []byte("key-1"), Value: []byte("late")})
	if err != nil || res[0].Range != m.LookupKey([]byte("key-1")) {
		t.Fatalf("new producer: %+v, %v", res, err)
	}
}

// splitRange splits range r of stream through the node at addr.
func splitRange(t *testing.T, ctx context.Context, addr, stream string, r uint32) *geologv1.SplitRangeResponse {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Error(err)
		return nil
	}
	defer conn.Close()
	resp, err := geologv1.NewAdminClient(conn).SplitRange(ctx, &geologv1.SplitRangeRequest{Stream: stream, Range: r})
	if err != nil {
		t.Errorf("split: %v", err)
	}
	return resp
}

// checkReadBack reads range 1 up to its split offset and then the
// children, and requires each key's values, in order, to be what was
// acknowledged.
func checkReadBack(t *testing.T, ctx context.Context, c *client.Client, splitOffset uint64, acks map[string][]keyedAck, child func([]byte) uint32) {
	t.Helper()
	read := map[string][]string{}
	for _, r := range []uint32{0, 1, 2, 3} {
		for from := uint64(0); ; {
			rr, err := c.Read(ctx, "sp", r, from, client.ReadOptions{})
			if err != nil {
				t.Fatalf("read range %d from %d: %v", r, from, err)
			}
			for _, rec := range rr.Records {
				if r == 1 && rec.Offset >= splitOffset {
					t.Fatalf("range 1 serves a record at %d, past its split offset %d", rec.Offset, splitOffset)
				}
				read[string(rec.Key)] = append(read[string(rec.Key)], string(rec.Value))
			}
			if rr.NextOffset >= rr.TailOffset || len(rr.Records) == 0 {
				break
			}
			from = rr.NextOffset
		}
	}
	for key, as := range acks {
		if len(read[key]) != len(as) {
			t.Fatalf("%s: read %d records, %d acknowledged", key, len(read[key]), len(as))
		}
		for i, a := range as {
			if read[key][i] != a.value {
				t.Fatalf("%s: record %d read %s, acknowledged %s", key, i, read[key][i], a.value)
			}
		}
	}
}
