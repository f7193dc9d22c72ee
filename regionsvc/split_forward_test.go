package regionsvc

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/keyspace"
	"github.com/geolog/geolog/pki"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestSplitMirroredCatalogueWithoutReplica: two regions of four nodes,
// replication factor 3. The mirror region's (eu's) catalogue is led by a
// node that holds no replica of the parent, so its log never holds the
// split marker: the parent's mirror-group leader asks it to record the
// split (split_forward.go). Before the split, a forged request in the
// non-replica's name is refused and changes nothing. After it, every eu
// node's map equals the home's, eu holds the parent and the children at
// the home's offsets with the home's records, a subscriber of the parent
// in eu (started before the split) follows it into the children, and the
// voter's request repeated is answered as recorded while one that
// contradicts the record is RANGE_SPLIT. Without the forwarded request eu
// never records the split.
func TestSplitMirroredCatalogueWithoutReplica(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// The stream's ranges are homed in both regions: their splits are
	// ordered by the lease store (split_reserve.go claimSplit).
	store := homing.NewMemStore()
	w := newWorldWith(t, []string{"us", "eu"}, 4, 10*time.Millisecond, 0, nil, func(_ string, _ uint64, cfg *Config) {
		cfg.LeaseStore, cfg.LeaseTTL, cfg.LeaseHeartbeat, cfg.MaxClockOffset = store, testLeaseTTL, testLeaseHeartbeat, testMaxClockOffset
		cfg.FailoverDisabled = true
	})
	homes := createGeoStream(t, ctx, w, "sf", 8)
	r, outsider := pickCatalogueOutsider(t, ctx, w, "eu", "sf", homes)
	moveCatalogueLeader(t, ctx, w, "eu", outsider)
	t.Logf("eu's catalogue led by node %d, which holds no replica of range %d", outsider, r)

	const before = 30
	for i, n := 0, 0; n < before; i++ {
		if key := fmt.Sprintf("key-%d", i); keyspace.RangeForKey([]byte(key), 8) == r {
			appendRetry(t, ctx, w, "us", "sf", r, key, fmt.Sprintf("p-%d", i))
			n++
		}
	}
	waitUntil(t, ctx, time.Minute, "eu holds the parent's records", func() bool {
		tails := w.tails(ctx, "sf")
		return len(tails["eu"]) > int(r) && tails["eu"][r] == before
	})
	spec, _ := w.nodes["eu"][outsider].streamSpec("sf")
	sub := subscribeAt(t, ctx, w.addrs["eu"][spec.replicasOf(r)[0]], "sf", r)

	m0 := nodeRangeMap(w.nodes["eu"][outsider], "sf")
	forged, err := splitDecision("sf", m0, r, 0)
	if err != nil {
		t.Fatal(err)
	}
	forgedReq := mirrorSplitRequest(w.nodes["eu"][outsider], "sf", forged, before)
	_, err = catalogueClient(t, w, "eu", outsider).RecordMirrorSplit(ctx, forgedReq)
	wantCode(t, err, apierr.PermissionDenied)
	if got := nodeRangeMap(w.nodes["eu"][outsider], "sf"); !got.Equal(m0) {
		t.Fatalf("a forged request changed eu's map: %+v", got)
	}

	start := time.Now()
	res, err := w.nodes["us"][1].splitRange(ctx, "sf", r, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := nodeRangeMap(w.nodes["us"][1], "sf")
	counts := map[uint32]int{}
	for i := 0; counts[res.decision.Left] < 10 || counts[res.decision.Right] < 10; i++ {
		key := fmt.Sprintf("key-%d", i)
		c := m.LookupKey([]byte(key))
		if c != res.decision.Left && c != res.decision.Right {
			continue
		}
		appendRetry(t, ctx, w, "us", "sf", c, key, fmt.Sprintf("c%d-%d", c, i))
		counts[c]++
	}
	ends := map[uint32]uint64{r: before, res.decision.Left: uint64(counts[res.decision.Left]), res.decision.Right: uint64(counts[res.decision.Right])}
	waitUntil(t, ctx, 2*time.Minute, "eu records the split and holds the children's records", func() bool {
		tails := w.tails(ctx, "sf")
		return len(tails["eu"]) == len(m.Ranges) && tails["eu"][res.decision.Left] == ends[res.decision.Left] &&
			tails["eu"][res.decision.Right] == ends[res.decision.Right]
	})
	t.Logf("eu holds the children's records %v after the split", time.Since(start).Round(time.Millisecond))
	if lead := w.nodes["eu"][outsider].region.meta.rep.LeaderID(); lead != outsider {
		t.Logf("eu's catalogue leader moved to node %d during the test", lead)
	}
	for id, n := range w.nodes["eu"] {
		waitUntil(t, ctx, time.Minute, fmt.Sprintf("eu node %d applies the split", id), func() bool {
			return nodeRangeMap(n, "sf").Version == m.Version
		})
		if got := nodeRangeMap(n, "sf"); !got.Equal(m) {
			t.Fatalf("eu node %d's range map %+v, the home's %+v", id, got, m)
		}
	}
	sameLogs(t, ctx, w, "us", "sf", ends, m)
	sub.waitFor(t, ctx, before+counts[res.decision.Left]+counts[res.decision.Right])
	checkForwardedRepeats(t, ctx, w, "sf", r, outsider, res)
}

// pickCatalogueOutsider returns a range of stream homed outside region
// and a voter of region's catalogue that holds no replica of it.
func pickCatalogueOutsider(t *testing.T, ctx context.Context, w *world, region, stream string, homes []string) (uint32, uint64) {
	t.Helper()
	var conf []uint64
	waitUntil(t, ctx, time.Minute, region+"'s catalogue has three voters", func() bool {
		conf = w.nodes[region][1].region.meta.rep.Conf().GetVoters()
		return len(conf) >= 3
	})
	spec, _ := w.nodes[region][1].streamSpec(stream)
	for r, home := range homes {
		if home == region {
			continue
		}
		reps := spec.replicasOf(uint32(r))
		for _, id := range conf {
			if len(reps) == 3 && !slices.Contains(reps, id) {
				return uint32(r), id
			}
		}
	}
	t.Fatalf("no range homed outside %s has a catalogue voter without a replica (homes %v, voters %v, placement %v)", region, homes, conf, spec.Replicas)
	return 0, 0
}

// moveCatalogueLeader hands region's catalogue leadership to node to.
func moveCatalogueLeader(t *testing.T, ctx context.Context, w *world, region string, to uint64) {
	t.Helper()
	waitUntil(t, ctx, time.Minute, fmt.Sprintf("node %d leads %s's catalogue", to, region), func() bool {
		lead := w.nodes[region][to].region.meta.rep.LeaderID()
		if lead == to {
			return true
		}
		if n := w.nodes[region][lead]; n != nil {
			_ = n.region.meta.exec(ctx, func() { n.region.meta.rep.TransferLeadership(to) })
		}
		time.Sleep(100 * time.Millisecond)
		return false
	})
}

// mirrorSplitRequest is the forwarded request of split dec at offset, in
// the name of node n.
func mirrorSplitRequest(n *Node, stream string, dec batch.Split, offset uint64) *geologinternalv1.RecordMirrorSplitRequest {
	spec, _ := n.streamSpec(stream)
	return &geologinternalv1.RecordMirrorSplitRequest{Region: n.cfg.Region, NodeId: n.cfg.NodeID, Stream: stream,
		StreamMetaOffset: spec.MetaOffset, SplitOffset: offset, MapVersion: dec.MapVersion, Parent: dec.Parent,
		HashStart: dec.HashStart, HashEnd: dec.HashEnd, At: dec.At, Left: dec.Left, Right: dec.Right}
}

// catalogueClient is a RegionCatalogue client of node id of region.
func catalogueClient(t *testing.T, w *world, region string, id uint64) geologinternalv1.RegionCatalogueClient {
	t.Helper()
	conn, err := grpc.NewClient(w.addrs[region][id], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return geologinternalv1.NewRegionCatalogueClient(conn)
}

// checkForwardedRepeats: once eu recorded the split res of range r, the
// request of a voter of r asked again is answered with the map's version,
// one with another offset is RANGE_SPLIT, one in the name of the
// non-replica outsider still PERMISSION_DENIED, one of a stream deleted
// since STREAM_NOT_FOUND, one at a node that does not lead the catalogue
// NOT_LEADER; eu's map is unchanged.
func checkForwardedRepeats(t *testing.T, ctx context.Context, w *world, stream string, r uint32, outsider uint64, res splitResult) {
	t.Helper()
	cat := w.nodes["eu"][outsider]
	lead := cat.region.meta.rep.LeaderID()
	if lead == 0 || w.nodes["eu"][lead] == nil {
		t.Fatalf("eu's catalogue has no leader")
	}
	spec, _ := cat.streamSpec(stream)
	voter := spec.replicasOf(r)[0]
	c := catalogueClient(t, w, "eu", lead)
	m := nodeRangeMap(cat, stream)
	resp, err := c.RecordMirrorSplit(ctx, mirrorSplitRequest(w.nodes["eu"][voter], stream, res.decision, res.offset))
	if err != nil || resp.GetRangeMapVersion() != m.Version {
		t.Fatalf("the voter's request repeated: %v, version %d, want %d", err, resp.GetRangeMapVersion(), m.Version)
	}
	_, err = c.RecordMirrorSplit(ctx, mirrorSplitRequest(w.nodes["eu"][voter], stream, res.decision, res.offset+1))
	wantCode(t, err, apierr.RangeSplit)
	_, err = c.RecordMirrorSplit(ctx, mirrorSplitRequest(w.nodes["eu"][outsider], stream, res.decision, res.offset))
	wantCode(t, err, apierr.PermissionDenied)
	stale := mirrorSplitRequest(w.nodes["eu"][voter], stream, res.decision, res.offset)
	stale.StreamMetaOffset++ // a stream of the name deleted since
	_, err = c.RecordMirrorSplit(ctx, stale)
	wantCode(t, err, apierr.StreamNotFound)
	for id := range w.nodes["eu"] {
		if id != lead {
			// A catalogue leader that lost its leadership: the sender asks
			// again, where the leader is now.
			_, err = catalogueClient(t, w, "eu", id).RecordMirrorSplit(ctx, mirrorSplitRequest(w.nodes["eu"][voter], stream, res.decision, res.offset))
			wantCode(t, err, apierr.NotLeader)
			break
		}
	}
	if got := nodeRangeMap(cat, stream); !got.Equal(m) {
		t.Fatalf("repeated requests changed eu's map: %+v, was %+v", got, m)
	}
}

// regionSubscriber counts what an SDK subscriber of one range, connected
// to one region's nodes, reads.
type regionSubscriber struct {
	mu   sync.Mutex
	seen map[string]bool // range/offset read
	err  error
}

// subscribeAt subscribes to range r of stream from offset 0 through the
// node at addr, until the test ends.
func subscribeAt(t *testing.T, ctx context.Context, addr, stream string, r uint32) *regionSubscriber {
	t.Helper()
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	s := &regionSubscriber{seen: map[string]bool{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rec, err := range c.Subscribe(sctx, stream, r, client.StartAt{}) {
			s.mu.Lock()
			if err != nil {
				if sctx.Err() == nil {
					s.err = err
				}
				s.mu.Unlock()
				return
			}
			s.seen[fmt.Sprintf("%d/%d", rec.Range, rec.Offset)] = true
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { stop(); wg.Wait(); c.Close() })
	return s
}

// waitFor waits until the subscriber read want distinct records.
func (s *regionSubscriber) waitFor(t *testing.T, ctx context.Context, want int) {
	t.Helper()
	waitUntil(t, ctx, time.Minute, fmt.Sprintf("the subscriber reads %d records across the split", want), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.err != nil {
			t.Fatalf("subscription: %v", s.err)
		}
		return len(s.seen) >= want
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) != want {
		t.Fatalf("the subscriber read %d distinct records, want %d", len(s.seen), want)
	}
}

// TestSplitSenderIdentity: with TLS, a forwarded mirror split is admitted
// only from a node of the region in its own name. It fails if a forged
// sender is admitted or an honest one refused.
func TestSplitSenderIdentity(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: Config{TLS: &tls.Config{}, Region: "eu"}, logger: hclog.NewNullLogger()}
	req := &geologinternalv1.RecordMirrorSplitRequest{Region: "eu", NodeId: 3, Stream: "s"}
	for _, c := range []struct {
		what string
		ctx  context.Context
		req  *geologinternalv1.RecordMirrorSplitRequest
		code apierr.Code // 0: admitted
	}{
		{"node 3 itself", callerCtx(t, pki.NodeIdentity("eu", 3)), req, 0},
		{"node 4 in 3's name", callerCtx(t, pki.NodeIdentity("eu", 4)), req, apierr.PermissionDenied},
		{"node 3 of another region", callerCtx(t, pki.NodeIdentity("us", 3)), req, apierr.PermissionDenied},
		{"a client", callerCtx(t, pki.ClientIdentity("alice")), req, apierr.PermissionDenied},
		{"no certificate", context.Background(), req, apierr.Unauthenticated},
		{"another region named", callerCtx(t, pki.NodeIdentity("eu", 3)),
			&geologinternalv1.RecordMirrorSplitRequest{Region: "us", NodeId: 3}, apierr.InvalidArgument},
		{"no node named", callerCtx(t, pki.NodeIdentity("eu", 3)),
			&geologinternalv1.RecordMirrorSplitRequest{Region: "eu"}, apierr.InvalidArgument},
	} {
		id, err := n.authorizeSplitSender(c.ctx, c.req)
		if got := apierr.As(err); (c.code == 0) != (err == nil) || (err != nil && got.Code != c.code) {
			t.Errorf("%s: %v, want code %v", c.what, err, c.code)
		}
		if err == nil && id != 3 {
			t.Errorf("%s: sender %d, want 3", c.what, id)
		}
	}
	if classOf(geologinternalv1.RegionCatalogue_RecordMirrorSplit_FullMethodName) != callRegion {
		t.Errorf("RecordMirrorSplit is not for the region's nodes only")
	}
}

// TestCheckMirrorSplit: the map check a forwarded split (and a marker in
// the catalogue leader's own log) passes before it is recorded. Each
// refusal is typed; the split already recorded is answered as recorded.
func TestCheckMirrorSplit(t *testing.T) {
	t.Parallel()
	m := keyspace.NewRangeMap(2)
	next, err := splitDecision("s", m, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	split, err := m.Split(1, next.At, 40)
	if err != nil {
		t.Fatal(err)
	}
	later, _ := splitDecision("s", split, 0, 0) // the map's version 2
	edit := func(f func(*batch.Split)) batch.Split { d := next; f(&d); return d }
	for _, c := range []struct {
		what     string
		m        keyspace.RangeMap
		r        uint32
		dec      batch.Split
		offset   uint64
		recorded bool
		code     apierr.Code // 0: may be recorded, or recorded
	}{
		{"the next split", m, 1, next, 40, false, 0},
		{"the split recorded", split, 1, next, 40, true, 0},
		{"recorded at another offset", split, 1, next, 41, false, apierr.RangeSplit},
		{"recorded at another boundary", split, 1, edit(func(d *batch.Split) { d.At++ }), 40, false, apierr.RangeSplit},
		{"a later split than the next", m, 0, edit(func(d *batch.Split) { *d = later }), 7, false, apierr.Unavailable},
		{"a stale version", split, 0, edit(func(d *batch.Split) { *d = later; d.MapVersion = 1 }), 7, false, apierr.InvalidArgument},
		{"another range's marker", m, 0, next, 40, false, apierr.InvalidArgument},
		{"other bounds", m, 1, edit(func(d *batch.Split) { d.HashStart++ }), 40, false, apierr.InvalidArgument},
		{"other children", m, 1, edit(func(d *batch.Split) { d.Left, d.Right = 5, 6 }), 40, false, apierr.InvalidArgument},
		{"a boundary outside", m, 1, edit(func(d *batch.Split) { d.At = d.HashStart }), 40, false, apierr.InvalidArgument},
		{"no such range", m, 9, edit(func(d *batch.Split) { d.Parent = 9 }), 40, false, apierr.RangeNotFound},
	} {
		recorded, err := checkMirrorSplit("s", c.m, c.r, c.dec, c.offset)
		if got := apierr.As(err); (c.code == 0) != (err == nil) || (err != nil && got.Code != c.code) || recorded != c.recorded {
			t.Errorf("%s: recorded %v, %v; want recorded %v, code %v", c.what, recorded, err, c.recorded, c.code)
		}
	}
}

// TestMirrorSplitRetries: a failed request waits longer each time, up to
// mirrorSplitRetryMax; a success, or the candidate gone, forgets it.
func TestMirrorSplitRetries(t *testing.T) {
	t.Parallel()
	rs := mirrorSplitRetries{}
	c := mirrorSplitCandidate{stream: "s", rng: 1}
	now := time.Unix(1000, 0)
	if !rs.due(c, now) {
		t.Fatal("a new candidate is not due")
	}
	var last time.Duration
	for i := 0; i < 12; i++ {
		rs.done(c, apierr.New(apierr.NotLeader, "moved"), now)
		wait := rs[keyOf(c)].next.Sub(now)
		if rs.due(c, now) || wait > mirrorSplitRetryMax || wait < mirrorSplitRetryMin/2 {
			t.Fatalf("attempt %d: due now, or a wait of %v outside [%v, %v]", i, wait, mirrorSplitRetryMin/2, mirrorSplitRetryMax)
		}
		if i == 11 && wait < mirrorSplitRetryMax/2 {
			t.Fatalf("after %d failures a wait of %v, want near %v", i+1, wait, mirrorSplitRetryMax)
		}
		last = wait
	}
	if !rs.due(c, now.Add(last)) {
		t.Fatal("not due once its wait passed")
	}
	rs.done(c, nil, now)
	if len(rs) != 0 {
		t.Fatal("a recorded split is still retried")
	}
	rs.done(c, apierr.New(apierr.NotLeader, "moved"), now)
	rs.keepOnly(nil)
	if len(rs) != 0 {
		t.Fatal("a candidate no longer listed is still retried")
	}
}
