package regionsvc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var linkCutDuration = flag.Duration("linkcut", 5*time.Second, "how long TestMirrorCatchesUpAfterLinkCut cuts a region off (the issue's run is 30s)")

// world is several regions of replicated nodes in this process, joined by
// emulated WAN links: every node reaches another region's node through the
// link "<from>-><to>.n<id>".
type world struct {
	t       *testing.T
	regions []string
	net     *wan.Net
	nodes   map[string]map[uint64]*Node
	addrs   map[string]map[uint64]string // node listen addresses
	dirs    map[string]map[uint64]string
	conns   map[string]map[uint64]geologv1.LogClient
	remote  map[string]map[string][]string // region → other region → link addresses
	size    int
	mut     func(region string, id uint64, cfg *Config) // adjusts a node's config, if set
}

func newWorld(t *testing.T, regions []string, size int, latency, jitter time.Duration) *world {
	return newWorldWith(t, regions, size, latency, jitter, nil, nil)
}

// newWorldWith is newWorld with a setup step run before any node starts
// and a hook adjusting every node's configuration.
func newWorldWith(t *testing.T, regions []string, size int, latency, jitter time.Duration, setup func(*world), mut func(region string, id uint64, cfg *Config)) *world {
	w := &world{t: t, regions: regions, size: size, net: wan.NewNet(hclog.NewNullLogger()), mut: mut,
		nodes: map[string]map[uint64]*Node{}, addrs: map[string]map[uint64]string{}, dirs: map[string]map[uint64]string{},
		conns: map[string]map[uint64]geologv1.LogClient{}, remote: map[string]map[string][]string{}}
	t.Cleanup(func() { w.net.Close() })
	for _, r := range regions {
		w.nodes[r], w.addrs[r], w.dirs[r], w.conns[r] = map[uint64]*Node{}, map[uint64]string{}, map[uint64]string{}, map[uint64]geologv1.LogClient{}
		for id := uint64(1); id <= uint64(size); id++ {
			w.addrs[r][id] = freeAddr(t)
			w.dirs[r][id] = t.TempDir()
		}
	}
	for i, from := range regions {
		w.remote[from] = map[string][]string{}
		for _, to := range regions {
			if to == from {
				continue
			}
			for id := uint64(1); id <= uint64(size); id++ {
				l, err := w.net.Add(wan.Config{Name: fmt.Sprintf("%s->%s.n%d", from, to, id), From: from, To: to,
					Upstream: w.addrs[to][id], Latency: latency, Jitter: jitter, Seed: uint64(i)*100 + id})
				if err != nil {
					t.Fatal(err)
				}
				w.remote[from][to] = append(w.remote[from][to], l.Addr())
			}
		}
	}
	if setup != nil {
		setup(w)
	}
	for _, r := range regions {
		for id := uint64(1); id <= uint64(size); id++ {
			w.start(r, id)
		}
	}
	t.Cleanup(func() {
		for _, r := range regions {
			for id := range w.nodes[r] {
				w.stop(r, id)
			}
		}
	})
	return w
}

func (w *world) start(region string, id uint64) {
	cfg := Config{
		DataDir: w.dirs[region][id], ListenAddr: w.addrs[region][id], Region: region, Regions: w.remote[region],
		// A 50 ms tick: elections after 400-800 ms of silence. With 20 ms
		// (160-320 ms) a busy machine's scheduling delays alone deposed
		// leaders every few seconds ("quorum is not active").
		NodeID: id, Peers: w.addrs[region], TickInterval: testTick(50 * time.Millisecond), Fsync: 1, // FsyncNever: the test is about replication
		Logger: hclog.New(&hclog.LoggerOptions{Output: tWriter{w.t}, Level: hclog.Warn, Name: region}),
	}
	if w.mut != nil {
		w.mut(region, id, &cfg)
	}
	n, err := New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		w.t.Fatal(err)
	}
	conn, err := grpc.NewClient(w.addrs[region][id], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { conn.Close() })
	w.nodes[region][id], w.conns[region][id] = n, geologv1.NewLogClient(conn)
}

