package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
)

// TestGroupStartPositions: with StartPositions, a member starts each
// range where the application's store says (range 0 at 7, past what the
// group committed) or, where the store has nothing, at the group's
// committed position (range 1, committed at 3); its next Commit raises
// the group's positions to the store's. A store error ends Records with
// that error.
func TestGroupStartPositions(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, n.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "orders", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	produceKeyed(t, ctx, c, "orders", 0, 200)
	if _, err := c.CommitCursors(ctx, "sink", client.CursorPosition{Stream: "orders", Range: 0, Offset: 2},
		client.CursorPosition{Stream: "orders", Range: 1, Offset: 3}); err != nil {
		t.Fatal(err)
	}
	store := func(_ context.Context, rng uint32) (uint64, bool, error) { return 7, rng == 0, nil }
	g, err := c.NewGroupConsumer("orders", "sink", client.ManualCommit(), client.StartPositions(store))
	if err != nil {
		t.Fatal(err)
	}
	first := map[uint32]uint64{}
	for rec, err := range g.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := first[rec.Range]; !ok {
			first[rec.Range] = rec.Offset
		}
		if len(first) == 2 {
			break
		}
	}
	if first[0] != 7 || first[1] != 3 {
		t.Fatalf("first offsets %v, want range 0 at 7 (the store's) and range 1 at 3 (the group's)", first)
	}
	if err := g.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ps, err := c.GetCursors(ctx, "sink", "orders", client.ConsistencyHome)
	if err != nil || len(ps) != 2 || ps[0].Offset != 7 || ps[1].Offset != 3 {
		t.Fatalf("positions after Commit: %+v, %v; want 7 and 3", ps, err)
	}
	g.Close()

	broken := errors.New("store unavailable")
	g, err = c.NewGroupConsumer("orders", "sink", client.StartPositions(func(context.Context, uint32) (uint64, bool, error) {
		return 0, false, broken
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, err := range g.Records(ctx) {
		if !errors.Is(err, broken) {
			t.Fatalf("Records ended with %v, want the store's error", err)
		}
		break
	}
}
