package regionsvc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

// openFilesUnder counts this process's descriptors of files under dirs
// (from /proc/self/fd).
func openFilesUnder(t *testing.T, dirs map[uint64]string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for _, d := range dirs {
			if strings.HasPrefix(target, d+string(filepath.Separator)) {
				n++
				break
			}
		}
	}
	return n
}

// TestRangesBeyondFileBudget: a region whose nodes host many more ranges
// than their file descriptor budget (Limits.FileDescriptorsMax) appends
// to and reads from every range on every node, and once idle each node
// holds at most its budget of range files open (and its data directory's
// lock). Without the node's file cache every range holds its segment
// file and its directory lock open: over 100 descriptors per node here.
func TestRangesBeyondFileBudget(t *testing.T) {
	t.Parallel()
	const budget, ranges = 16, 48
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) {
		cfg.Fsync = segment.FsyncAlways // an unsynced file keeps its descriptor
		cfg.Limits.FileDescriptorsMax = budget
	})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	tr.createStream(ctx, "many", ranges)
	for r := range uint32(ranges) {
		tr.appendAndReadFrom(ctx, 1+uint64(r)%3, "many", r)
	}
	// Every node reads every range back, its evicted files reopened.
	for id, c := range tr.clients {
		for r := range uint32(ranges) {
			for {
				rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "many", Range: r, MaxRecords: 10})
				if err == nil && len(rr.Records) == 1 && string(rr.Records[0].Value) == "v" {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("node %d range %d: %v (%d records)", id, r, err, len(rr.GetRecords()))
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	tr.waitQuiesced(ctx)
	for id, n := range tr.nodes {
		st := n.files.Stats()
		t.Logf("node %d: %+v", id, st)
		if st.Evictions == 0 || st.Reopens == 0 {
			t.Fatalf("node %d evicted or reopened nothing: %+v", id, st)
		}
	}
	// Idle: the descriptors go back within the budget (a Ready cycle in
	// flight may hold a few more for a moment).
	want := len(tr.nodes) * (budget + 1) // and each node's LOCK
	for {
		open := openFilesUnder(t, tr.dirs)
		if open <= want {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d range files open in the region, want at most %d", open, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
