package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/cli"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFailoverClientContract walks the client contract through a real
// failover, a planned rehome and a failback (three regions, a lease store):
//
//   - an idempotent producer whose acknowledged batches a failover cut
//     off the log gets PRODUCER_STATE_LOST from the new home, with the
//     documented fields (a raw gRPC client), and the Go SDK carries on by
//     itself under a fresh producer id;
//   - DescribeStream gives the range's epoch history: created in us, taken
//     over at the fork offset, rehomed at the tail;
//   - once us returned and forked, a cluster-wide ListOrphans asked at one
//     node finds us's fork while a node is down, and says which one did
//     not answer (geolog orphans list too).
func TestFailoverClientContract(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// A lease TTL of 5 s, not the homing tests' 2: us must keep its home
	// while it acks with its replication cut, however loaded the machine.
	w := newHomingWorldTTL(t, []string{"us", "eu", "ap"}, 1, 5*time.Second)
	createHomedStream(t, ctx, w.world, "pc", 1, "us")

	// Both producers append, and the other regions replicate it.
	sdk := newSDKProducer(t, w.world, "pc")
	sdk.produce(t, ctx, "before", 20)
	raw := w.conns["us"][1]
	const pid = 0x5eed
	rawAppend(t, ctx, raw, pid, 0, 5)
	waitUntil(t, ctx, time.Minute, "eu and ap replicate", func() bool {
		tails := w.tails(ctx, "pc")
		return tails["eu"] != nil && tails["ap"] != nil && tails["eu"][0] == 25 && tails["ap"][0] == 25
	})
	// us keeps acking with its replication cut: those acks are on a log
	// no other region has. (Reset, not blackhole: a blackholed link
	// delivers what it held when it heals.)
	var cut []*wan.Link
	for _, l := range w.net.Links() {
		if l.From() == "us" && l.To() != "pg" {
			if err := l.Cut(wan.CutReset); err != nil {
				t.Fatal(err)
			}
			cut = append(cut, l)
		}
	}
	sdk.produce(t, ctx, "cut", 20)
	rawAppend(t, ctx, raw, pid, 5, 5)
	w.stop("us", 1)
	for _, l := range cut {
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, ctx, time.Minute, "a new home", func() bool {
		home, epoch := rangeHome(ctx, w.world, "eu", "pc", 0)
		return home != "us" && home != "" && epoch == 2
	})
	newHome, _ := rangeHome(ctx, w.world, "eu", "pc", 0)
	other := map[string]string{"eu": "ap", "ap": "eu"}[newHome]

	// The raw client: its next batch, at sequence 10, meets a range that
	// holds it up to 5 (the batches 5..9 it acked were cut off).
	checkStateLost(t, ctx, w.conns[newHome][1], pid, 25)
	// The SDK: it resends nothing it acked, meets the same condition, and
	// carries on under a fresh producer id without failing a record.
	res := sdk.produce(t, ctx, "after", 20)
	for _, r := range res {
		if r.Epoch != 2 || r.Offset < 25 {
			t.Fatalf("after the failover: %+v, want epoch 2 at offset 25 or later", r)
		}
	}
	sdk.close()
	if !strings.Contains(sdk.log.String(), "lost the producer's state") || !strings.Contains(sdk.log.String(), "fork_offset=25") {
		t.Fatalf("the SDK did not meet PRODUCER_STATE_LOST with the fork point; its log:\n%s", sdk.log.String())
	}

	// A planned rehome to the third region, then the history.
	admin := geologv1.NewAdminClient(mustConn(t, w.addrs[other][1]))
	rh, err := admin.Rehome(ctx, &geologv1.RehomeRequest{Stream: "pc", Ranges: []uint32{0}, Region: other})
	if err != nil || rh.GetRanges()[0].GetStatus() != "moved" {
		t.Fatalf("rehome to %s: %v %v", other, rh, err)
	}
	rehomedAt := rh.GetRanges()[0].GetStartOffset()
	want := []*geologv1.EpochStart{
		{Epoch: 1, StartOffset: 0, HomeRegion: "us", Kind: geologv1.EpochKind_EPOCH_KIND_CREATE},
		{Epoch: 2, StartOffset: 25, HomeRegion: newHome, Kind: geologv1.EpochKind_EPOCH_KIND_TAKEOVER},
		{Epoch: 3, StartOffset: rehomedAt, HomeRegion: other, Kind: geologv1.EpochKind_EPOCH_KIND_REHOME},
	}
	if rehomedAt != 45 {
		t.Fatalf("rehomed at offset %d, want the tail, 45", rehomedAt)
	}
	for _, region := range []string{"eu", "ap"} {
		checkEpochHistory(t, ctx, w.conns[region][1], want)
	}

	// us returns and forks its divergent tail off into its orphan log once
	// the new home's next batch reaches it.
	w.start("us", 1)
	after := newSDKProducer(t, w.world, "pc")
	after.produce(t, ctx, "failback", 5)
	after.close()
	usAdmin := geologv1.NewAdminClient(mustConn(t, w.addrs["us"][1]))
	waitUntil(t, ctx, time.Minute, "us forked", func() bool {
		resp, err := usAdmin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: "pc"})
		return err == nil && len(resp.GetForks()) == 1
	})
	checkEpochHistory(t, ctx, w.conns["us"][1], want)
	checkClusterOrphans(t, ctx, w, newHome, other)
}