func (w *world) stop(region string, id uint64) {
	if n := w.nodes[region][id]; n != nil {
		n.Close()
		delete(w.nodes[region], id)
		delete(w.conns[region], id)
	}
}

// regionAddrs is a region's node addresses, for an SDK client in it.
func (w *world) regionAddrs(region string) string {
	var out []string
	for id := uint64(1); id <= uint64(w.size); id++ {
		out = append(out, w.addrs[region][id])
	}
	return strings.Join(out, ",")
}

// readLocal reads [from, to) of a range from one region's copy (any live
// node that has it committed), as records.
func (w *world) readLocal(ctx context.Context, region string, stream string, rng uint32, from, to uint64) ([]*geologv1.StoredRecord, error) {
	var out []*geologv1.StoredRecord
	for from < to {
		var res *geologv1.ReadResponse
		var err error
		for _, c := range w.conns[region] {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err = c.Read(cctx, &geologv1.ReadRequest{Stream: stream, Range: rng, FromOffset: from, MaxRecords: 2000, MaxBytes: 4 << 20,
				Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: to})
			cancel()
			if err == nil {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		for _, r := range res.GetRecords() {
			if r.GetOffset() >= to {
				return out, nil
			}
			out = append(out, r)
		}
		if len(res.GetRecords()) == 0 {
			return nil, fmt.Errorf("read %s/%d at %d in %s returned nothing", stream, rng, from, region)
		}
		from = res.GetRecords()[len(res.GetRecords())-1].GetOffset() + 1
	}
	return out, nil
}

// tails returns each region's committed tail of every range, from each
// region's own view (the highest any of its live nodes reports).
func (w *world) tails(ctx context.Context, stream string) map[string][]uint64 {
	out := map[string][]uint64{}
	for _, region := range w.regions {
		for _, c := range w.conns[region] {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			d, err := c.DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
			cancel()
			if err != nil {
				continue
			}
			if n := len(d.GetRanges()); len(out[region]) < n {
				// A node that applied a split knows more ranges than one
				// that has not yet.
				out[region] = append(out[region], make([]uint64, n-len(out[region]))...)
			}
			for i, r := range d.GetRanges() {
				out[region][i] = max(out[region][i], r.GetTailOffset())
			}
		}
	}
	return out
}

// recordHash is what must be identical at an offset in every region: the
// record as appended, with the home's epoch and append time.
func recordHash(h interface{ Write([]byte) (int, error) }, r *geologv1.StoredRecord) {
	var b [32]byte
	binary.LittleEndian.PutUint64(b[0:], r.GetOffset())
	binary.LittleEndian.PutUint64(b[8:], r.GetEpoch())
	binary.LittleEndian.PutUint64(b[16:], uint64(r.GetAppendTimeUnixNanos()))
	binary.LittleEndian.PutUint64(b[24:], uint64(r.GetProducerTimeUnixNanos()))
	h.Write(b[:])
	h.Write([]byte(fmt.Sprintf("%d:%s|%d:%s", len(r.GetKey()), r.GetKey(), len(r.GetValue()), r.GetValue())))
}

func sameRecord(a, b *geologv1.StoredRecord) bool {
	return a.GetOffset() == b.GetOffset() && string(a.GetKey()) == string(b.GetKey()) && string(a.GetValue()) == string(b.GetValue()) &&
		a.GetEpoch() == b.GetEpoch() && a.GetAppendTimeUnixNanos() == b.GetAppendTimeUnixNanos()
}

// geoWorkload runs idempotent producers, one per region, each writing keyed
// records through an SDK client that knows only its own region's nodes
// (appends to ranges homed elsewhere follow NOT_HOME across the WAN).
type geoWorkload struct {
	mu       sync.Mutex
	acked    map[uint32]map[uint64]string // range → offset → value
	failures []error
	produced int
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startGeoWorkload(t *testing.T, ctx context.Context, w *world, stream string, ratePerRegion int) *geoWorkload {
	g := &geoWorkload{acked: map[uint32]map[uint64]string{}, stop: make(chan struct{})}
	for _, region := range w.regions {
		c, err := client.New(w.regionAddrs(region), client.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		p, err := c.NewProducer(stream, client.InflightBatchesMax(4), client.ProducerRetryBackoff(10*time.Millisecond, 200*time.Millisecond),
			client.DeliveryTimeout(3*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer p.Close()
			tick := time.NewTicker(time.Second / time.Duration(ratePerRegion))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-g.stop:
					if err := p.Flush(ctx); err != nil {
						g.mu.Lock()
						g.failures = append(g.failures, err)
						g.mu.Unlock()
					}
					return
				case <-tick.C:
				}
				value := fmt.Sprintf("%s/%08d", region, i)
				g.mu.Lock()
				g.produced++
				g.mu.Unlock()
				p.Produce(ctx, &client.Record{Key: []byte(fmt.Sprintf("%s-key-%d", region, i%7)), Value: []byte(value)},
					func(r client.ProduceResult, err error) {
						g.mu.Lock()
						defer g.mu.Unlock()
						if err != nil {
							g.failures = append(g.failures, err)
							return
						}
						if g.acked[r.Range] == nil {
							g.acked[r.Range] = map[uint64]string{}
						}
						g.acked[r.Range][r.Offset] = value
					})
			}
		}()
	}
	return g
}

func (g *geoWorkload) finish(t *testing.T) {
	close(g.stop)
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.failures) > 0 {
		t.Fatalf("%d produce failures (first: %v)", len(g.failures), g.failures[0])
	}
	n := 0
	for _, m := range g.acked {
		n += len(m)
	}
	if n != g.produced {
		t.Fatalf("%d produced, %d acked", g.produced, n)
	}
}

// prefixChecker checks, each time it runs, that every mirror is a prefix of
// its home log: the records a mirror holds beyond what was checked before
// equal the home's at the same offsets.
type prefixChecker struct {
	w       *world
	stream  string
	homes   []string
	checked map[string][]uint64 // region → range → offsets verified
	checks  int
}

func (pc *prefixChecker) check(ctx context.Context, t *testing.T) {
	pc.checks++
	tails := pc.w.tails(ctx, pc.stream)
	for rng, home := range pc.homes {
		for _, region := range pc.w.regions {
			if region == home || tails[region] == nil {
				continue
			}
			from, to := pc.checked[region][rng], tails[region][rng]
			if to <= from {
				continue
			}
			mirror, err := pc.w.readLocal(ctx, region, pc.stream, uint32(rng), from, to)
			if err != nil {
				t.Fatalf("read mirror %s range %d: %v", region, rng, err)
			}
			homeRecs, err := pc.w.readLocal(ctx, home, pc.stream, uint32(rng), from, to)
			if err != nil {
				t.Fatalf("read home %s range %d [%d, %d) (the mirror in %s has it, so the home must): %v", home, rng, from, to, region, err)
			}
			if len(mirror) != len(homeRecs) {
				t.Fatalf("range %d: mirror %s has %d records in [%d, %d), home %s has %d", rng, region, len(mirror), from, to, home, len(homeRecs))
			}
			for i := range mirror {
				if mirror[i].GetOffset() != from+uint64(i) {
					t.Fatalf("range %d: mirror %s has offset %d where %d was expected (a gap)", rng, region, mirror[i].GetOffset(), from+uint64(i))
				}
				if !sameRecord(mirror[i], homeRecs[i]) {
					t.Fatalf("range %d offset %d: mirror %s holds %q (epoch %d), home %s holds %q (epoch %d)", rng, mirror[i].GetOffset(),
						region, mirror[i].GetValue(), mirror[i].GetEpoch(), home, homeRecs[i].GetValue(), homeRecs[i].GetEpoch())
				}
			}
			pc.checked[region][rng] = to
		}
	}
}

// converge waits until every mirror's tail equals its home's, then checks
// that every region holds the same log for every range (a hash over each
// range's records) and that it holds every acked record at its offset.
func converge(t *testing.T, ctx context.Context, w *world, stream string, homes []string, acked map[uint32]map[uint64]string) map[string][]uint64 {
	var tails map[string][]uint64
	waitUntil(t, ctx, 2*time.Minute, "mirrors caught up with their homes", func() bool {
		tails = w.tails(ctx, stream)
		for rng, home := range homes {
			for _, region := range w.regions {
				if tails[region] == nil || tails[region][rng] != tails[home][rng] {
					return false
				}
			}
		}
		return true
	})
	for rng, home := range homes {
		var ref []byte
		for _, region := range w.regions {
			recs, err := w.readLocal(ctx, region, stream, uint32(rng), 0, tails[home][rng])
			if err != nil {
				t.Fatalf("read %s range %d: %v", region, rng, err)
			}
			h := sha256.New()
			for i, r := range recs {
				if r.GetOffset() != uint64(i) {
					t.Fatalf("%s range %d: offset %d at position %d", region, rng, r.GetOffset(), i)
				}
				recordHash(h, r)
			}
			sum := h.Sum(nil)
			if ref == nil {
				ref = sum
				// The home holds every acked record at its acked offset.
				for off, v := range acked[uint32(rng)] {
					if off >= uint64(len(recs)) || string(recs[off].GetValue()) != v {
						t.Fatalf("range %d: acked %q at %d is not in the home log", rng, v, off)
					}
				}
				if len(recs) != len(acked[uint32(rng)]) {
					t.Fatalf("range %d: home log holds %d records, %d were acked", rng, len(recs), len(acked[uint32(rng)]))
				}
			} else if string(sum) != string(ref) {
				t.Fatalf("range %d: the log in %s differs from the home's (%s)", rng, region, home)
			}
		}
		t.Logf("range %d (home %s): %d records, identical in %v", rng, home, tails[home][rng], w.regions)
	}
	return tails
}

func waitUntil(t *testing.T, ctx context.Context, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func createGeoStream(t *testing.T, ctx context.Context, w *world, name string, ranges uint32) []string {
	c, err := client.New(w.regionAddrs(w.regions[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var info *client.StreamInfo
	waitUntil(t, ctx, time.Minute, "stream created in every region", func() bool {
		i, err := c.CreateStream(ctx, client.StreamConfig{Name: name, RangeCount: ranges, Regions: w.regions, HomeRegion: "spread"})
		if err != nil && client.CodeOf(err) != client.CodeStreamExists {
			t.Logf("create stream: %v", err)
		}
		if i != nil {
			info = i
		}
		return err == nil || (info != nil && client.CodeOf(err) == client.CodeStreamExists)
	})
	// Every region knows it.
	waitUntil(t, ctx, time.Minute, "stream visible everywhere", func() bool {
		for _, region := range w.regions {
			for _, c := range w.conns[region] {
				if _, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: name}); err != nil {
					return false
				}
			}
		}
		return true
	})
	return info.RangeHomes
}

// TestMultiRegionMirrorsArePrefixes: three regions of three nodes with
// emulated WAN latency, a stream with one range homed in each region, and
// producers in every region. While they run, every mirror is at every check
// a prefix of its home log; after they stop, every mirror equals its home
// (a hash over each range), with every acked record at its offset.
func TestMultiRegionMirrorsArePrefixes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu", "ap"}, 3, 15*time.Millisecond, 5*time.Millisecond)
	homes := createGeoStream(t, ctx, w, "geo", 3)
	if fmt.Sprint(homes) != "[us eu ap]" {
		t.Fatalf("homes %v, want one range in each region", homes)
	}
	g := startGeoWorkload(t, ctx, w, "geo", 150)
	pc := &prefixChecker{w: w, stream: "geo", homes: homes, checked: map[string][]uint64{}}
	for _, r := range w.regions {
		pc.checked[r] = make([]uint64, len(homes))
	}
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		pc.check(ctx, t)
		time.Sleep(200 * time.Millisecond)
	}
	g.finish(t)
	pc.check(ctx, t)
	converge(t, ctx, w, "geo", homes, g.acked)
	t.Logf("%d prefix checks passed", pc.checks)
	// Nothing failed: no mirror took a batch for a gap (a mirror that
	// answered an apply before its applied end showed it did, and each
	// such gap cost its source a round trip).
	var gaps, batches uint64
	for _, r := range w.regions {
		for _, n := range w.nodes[r] {
			st := n.replServer.Stats()
			gaps, batches = gaps+st.Gaps, batches+st.Batches
		}
	}
	if gaps != 0 {
		t.Fatalf("mirrors refused %d of %d batches for a gap with no fault injected", gaps, batches)
	}

	// A mirror's leader sends producers straight to the home leader (named
	// by the home's heartbeats, which only it receives), at the address the
	// home leader advertises (here its listen address), not at this node's
	// link to it.
	// (The leader is looked up on every poll: on a loaded machine it may
	// move meanwhile.)
	for rng, home := range homes {
		homeLeader := func() uint64 {
			for id, n := range w.nodes[home] {
				n.mu.RLock()
				led := n.streams["geo"] != nil && n.streams["geo"].ranges[rng].rep.LeaderID() == id
				n.mu.RUnlock()
				if led {
					return id
				}
			}
			return 0
		}
		for _, region := range w.regions {
			if region == home {
				continue
			}
			var last string
			// A mirror learns the home leader from the home's heartbeats;
			// on a loaded machine leaders move often, so allow a minute.
			waitUntil(t, ctx, time.Minute, "NOT_HOME names the home leader", func() bool {
				leader := homeLeader()
				if leader == 0 {
					return false
				}
				want := w.addrs[home][leader]
				asked := 0
				for id, c := range w.conns[region] {
					n := w.nodes[region][id]
					n.mu.RLock()
					led := n.streams["geo"].ranges[rng].rep.LeaderID() == id
					n.mu.RUnlock()
					if !led {
						continue
					}
					_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "geo", Range: uint32(rng), Records: recs("x", 1)})
					if e := rpcerr.FromError(err); e.Code != apierr.NotHome || e.LeaderHint != want {
						if msg := fmt.Sprintf("range %d, %s n%d: %v (want a hint to %s n%d at %s)", rng, region, id, err, home, leader, want); msg != last {
							last = msg
							t.Log(msg)
						}
						return false
					}
					asked++
				}
				return asked == 1
			})
		}
	}

	// Once caught up, each home leader reports every mirror, with no
	// offset lag (acks and heartbeats cross the WAN: poll for it).
	waitUntil(t, ctx, 30*time.Second, "home leaders report zero offset lag", func() bool {
		for rng, home := range homes {
			reported := false
			for _, c := range w.conns[home] {
				d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "geo"})
				if err != nil {
					continue
				}
				repl := d.GetRanges()[rng].GetReplication()
				if len(repl) == 0 {
					continue // not the leader
				}
				if len(repl) != 2 {
					t.Fatalf("range %d: the home leader reports %d mirrors, want 2", rng, len(repl))
				}
				for _, p := range repl {
					if p.GetOffsetLag() != 0 || p.GetAppliedEndOffset() != d.GetRanges()[rng].GetTailOffset() {
						return false
					}
				}
				reported = true
			}
			if !reported {
				return false
			}
		}
		return true
	})
}

