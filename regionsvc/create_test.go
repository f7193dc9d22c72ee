package regionsvc

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
)

// TestCreateStreamIsIdempotent: in three regions, the same CreateStream
// sent again, to any region, is answered OK with the existing stream
// (fields left to a node-dependent default match it); another definition
// gets STREAM_EXISTS naming the difference; and a create that could not
// reach a region (UNAVAILABLE, retriable) is completed by sending it
// again once the region is back.
func TestCreateStreamIsIdempotent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu", "ap"}, 1, 5*time.Millisecond, 0)
	regions := []string{"us", "eu", "ap"}
	req := &geologv1.CreateStreamRequest{Name: "ci", RangeCount: 3, Regions: regions, HomeRegion: "spread",
		Retention: &geologv1.RetentionPolicy{MaxAgeMs: 3_600_000}}
	var first *geologv1.StreamInfo
	waitUntil(t, ctx, time.Minute, "the first create", func() bool {
		resp, err := w.conns["us"][1].CreateStream(ctx, req)
		first = resp.GetStream()
		return err == nil
	})
	wantHomes := []string{"us", "eu", "ap"}
	if !slices.Equal(first.GetRangeHomes(), wantHomes) {
		t.Fatalf("homes %v, want %v", first.GetRangeHomes(), wantHomes)
	}
	// The same request again, at every region, and with the homes and
	// regions left to their defaults (which the taking node resolves).
	defaults := &geologv1.CreateStreamRequest{Name: "ci", RangeCount: 3, Retention: req.GetRetention()}
	for _, region := range regions {
		for _, r := range []*geologv1.CreateStreamRequest{req, defaults} {
			resp, err := w.conns[region][1].CreateStream(ctx, r)
			if err != nil {
				t.Fatalf("create again at %s (%v): %v", region, r, err)
			}
			if got := resp.GetStream(); !slices.Equal(got.GetRangeHomes(), wantHomes) || !slices.Equal(got.GetRegions(), regions) {
				t.Fatalf("create again at %s answered %v, not the existing stream", region, got)
			}
		}
	}
	// Another definition: refused, naming the difference.
	for _, c := range []struct {
		req  *geologv1.CreateStreamRequest
		diff string
	}{
		{&geologv1.CreateStreamRequest{Name: "ci", RangeCount: 4, Regions: regions, Retention: req.GetRetention()}, "range_count 4 (the stream has 3)"},
		{&geologv1.CreateStreamRequest{Name: "ci", RangeCount: 3, Regions: regions, HomeRegion: "eu", Retention: req.GetRetention()}, "range 0 homed in eu (the stream's is homed in us)"},
		{&geologv1.CreateStreamRequest{Name: "ci", RangeCount: 3, Regions: []string{"us", "eu"}, Retention: req.GetRetention()}, "regions [us eu] (the stream has [us eu ap])"},
		{&geologv1.CreateStreamRequest{Name: "ci", RangeCount: 3, Regions: regions}, "retention max_age_ms 0 (the stream has 3600000)"},
	} {
		_, err := w.conns["eu"][1].CreateStream(ctx, c.req)
		if e := rpcerr.FromError(err); e.Code != apierr.StreamExists || e.Retriable || !strings.Contains(e.Message, c.diff) {
			t.Fatalf("create %v: %v, want STREAM_EXISTS naming %q", c.req, err, c.diff)
		}
	}

	// A create cut short: ap cannot be reached from us.
	if _, err := w.net.Partition("us", "ap", wan.CutReset); err != nil {
		t.Fatal(err)
	}
	half := &geologv1.CreateStreamRequest{Name: "half", RangeCount: 2, Regions: regions, HomeRegion: "us"}
	_, err := w.conns["us"][1].CreateStream(ctx, half)
	if e := rpcerr.FromError(err); e.Code != apierr.Unavailable || !e.Retriable {
		t.Fatalf("create with ap cut off: %v, want a retriable UNAVAILABLE", err)
	}
	if _, err := w.conns["ap"][1].DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "half"}); rpcerr.CodeOf(err) != apierr.StreamNotFound {
		t.Fatalf("ap holds the stream although it was cut off: %v", err)
	}
	if _, err := w.net.HealBetween("us", "ap"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, 30*time.Second, "the retried create completes", func() bool {
		_, err := w.conns["us"][1].CreateStream(ctx, half)
		return err == nil
	})
	for _, region := range regions {
		d, err := w.conns[region][1].DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "half"})
		if err != nil || !slices.Equal(d.GetStream().GetRangeHomes(), []string{"us", "us"}) || !slices.Equal(d.GetStream().GetRegions(), regions) {
			t.Fatalf("%s after the retried create: %v %v", region, d.GetStream(), err)
		}
	}
}