// sdkProducer is a Go SDK producer bootstrapped with every region's nodes.
type sdkProducer struct {
	c   *client.Client
	p   *client.Producer
	log *syncBuffer // the client's warnings
}

// syncBuffer is a strings.Builder safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func newSDKProducer(t *testing.T, w *world, stream string) *sdkProducer {
	var addrs []string
	for _, r := range w.regions {
		addrs = append(addrs, w.regionAddrs(r))
	}
	log := &syncBuffer{}
	c, err := client.New(strings.Join(addrs, ","), client.RetryBackoff(10*time.Millisecond, 200*time.Millisecond),
		client.Logger(hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Warn})))
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.NewProducer(stream, client.DeliveryTimeout(time.Minute), client.ProducerRetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return &sdkProducer{c: c, p: p, log: log}
}

// produce appends n records, one batch each, and fails the test on any
// error.
func (s *sdkProducer) produce(t *testing.T, ctx context.Context, prefix string, n int) []client.ProduceResult {
	t.Helper()
	var out []client.ProduceResult
	for i := range n {
		res, err := s.p.ProduceSync(ctx, &client.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("%s/%d", prefix, i))})
		if err != nil {
			t.Fatalf("%s/%d: %v", prefix, i, err)
		}
		out = append(out, res...)
	}
	return out
}

func (s *sdkProducer) close() {
	s.p.Close()
	s.c.Close()
}

// rawAppend appends n one-record batches under producer pid from sequence
// from, as a client of the raw API would.
func rawAppend(t *testing.T, ctx context.Context, c geologv1.LogClient, pid, from uint64, n int) {
	t.Helper()
	for seq := from; seq < from+uint64(n); seq++ {
		var err error
		for attempt := 0; attempt < 100; attempt++ {
			_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "pc", Range: 0, ProducerId: pid, BaseSequence: seq,
				Records: []*geologv1.Record{{Key: []byte("raw"), Value: []byte(fmt.Sprintf("raw/%d", seq))}}})
			if err == nil || !rpcerr.IsRetriable(err) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("raw append of sequence %d: %v", seq, err)
		}
	}
}

