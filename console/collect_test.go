package console

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/portlock"
)

// TestConsoleWithANodeDown: a node that does not answer is shown down,
// with why, and everything the others know is still shown; the bounds on
// ranges leave the rest out and say how many.
func TestConsoleWithANodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc := startCluster(t, map[string]int{"us": 1})
	tc.createStream(t, ctx, client.StreamConfig{Name: "orders", RangeCount: 3, Regions: []string{"us"}})
	dead := portlock.Addr(t) // held, never listened on: refused
	con, err := New(Config{Region: "us", Self: tc.addrs["us"][0], Nodes: map[string][]string{"us": tc.addrs["us"], "eu": {dead}},
		RangesMax: 2, Logger: testLogger(t, "console")})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	srv := httptest.NewServer(testMux(con))
	defer srv.Close()
	o := getOverview(t, srv.URL)
	if len(o.Regions) != 2 || o.Regions[0].Name != "us" || o.Regions[1].Name != "eu" {
		t.Fatalf("regions %+v: want us (this node's) then eu", o.Regions)
	}
	if n := o.Regions[0].Nodes[0]; !n.Up || n.Error != "" {
		t.Errorf("the live node: %+v", n)
	}
	if n := o.Regions[1].Nodes[0]; n.Up || n.Addr != dead || n.Error == "" {
		t.Errorf("the dead node: %+v, want down with an error", n)
	}
	if len(o.Streams) != 1 || len(o.Streams[0].Ranges) != 2 || o.Streams[0].RangesLeftOut != 1 || o.Streams[0].RangeCount != 3 {
		t.Fatalf("streams %+v: want orders with 2 of its 3 ranges", o.Streams)
	}
	for _, r := range o.Streams[0].Ranges {
		if !r.Known || r.Leader != tc.addrs["us"][0] || r.Home != "us" {
			t.Errorf("range %+v: want known, led by the live node", r)
		}
	}
}

// TestConsoleWithNoNodeAnswering: when no node answers, the overview says
// so instead of showing an empty cluster.
func TestConsoleWithNoNodeAnswering(t *testing.T) {
	dead := portlock.Addr(t)
	con, err := New(Config{Region: "us", Self: dead, CallTimeout: 2 * time.Second, Logger: testLogger(t, "console")})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	srv := httptest.NewServer(testMux(con))
	defer srv.Close()
	o := getOverview(t, srv.URL)
	if len(o.Streams) != 0 || len(o.Errors) == 0 || !strings.Contains(o.Errors[0], "no node answered") {
		t.Errorf("overview %+v: want no stream and an error saying no node answered", o)
	}
	if len(o.Regions) != 1 || len(o.Regions[0].Nodes) != 1 || o.Regions[0].Nodes[0].Up {
		t.Errorf("regions %+v: want the one node, down", o.Regions)
	}
}

// BenchmarkConsoleCollect: one whole collection (every node asked for
// every stream, groups, orphan logs) on a us x3 + eu x1 cluster with 8
// streams of 4 ranges placed in both regions: the work behind each second
// of a console kept open.
func BenchmarkConsoleCollect(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := startCluster(b, map[string]int{"us": 3, "eu": 1})
	for i := range 8 {
		tc.createStream(b, ctx, client.StreamConfig{Name: fmt.Sprintf("s%d", i), RangeCount: 4, Regions: []string{"us", "eu"}, HomeRegion: "spread"})
	}
	cfg := Config{Region: "us", Self: tc.addrs["us"][0], Nodes: tc.addrs, OrphansRefreshInterval: time.Nanosecond}
	if err := cfg.setDefaults(); err != nil {
		b.Fatal(err)
	}
	col, err := newCollector(&cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer col.close()
	b.ResetTimer()
	for i := range b.N {
		snap := col.collect(ctx, time.Now().Add(time.Duration(i)*time.Second))
		if len(snap.streams) != 8 {
			b.Fatalf("%d streams", len(snap.streams))
		}
	}
}
