package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
)

func int64p(v int64) *int64 { return &v }

// TestAlterStreamRetention: on a node of its own, AlterStream changes a
// stream's retention (DescribeStream says so), the range applies it at its
// next maintenance round (its start moves up), and the change outlives a
// restart; bad requests are typed errors that change nothing.
func TestAlterStreamRetention(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mut := func(cfg *Config) {
		cfg.SegmentBytesMax = 4096
		cfg.MaintenanceInterval = 20 * time.Millisecond
	}
	n, c := testNode(t, dir, mut)
	ctx := ctxT(t)
	createStream(t, c, "r", 1)
	for i := 0; i < 40; i++ {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "r", Range: 0, Records: recs(fmt.Sprint(i), 20)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		req  *geologv1.AlterStreamRequest
		code apierr.Code
	}{
		{&geologv1.AlterStreamRequest{Name: "r"}, apierr.InvalidArgument},
		{&geologv1.AlterStreamRequest{Name: "r", RetentionMaxBytes: int64p(-1)}, apierr.InvalidArgument},
		{&geologv1.AlterStreamRequest{Name: "r", RetentionMaxAgeMs: int64p(retentionAgeMillisMax + 1)}, apierr.InvalidArgument},
		{&geologv1.AlterStreamRequest{Name: "nope", RetentionMaxBytes: int64p(1)}, apierr.StreamNotFound},
		{&geologv1.AlterStreamRequest{Name: cursorStreamName, RetentionMaxBytes: int64p(1)}, apierr.InvalidArgument},
		{&geologv1.AlterStreamRequest{Name: "r", MirrorHoldMaxBytes: int64p(-2)}, apierr.InvalidArgument},
	} {
		if _, err := c.AlterStream(ctx, tc.req); rpcerr.CodeOf(err) != tc.code {
			t.Errorf("AlterStream(%v): %v, want %v", tc.req, err, tc.code)
		}
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "r"})
	if err != nil || d.GetRanges()[0].GetStartOffset() != 0 || d.GetStream().GetRetention().GetMaxBytes() != 0 {
		t.Fatalf("before the alter: %v %v", d, err)
	}
	resp, err := c.AlterStream(ctx, &geologv1.AlterStreamRequest{Name: "r", RetentionMaxBytes: int64p(8192)})
	if err != nil || resp.GetStream().GetRetention().GetMaxBytes() != 8192 {
		t.Fatalf("alter: %v %v", resp, err)
	}
	waitUntil(t, ctx, time.Minute, "retention applied", func() bool {
		d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "r"})
		return err == nil && d.GetRanges()[0].GetStartOffset() > 0
	})
	first := n.streamSpecOf(t, "r") // as the first alter left it, with its catalogue offset
	// The mirror hold alone, and it keeps the retention.
	resp, err = c.AlterStream(ctx, &geologv1.AlterStreamRequest{Name: "r", MirrorHoldMaxBytes: int64p(-1), MirrorHoldMaxMs: int64p(60_000)})
	if ret := resp.GetStream().GetRetention(); err != nil || ret.GetMirrorHoldMaxBytes() != -1 || ret.GetMirrorHoldMaxMs() != 60_000 || ret.GetMaxBytes() != 8192 {
		t.Fatalf("alter the mirror hold: %v %v", resp, err)
	}
	// The ranges' drivers hold by it at once (mirrorFloor reads it there).
	n.mu.RLock()
	rd := n.streams["r"].ranges[0]
	n.mu.RUnlock()
	if h := rd.mirrorHold(); h != (mirrorHold{age: time.Minute}) {
		t.Fatalf("the range's mirror hold after the alter: %+v", h)
	}
	n.Close()
	n, c = testNode(t, dir, mut)
	// The node serves its saved catalogue at once, and an answered alter
	// is in it (applyAlter saves the file before the node serves the
	// spec): read back at once, not after the catalogue group replays.
	d, err = c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "r"})
	if ret := d.GetStream().GetRetention(); err != nil || ret.GetMaxBytes() != 8192 || ret.GetMirrorHoldMaxBytes() != -1 || ret.GetMirrorHoldMaxMs() != 60_000 {
		t.Fatalf("the alters right after a restart: %v %v", ret, err)
	}
	// The catalogue group replays the first alter after the restart: the
	// node applied it before, and it does not put its older values back.
	n.applyAlter(first.AlteredAt, first)
	if s := n.streamSpecOf(t, "r"); s.MirrorHoldBytes != -1 || s.MirrorHoldAgeMillis != 60_000 {
		t.Fatalf("after the first alter replayed: mirror hold %d bytes, %d ms; want -1, 60000", s.MirrorHoldBytes, s.MirrorHoldAgeMillis)
	}
}