// TestMirrorRefusesAppends: a producer talking to a mirror region's node is
// redirected to the home region (NOT_HOME with an address there); the
// SDK follows, so the record lands in the home log; and a mirror's own
// Append RPC answers NOT_HOME. Reads with consistency home see what was
// acked before them in every region.
func TestMirrorRefusesAppends(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 1, 50*time.Millisecond, 0)
	homes := createGeoStream(t, ctx, w, "m", 2)
	for rng, home := range homes {
		for _, region := range w.regions {
			if region == home {
				continue
			}
			_, err := w.conns[region][1].Append(ctx, &geologv1.AppendRequest{Stream: "m", Range: uint32(rng), Records: recs("x", 1)})
			wantCode(t, err, 12) // NOT_HOME
		}
	}
	c, err := client.New(w.regionAddrs("eu"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.NewProducer("m")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	results, err := p.ProduceSync(ctx, &client.Record{Key: []byte("k"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	res := results[0]
	if got, err := w.readLocal(ctx, homes[res.Range], "m", res.Range, res.Offset, res.Offset+1); err != nil || string(got[0].GetValue()) != "v" {
		t.Fatalf("the record is not in the home log: %v %v", got, err)
	}

	// Consistency home: a read in either region, right after an ack, sees
	// the acked record, although the mirror trails by a 50 ms WAN hop (the
	// node asks the home leader for its confirmed tail and waits for it).
	for i := 0; i < 10; i++ {
		v := fmt.Sprintf("home-read-%d", i)
		results, err := p.ProduceSync(ctx, &client.Record{Key: []byte(v), Value: []byte(v)})
		if err != nil {
			t.Fatal(err)
		}
		r := results[0]
		for _, region := range w.regions {
			resp, err := w.conns[region][1].Read(ctx, &geologv1.ReadRequest{Stream: "m", Range: r.Range, FromOffset: r.Offset, MaxRecords: 1,
				Consistency: geologv1.Consistency_CONSISTENCY_HOME})
			if err != nil {
				t.Fatalf("home read in %s: %v", region, err)
			}
			if len(resp.GetRecords()) != 1 || string(resp.GetRecords()[0].GetValue()) != v || resp.GetTailOffset() <= r.Offset {
				t.Fatalf("home read in %s of %d/%d right after its ack: %v (tail %d)", region, r.Range, r.Offset, resp.GetRecords(), resp.GetTailOffset())
			}
		}
	}
}

// TestMirrorCatchesUpAfterLinkCut cuts one region off from the others
// (every WAN link to and from it black-holed) for -linkcut while producers
// run, then heals: its mirrors catch up with no gap and no reordering (the
// prefix and convergence checks), and the lag it reports grew while cut.
// Then it stops the node leading a home range (its replicator dies with
// it) under load: the range's new leader resumes shipping where the
// mirrors are.
func TestMirrorCatchesUpAfterLinkCut(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+*linkCutDuration)
	defer cancel()
	w := newWorld(t, []string{"us", "eu", "ap"}, 3, 15*time.Millisecond, 5*time.Millisecond)
	homes := createGeoStream(t, ctx, w, "cut", 3)
	g := startGeoWorkload(t, ctx, w, "cut", 150)
	pc := &prefixChecker{w: w, stream: "cut", homes: homes, checked: map[string][]uint64{}}
	for _, r := range w.regions {
		pc.checked[r] = make([]uint64, len(homes))
	}
	time.Sleep(time.Second)
	if _, err := w.net.CutRegion("ap", wan.CutBlackhole); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	for time.Since(cutAt) < *linkCutDuration {
		pc.check(ctx, t)
		time.Sleep(500 * time.Millisecond)
	}
	// While cut, ap's mirror of the us-homed range (range 0) stalls, and
	// the lag its node reports has grown with the cut.
	// Both sides say so: the home leader (from the mirror's acks) and the
	// mirror's leader in ap (from the home's heartbeats).
	var lagSeen time.Duration
	for _, region := range []string{"us", "ap"} {
		for _, c := range w.conns[region] {
			d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "cut"})
			if err != nil {
				continue
			}
			for _, p := range d.GetRanges()[0].GetReplication() {
				if p.GetRegion() == "ap" {
					lagSeen = max(lagSeen, time.Duration(p.GetTimeLagMillis())*time.Millisecond)
				}
			}
		}
	}
	if lagSeen < *linkCutDuration/2 {
		t.Fatalf("after a %v cut the mirror in ap reports a time lag of %v", *linkCutDuration, lagSeen)
	}
	healAt := time.Now()
	backlogTails := w.tails(ctx, "cut")
	if err := w.net.HealAll(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, 2*time.Minute, "ap caught up with the us home", func() bool {
		tails := w.tails(ctx, "cut")
		return tails["ap"] != nil && tails["ap"][0] >= backlogTails["us"][0]
	})
	caughtUp := time.Since(healAt)
	backlog := backlogTails["us"][0] - backlogTails["ap"][0]
	t.Logf("cut %v: ap's mirror of range 0 was %d records behind (reported lag %v); caught up in %v after the heal (%.0f records/s)",
		*linkCutDuration, backlog, lagSeen, caughtUp.Round(time.Millisecond), float64(backlog)/caughtUp.Seconds())
	pc.check(ctx, t)

	// Stop the leader of the us-homed range: its replicator stops with it.
	var leader uint64
	waitUntil(t, ctx, time.Minute, "the us leader of range 0", func() bool {
		for id, n := range w.nodes["us"] {
			n.mu.RLock()
			st := n.streams["cut"]
			n.mu.RUnlock()
			if st != nil && st.ranges[0].rep != nil && st.ranges[0].rep.LeaderID() == id {
				leader = id
				return true
			}
		}
		return false
	})
	w.stop("us", leader)
	for i := 0; i < 6; i++ {
		pc.check(ctx, t)
		time.Sleep(500 * time.Millisecond)
	}
	w.start("us", leader)
	g.finish(t)
	pc.check(ctx, t)
	converge(t, ctx, w, "cut", homes, g.acked)
	t.Logf("%d prefix checks passed", pc.checks)
}

// freeAddr holds a free loopback port for the rest of the test
// (internal/portlock): a node stopped and started again finds its address
// still free, and no other test run takes it meanwhile.
func freeAddr(t *testing.T) string { return portlock.Addr(t) }

// TestMirrorApplyPublishesItsEnd: once a mirror's Apply returns, its
// AppliedEnd shows what it applied. The replicator's server checks the next
// batch against AppliedEnd: an Apply that returned first (its replies come
// from inside the driver's Ready cycle, before the driver publishes the
// committed end) made the next batch look like a gap, and the source lost
// a round trip resending it (tens of times a second under load).
func TestMirrorApplyPublishesItsEnd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 1, 5*time.Millisecond, 0)
	homes := createGeoStream(t, ctx, w, "pub", 2)
	if homes[0] != "us" {
		t.Fatalf("range 0 homed in %s, want us", homes[0])
	}
	// The replicator cannot deliver: this test applies to eu's mirror
	// itself, from the home's log.
	l, err := w.net.Link("us->eu.n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Cut(wan.CutBlackhole); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := w.conns["us"][1].Append(ctx, &geologv1.AppendRequest{Stream: "pub", Range: 0, Records: recs(fmt.Sprintf("p%d", i), 1+i%3)}); err != nil {
			t.Fatal(err)
		}
	}
	home, err := w.nodes["us"][1].rangeOf(ctx, "pub", 0)
	if err != nil {
		t.Fatal(err)
	}
	md, err := w.nodes["eu"][1].rangeOf(ctx, "pub", 0)
	if err != nil {
		t.Fatal(err)
	}
	m := &mirrorRange{driverSource: driverSource{d: md}, n: w.nodes["eu"][1]}
	tail := home.committed.Load()
	applies := 0
	for from := m.AppliedEnd(); from < tail; from = m.AppliedEnd() {
		frames, err := (driverSource{d: home}).ReadFrames(from, 1, tail)
		if err != nil || len(frames) == 0 {
			t.Fatalf("read the home's frames from %d: %d bytes, %v", from, len(frames), err)
		}
		size, _ := batch.FrameSize(frames)
		end, err := m.Apply(ctx, frames[:size])
		if err != nil {
			t.Fatalf("apply at %d: %v", from, err)
		}
		if got := m.AppliedEnd(); got < end {
			t.Fatalf("apply %d returned applied end %d, but AppliedEnd is %d", applies, end, got)
		}
		applies++
	}
	if applies == 0 {
		t.Fatal("the replicator delivered everything before the cut; nothing was applied here")
	}
	t.Logf("%d applies, each visible in AppliedEnd on return", applies)
}

