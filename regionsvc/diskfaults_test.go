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
	"github.com/geolog/geolog/vfs"
)

// TestFsyncFailureKeepsReads: a failed fsync (EIO) stops the range's
// appends for good (the data's fate is unknown until a restart recovers
// the log), but the committed prefix, durable before the failure, is
// still read; describe says why appends stop.
func TestFsyncFailureKeepsReads(t *testing.T) {
	t.Parallel()
	t.Run("own fdatasync", func(t *testing.T) { testFsyncFailureKeepsReads(t, false) })
	t.Run("group commit", func(t *testing.T) { testFsyncFailureKeepsReads(t, true) })
}

func testFsyncFailureKeepsReads(t *testing.T, groupCommit bool) {
	var faults vfs.Faults
	_, c := testNode(t, t.TempDir(), func(cfg *Config) {
		cfg.FS = vfs.WithFaults(vfs.OS(), &faults)
		cfg.GroupCommit = groupCommit
	})
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	for i := 0; i < 3; i++ {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("v", 10)}); err != nil {
			t.Fatal(err)
		}
	}
	faults.SetSyncFail(true)
	_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("lost", 1)})
	wantCode(t, err, apierr.Unavailable)
	faults.SetSyncFail(false)
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: recs("after", 1)})
	wantCode(t, err, apierr.Unavailable)

	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s"})
	if err != nil || len(rr.Records) != 30 {
		t.Fatalf("read of the committed prefix after an fsync failure: %d records, %v", len(rr.GetRecords()), err)
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "s"})
	if err != nil || !strings.Contains(d.Ranges[0].Status, "fdatasync") {
		t.Fatalf("describe after an fsync failure: %v %v", d, err)
	}
}

// TestLeaderDiskFullHandsOff: in a region of three, the leader's disk
// fills: it hands leadership to a follower, which takes the appends; the
// old leader does not stop, and once its disk has space again it catches
// up with the others, without a restart.
// faultRegion is a region of three whose nodes' file systems take
// injected faults, with one single-range stream and one producer.
type faultRegion struct {
	*testRegion
	faults map[uint64]*vfs.Faults
	stream string
	// acked counts the records appended so far: the producer's next
	// sequence.
	acked int
}

// newFaultRegion starts the region (extra adjusts each node's Config) and
// creates stream.
func newFaultRegion(t *testing.T, ctx context.Context, stream string, extra func(*Config)) *faultRegion {
	f := &faultRegion{faults: map[uint64]*vfs.Faults{1: {}, 2: {}, 3: {}}, stream: stream}
	f.testRegion = newTestRegionWith(t, 3, 3, func(cfg *Config) {
		cfg.FS = vfs.WithFaults(vfs.OS(), f.faults[cfg.NodeID])
		if extra != nil {
			extra(cfg)
		}
	})
	f.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: stream, RangeCount: 1})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	return f
}

// appendN appends n records, one at a time, retrying each until acked.
func (f *faultRegion) appendN(ctx context.Context, n int) {
	for end := f.acked + n; f.acked < end; f.acked++ {
		seq := f.acked
		recs := []*geologv1.Record{{Key: []byte("k"), Value: []byte(fmt.Sprintf("v%d", seq))}}
		f.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
			_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: f.stream, ProducerId: 3, BaseSequence: uint64(seq), Records: recs})
			return err
		})
	}
}

// leaderOf returns the node leading the stream's range, 0 if none.
func (f *faultRegion) leaderOf() uint64 {
	for id := range f.nodes {
		if d := f.rangeDriverOf(id, f.stream, 0); d != nil && d.rep != nil && d.rep.LeaderID() == id {
			return id
		}
	}
	return 0
}

func TestLeaderDiskFullHandsOff(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFaultRegion(t, ctx, "full", nil)
	tr, faults := f, f.faults
	appendN := func(n int) { f.appendN(ctx, n) }
	leaderOf := f.leaderOf
	appendN(5)
	pollUntil(t, ctx, "a leader", func() bool { return leaderOf() != 0 })
	old := leaderOf()
	faults[old].SetNoSpace(true)
	appendN(5)
	pollUntil(t, ctx, "leadership to leave the full node", func() bool { l := leaderOf(); return l != 0 && l != old })
	if f := tr.rangeDriverOf(old, "full", 0).failure.Load(); f != nil {
		t.Fatalf("the full node's range stopped: %v", f)
	}
	faults[old].SetNoSpace(false)
	appendN(5)
	pollUntil(t, ctx, "every node to hold every record", func() bool {
		for id := range tr.nodes {
			if d := tr.rangeDriverOf(id, "full", 0); d == nil || d.committed.Load() != uint64(f.acked) {
				return false
			}
		}
		return true
	})
	if f := tr.rangeDriverOf(old, "full", 0).failure.Load(); f != nil {
		t.Fatalf("the once full node's range stopped: %v", f)
	}
}