// streamSpecOf is the node's spec of stream.
func (n *Node) streamSpecOf(t *testing.T, stream string) streamSpec {
	t.Helper()
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.streams[stream]
	if !ok {
		t.Fatalf("no stream %q", stream)
	}
	return st.spec
}

// TestAlterStreamRegionCutOff: with the ap region cut off, an alter
// through us applies in us and eu and answers a retriable UNAVAILABLE
// naming ap (so a mirror hold can be changed during the outage it is
// for); once ap is back, the same alter again completes it there.
func TestAlterStreamRegionCutOff(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu", "ap"}, 1, 2*time.Millisecond, 0)
	us, eu, ap := w.conns["us"][1], w.conns["eu"][1], w.conns["ap"][1]
	createMirrorHoldStream(t, ctx, us, "cut", &geologv1.RetentionPolicy{MaxBytes: 1 << 20})
	holdOf := func(c geologv1.LogClient) int64 {
		d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "cut"})
		if err != nil {
			return 0
		}
		return d.GetStream().GetRetention().GetMirrorHoldMaxBytes()
	}
	if _, err := w.net.CutRegion("ap", wan.CutReset); err != nil {
		t.Fatal(err)
	}
	req := &geologv1.AlterStreamRequest{Name: "cut", MirrorHoldMaxBytes: int64p(4 << 20)}
	_, err := us.AlterStream(ctx, req)
	if e := rpcerr.FromError(err); e == nil || e.Code != apierr.Unavailable || !e.Retriable || !strings.Contains(e.Message, "not yet in ap") {
		t.Fatalf("alter with ap cut off: %v, want a retriable UNAVAILABLE naming ap", err)
	}
	if got := [2]int64{holdOf(us), holdOf(eu)}; got != [2]int64{4 << 20, 4 << 20} {
		t.Fatalf("with ap cut off, the hold in us and eu: %v, want 4 MiB in both", got)
	}
	if _, err := w.net.HealRegion("ap"); err != nil {
		t.Fatal(err)
	}
	if h := holdOf(ap); h != 0 {
		t.Fatalf("ap's hold before the alter is sent again: %d", h)
	}
	waitUntil(t, ctx, time.Minute, "the alter sent again completes in ap", func() bool {
		_, err := us.AlterStream(ctx, req)
		return err == nil
	})
	if h := holdOf(ap); h != 4<<20 {
		t.Fatalf("ap's hold after the alter completed: %d", h)
	}
}

// TestAlterStreamMultiRegion: an alter through a node of the stream's
// mirror region reaches every node of both regions (each region's
// catalogue), and the home's ranges apply it.
func TestAlterStreamMultiRegion(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 3, 2*time.Millisecond, 0)
	createHomedStream(t, ctx, w, "alt", 2, "us")
	produceN(t, ctx, w, "us", "alt", 20, "v")
	waitCaughtUp(t, ctx, w, "alt")
	resp, err := w.conns["eu"][2].AlterStream(ctx, &geologv1.AlterStreamRequest{Name: "alt", RetentionMaxAgeMs: int64p(3_600_000)})
	if err != nil || resp.GetStream().GetRetention().GetMaxAgeMs() != 3_600_000 {
		t.Fatalf("alter through eu: %v %v", resp, err)
	}
	waitUntil(t, ctx, time.Minute, "the alter on every node", func() bool {
		for _, region := range w.regions {
			for _, c := range w.conns[region] {
				d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "alt"})
				if err != nil || d.GetStream().GetRetention().GetMaxAgeMs() != 3_600_000 {
					return false
				}
			}
		}
		return true
	})
	for _, region := range w.regions {
		for id, nd := range w.nodes[region] {
			nd.mu.RLock()
			st := nd.streams["alt"]
			nd.mu.RUnlock()
			for r, d := range st.ranges {
				if age, _ := d.store.Retention(); age != time.Hour {
					t.Errorf("%s node %d range %d: retention age %v, want 1h", region, id, r, age)
				}
			}
		}
	}
}