// TestTaskShipsNothingPastTheFence: a replicator task's source (a home
// range, epoch set) ships nothing past the range's timeline fence, as a
// local reader reads nothing past it: a region that takes a range back
// after another epoch may hold its own earlier tail there, orphaned by the
// takeover, which its start gate forks off before the epoch's first frame.
// Shipped before, the mirrors would keep it (the simulator's seed 7705544).
// A mirror's own reads of its log (epoch 0: the overlap it compares) are
// not fenced. It fails if the task's source reads or reports past the
// fence.
func TestTaskShipsNothingPastTheFence(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 1, 5*time.Millisecond, 0)
	homes := createGeoStream(t, ctx, w, "fenced", 2)
	if homes[0] != "us" {
		t.Fatalf("range 0 homed in %s, want us", homes[0])
	}
	for i := range 20 {
		if _, err := w.conns["us"][1].Append(ctx, &geologv1.AppendRequest{Stream: "fenced", Range: 0, Records: recs(fmt.Sprintf("f%d", i), 1)}); err != nil {
			t.Fatal(err)
		}
	}
	home, err := w.nodes["us"][1].rangeOf(ctx, "fenced", 0)
	if err != nil {
		t.Fatal(err)
	}
	tail := home.committed.Load()
	if tail < 20 {
		t.Fatalf("committed %d, want 20", tail)
	}
	const fenceAt = 10
	// Held: the driver recomputes the fence (updateFence) under tl.mu.
	home.tl.mu.Lock()
	defer home.tl.mu.Unlock()
	home.tl.fence.Store(&timelineFence{offset: fenceAt, epoch: 3, logEpoch: 1})
	defer home.tl.fence.Store(nil)
	lastEnd := func(frames []byte) uint64 {
		var end uint64
		for len(frames) > 0 {
			size, err := batch.FrameSize(frames)
			if err != nil {
				t.Fatal(err)
			}
			h, err := batch.DecodeHeader(frames[:size])
			if err != nil {
				t.Fatal(err)
			}
			end, frames = h.NextOffset(), frames[size:]
		}
		return end
	}
	task := driverSource{d: home, epoch: 1}
	if got := task.CommittedEnd(); got != fenceAt {
		t.Errorf("task source's committed end %d, want the fence %d", got, fenceAt)
	}
	frames, err := task.ReadFrames(0, 1<<20, tail)
	if err != nil {
		t.Fatal(err)
	}
	if end := lastEnd(frames); end != fenceAt {
		t.Errorf("task source read to %d, want to the fence %d", end, fenceAt)
	}
	if frames, err := task.ReadFrames(fenceAt, 1<<20, tail); err != nil || len(frames) != 0 {
		t.Errorf("task source read %d bytes from the fence (%v), want none", len(frames), err)
	}
	own := driverSource{d: home}
	frames, err = own.ReadFrames(0, 1<<20, tail)
	if err != nil {
		t.Fatal(err)
	}
	if end := lastEnd(frames); end != tail {
		t.Errorf("a copy's own read reached %d, want its committed end %d", end, tail)
	}
}