// checkStateLost sends the raw producer's next batch (sequence 10) to the
// new home and checks the documented answer: gRPC ABORTED carrying
// PRODUCER_STATE_LOST, not retriable, the sequence the range holds the
// producer up to (5), and the fork point (epoch 2 from forkOffset).
func checkStateLost(t *testing.T, ctx context.Context, c geologv1.LogClient, pid, forkOffset uint64) {
	t.Helper()
	var err error
	for attempt := 0; attempt < 200; attempt++ {
		_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "pc", Range: 0, ProducerId: pid, BaseSequence: 10,
			Records: []*geologv1.Record{{Key: []byte("raw"), Value: []byte("raw/10")}}})
		if err == nil || !rpcerr.IsRetriable(err) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, _ := status.FromError(err)
	var detail *geologv1.ErrorDetail
	for _, d := range st.Details() {
		if ed, ok := d.(*geologv1.ErrorDetail); ok {
			detail = ed
		}
	}
	if st.Code() != codes.Aborted || detail == nil {
		t.Fatalf("the raw producer's next batch: %v, want ABORTED with an ErrorDetail", err)
	}
	if detail.GetCode() != geologv1.ErrorCode_ERROR_CODE_PRODUCER_STATE_LOST || detail.GetRetriable() ||
		detail.GetExpectedSequence() != 5 || detail.GetForkEpoch() != 2 || detail.GetForkOffset() != forkOffset {
		t.Fatalf("the raw producer's next batch: %v, want PRODUCER_STATE_LOST, not retriable, expected sequence 5, fork at epoch 2 offset %d", detail, forkOffset)
	}
	t.Logf("raw producer after the failover: %v", detail)
}

// checkEpochHistory checks a node's DescribeStream epochs against want.
func checkEpochHistory(t *testing.T, ctx context.Context, c geologv1.LogClient, want []*geologv1.EpochStart) {
	t.Helper()
	var got []*geologv1.EpochStart
	waitUntil(t, ctx, 30*time.Second, "the epoch history", func() bool {
		d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "pc"})
		if err != nil || d.GetEpochsUnavailable() != "" {
			return false
		}
		got = d.GetRanges()[0].GetEpochs()
		return len(got) == len(want)
	})
	for i := range want {
		g, w := got[i], want[i]
		if g.GetEpoch() != w.GetEpoch() || g.GetStartOffset() != w.GetStartOffset() || g.GetHomeRegion() != w.GetHomeRegion() || g.GetKind() != w.GetKind() {
			t.Fatalf("epoch history %v, want %v", got, want)
		}
	}
}

// checkClusterOrphans stops the node of down and asks a node of the
// remaining mirror region for the stream's forks in the whole cluster: us's
// fork is there, down's node is named as not answering. geolog orphans
// list says the same.
func checkClusterOrphans(t *testing.T, ctx context.Context, w *homingWorld, down, asked string) {
	t.Helper()
	w.stop(down, 1)
	admin := geologv1.NewAdminClient(mustConn(t, w.addrs[asked][1]))
	resp, err := admin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: "pc", Scope: geologv1.OrphanScope_ORPHAN_SCOPE_CLUSTER})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetPartial() || len(resp.GetNodes()) != 3 || len(resp.GetForks()) != 1 {
		t.Fatalf("cluster orphans with %s down: %v", down, resp)
	}
	f := resp.GetForks()[0]
	if f.GetForkOffset() != 25 || f.GetEpoch() < 2 || f.GetRecords() != 25 || f.GetFirstOffset() != 25 || f.GetNextOffset() != 50 {
		t.Fatalf("fork %v, want the 25 records us acked at offsets [25, 50)", f)
	}
	for _, no := range resp.GetNodes() {
		switch no.GetRegion() {
		case down:
			if no.GetError() == "" {
				t.Fatalf("the stopped node answered: %v", no)
			}
		case "us":
			if no.GetError() != "" || len(no.GetForks()) != 1 || no.GetAddress() != w.addrs["us"][1] || no.GetNodeId() != 1 {
				t.Fatalf("us's entry: %v", no)
			}
		default:
			if no.GetError() != "" || len(no.GetForks()) != 0 {
				t.Fatalf("%s's entry: %v", no.GetRegion(), no)
			}
		}
	}
	var out, errOut strings.Builder
	if code := cli.Run(ctx, []string{"--addr", w.addrs[asked][1], "orphans", "list", "pc"}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("geolog orphans list: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "1 forks, 25 orphaned records") || !strings.Contains(errOut.String(), down+" node 1") {
		t.Fatalf("geolog orphans list:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
	t.Logf("geolog orphans list with %s down:\n%s%s", down, out.String(), errOut.String())
}
