package regionsvc

import (
	"context"
	"testing"
	"time"
)

// TestRangesOpenPacedByAwakeGroups creates a stream of many ranges with a
// pacing bound of 2 awake groups per node: no node ever has far more
// groups awake than the bound (slack: a quiesced group woken by a message
// or a liveness change is not paced; 7 were seen under -race), every
// range still elects, quiesces and takes an append, and the count goes
// back to zero. Without the pacing all 96 are awake at once.
func TestRangesOpenPacedByAwakeGroups(t *testing.T) {
	t.Parallel()
	const bound, slack, ranges = 2, 24, 96
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) { cfg.openAwakeMax = bound })
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	tr.createStream(ctx, "paced", ranges)
	for id, n := range tr.nodes {
		for {
			if _, ok := n.streamSpec("paced"); ok {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("node %d never opened the stream", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	tr.waitQuiesced(ctx)
	for id, n := range tr.nodes {
		p := &n.region.pace
		t.Logf("node %d: peak %d groups awake", id, p.peak.Load())
		if peak := p.peak.Load(); peak > bound+slack {
			t.Errorf("node %d: %d groups awake at once, want at most %d", id, peak, bound+slack)
		}
		if a := p.awake.Load(); a != 0 {
			t.Errorf("node %d: %d groups counted awake once all quiesced", id, a)
		}
	}
	for r := range uint32(ranges) {
		tr.appendAndReadFrom(ctx, 1+uint64(r)%3, "paced", r)
	}
}

// TestOpenPaceSkipsStoppedGroups: a dormant group that stops before it is
// admitted leaves the queue, so the pace neither admits nor counts it
// (a deleted stream's ranges would hold places among the awake for ever).
func TestOpenPaceSkipsStoppedGroups(t *testing.T) {
	t.Parallel()
	p := &openPace{max: 1}
	stopped, next := p.enqueue(), p.enqueue()
	if p.cancel(stopped) {
		t.Fatal("a group never admitted reported as admitted")
	}
	p.admit()
	select {
	case <-next:
	default:
		t.Fatal("the next dormant group was not admitted")
	}
	if a := p.awake.Load(); a != 1 {
		t.Fatalf("%d groups counted awake, want 1", a)
	}
	if !p.cancel(next) {
		t.Fatal("an admitted group reported as never admitted")
	}
}
