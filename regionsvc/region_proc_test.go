package regionsvc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// regionClients dials every process of a region.
func regionClients(t *testing.T, procs []*nodeproc.Proc) map[string]geologv1.LogClient {
	out := map[string]geologv1.LogClient{}
	for _, p := range procs {
		conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		out[p.Addr] = geologv1.NewLogClient(conn)
	}
	return out
}

// leaderOf asks the given nodes who leads a range; "" if no agreement.
func leaderOf(ctx context.Context, clients map[string]geologv1.LogClient, skip, stream string, rng uint32) string {
	for addr, c := range clients {
		if addr == skip {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		d, err := c.DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
		cancel()
		if err == nil && int(rng) < len(d.Ranges) && d.Ranges[rng].Leader != "" && d.Ranges[rng].Leader != skip {
			return d.Ranges[rng].Leader
		}
	}
	return ""
}

// TestStaleLeaderGetsNoAck pauses a range leader with SIGSTOP past an
// election, appends through the new leader, then sends an append to the old
// leader and resumes it: the stale leader must not ack it, and the log must
// not hold it.
func TestStaleLeaderGetsNoAck(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	procs := nodeproc.Region(t, 3, "--tick", "50ms")
	clients := regionClients(t, procs)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	waitFor(t, ctx, "stream created", func() bool {
		for _, c := range clients {
			_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "z", RangeCount: 1})
			if err == nil || rpcerr.CodeOf(err) == apierr.StreamExists {
				return true
			}
		}
		return false
	})
	var old string
	waitFor(t, ctx, "a leader", func() bool { old = leaderOf(ctx, clients, "", "z", 0); return old != "" })
	appendTo := func(addr, value string, seq uint64, timeout time.Duration) (*geologv1.AppendResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		// WaitForReady: this client's connection to addr may be in its
		// reconnect backoff (a first dial that found the process not
		// listening yet, on a busy machine), which would fail the one
		// attempt at once with the old "connection refused".
		return clients[addr].Append(cctx, &geologv1.AppendRequest{Stream: "z", ProducerId: 1, BaseSequence: seq,
			Records: []*geologv1.Record{{Value: []byte(value)}}}, grpc.WaitForReady(true))
	}
	// One attempt each: 30 s leaves a busy machine time for an fsync'd
	// quorum write.
	if _, err := appendTo(old, "before", 0, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var oldProc *nodeproc.Proc
	for _, p := range procs {
		if p.Addr == old {
			oldProc = p
		}
	}
	oldProc.Pause()
	var fresh string
	waitFor(t, ctx, "a new leader", func() bool { fresh = leaderOf(ctx, clients, old, "z", 0); return fresh != "" })
	if _, err := appendTo(fresh, "fresh", 1, 30*time.Second); err != nil {
		t.Fatalf("append to the new leader: %v", err)
	}
	// The stale leader gets an append (from another producer) while paused;
	// it handles it once resumed.
	stale := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := clients[old].Append(cctx, &geologv1.AppendRequest{Stream: "z", ProducerId: 2, BaseSequence: 0,
			Records: []*geologv1.Record{{Value: []byte("stale")}}})
		stale <- err
	}()
	time.Sleep(200 * time.Millisecond) // let the request reach the paused process's socket
	oldProc.Resume()
	err := <-stale
	if err == nil {
		t.Fatal("the stale leader acked an append after losing leadership")
	}
	t.Logf("stale leader answered: %v", err)
	// Every node's log: before, fresh; never stale.
	for addr, c := range clients {
		var rr *geologv1.ReadResponse
		waitFor(t, ctx, "replica catch-up on "+addr, func() bool {
			var err error
			rr, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "z", Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: 2})
			return err == nil
		})
		var got []string
		for _, r := range rr.Records {
			got = append(got, string(r.Value))
		}
		if fmt.Sprint(got) != "[before fresh]" {
			t.Fatalf("node %s log %v", addr, got)
		}
	}
}
