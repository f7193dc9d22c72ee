// Package drill holds operator drills run against a live local cluster
// (scripts/cluster.sh up, with homing on): whole-region failover and
// planned rehome under load, with their figures. They are skipped unless
// -cluster names the cluster's env file; `make drill` brings a cluster up
// and runs them.
package drill

import (
	"bufio"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

var (
	clusterEnv = flag.String("cluster", "", "the env file of a running local cluster (run/cluster/env); the drills are skipped without it")
	runs       = flag.Int("runs", 5, "region failovers in TestRegionFailoverDrill")
	moves      = flag.Int("moves", 12, "planned rehomes in TestRehomeDrill")
	rate       = flag.Int("rate", 200, "records per second per producer region")
	leaseTTL   = flag.Duration("lease-ttl", 4*time.Second, "the cluster's lease TTL (for the failover bound)")
)

type cluster struct {
	root  string
	addrs map[string]string // region → its nodes' addresses
	tls   *tls.Config       // the env file's GEOLOG_CERTS_DIR; nil: plaintext
}

func attach(t *testing.T) *cluster {
	if *clusterEnv == "" {
		t.Skip("no -cluster env file: run `make drill`")
	}
	f, err := os.Open(*clusterEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := &cluster{addrs: map[string]string{}}
	abs, _ := filepath.Abs(*clusterEnv)
	c.root = filepath.Dir(filepath.Dir(filepath.Dir(abs))) // run/cluster/env → project
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "export ")
		k, v, ok := strings.Cut(line, "=")
		if ok && k == "GEOLOG_CERTS_DIR" {
			dir := strings.Trim(v, "'\"")
			cfg, err := pki.ClientConfig(filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.ClientCertFile), filepath.Join(dir, pki.ClientKeyFile), "")
			if err != nil {
				t.Fatal(err)
			}
			c.tls = cfg
		}
		if !ok || !strings.HasPrefix(k, "GEOLOG_ADDR_") || k == "GEOLOG_ADDR_ALL" {
			continue
		}
		c.addrs[strings.ToLower(strings.TrimPrefix(k, "GEOLOG_ADDR_"))] = v
	}
	if len(c.addrs) < 3 {
		t.Fatalf("%s lists %d regions; want 3", *clusterEnv, len(c.addrs))
	}
	return c
}

// tlsOpt adds the cluster's client certificate to opts.
func (c *cluster) tlsOpt(opts ...client.Opt) []client.Opt {
	if c.tls != nil {
		opts = append(opts, client.TLSConfig(c.tls))
	}
	return opts
}

// creds are the gRPC credentials of a client of the cluster.
func (c *cluster) creds() credentials.TransportCredentials {
	if c.tls != nil {
		return credentials.NewTLS(c.tls)
	}
	return insecure.NewCredentials()
}

// ctl runs scripts/cluster.sh with args.
func (c *cluster) ctl(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.root, "scripts/cluster.sh"), args...)
	cmd.Dir = c.root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cluster.sh %v: %v\n%s", args, err, out)
	}
}

func (c *cluster) client(t *testing.T, region string) *client.Client {
	cl, err := client.New(c.addrs[region], c.tlsOpt(client.RetryBackoff(20*time.Millisecond, 200*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

type ack struct {
	key    string
	seq    int
	value  string
	rng    uint32
	offset uint64
	epoch  uint64
	at     time.Time
}

type workload struct {
	mu    sync.Mutex
	acks  []ack
	fails []error
	stop  chan struct{}
	wg    sync.WaitGroup
}

// produce runs one idempotent producer per region of regions at rate.
func (c *cluster) produce(t *testing.T, ctx context.Context, stream string, regions []string) *workload {
	w := &workload{stop: make(chan struct{})}
	for _, region := range regions {
		p, err := c.client(t, region).NewProducer(stream, client.InflightBatchesMax(2),
			client.ProducerRetryBackoff(20*time.Millisecond, 200*time.Millisecond), client.DeliveryTimeout(2*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer p.Close()
			tick := time.NewTicker(time.Second / time.Duration(*rate))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-w.stop:
					fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
					if err := p.Flush(fctx); err != nil {
						w.mu.Lock()
						w.fails = append(w.fails, err)
						w.mu.Unlock()
					}
					cancel()
					return
				case <-tick.C:
				}
				key := fmt.Sprintf("%s-k%d", region, i%16)
				seq := i / 16
				value := fmt.Sprintf("%s/%d", key, seq)
				p.Produce(ctx, &client.Record{Key: []byte(key), Value: []byte(value)}, func(r client.ProduceResult, err error) {
					w.mu.Lock()
					defer w.mu.Unlock()
					if err != nil {
						w.fails = append(w.fails, err)
						return
					}
					w.acks = append(w.acks, ack{key: key, seq: seq, value: value, rng: r.Range, offset: r.Offset, epoch: r.Epoch, at: time.Now()})
				})
			}
		}()
	}
	return w
}

func (w *workload) finish() {
	close(w.stop)
	w.wg.Wait()
}

func (c *cluster) createStream(t *testing.T, ctx context.Context, name, home string, ranges uint32) {
	cl := c.client(t, home)
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := cl.CreateStream(ctx, client.StreamConfig{Name: name, RangeCount: ranges, Regions: []string{"us", "eu", "ap"}, HomeRegion: home})
		if err == nil || client.CodeOf(err) == client.CodeStreamExists {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("create %s: %v", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// readRange reads a range's whole log from region's copy, up to the tail
// the home leader confirms.
func (c *cluster) readRange(t *testing.T, ctx context.Context, region, stream string, rng uint32) []*geologv1.StoredRecord {
	cl := c.client(t, region)
	var out []*geologv1.StoredRecord
	for from := uint64(0); ; {
		res, err := cl.Read(ctx, stream, rng, from, client.ReadOptions{Consistency: client.ConsistencyHome, MaxRecords: 5000, MaxBytes: 4 << 20})
		if client.CodeOf(err) == client.CodeOffsetOutOfRange && from > 0 {
			return out
		}
		if err != nil {
			t.Fatalf("read %s %s/%d from %d: %v", region, stream, rng, from, err)
		}
		for _, r := range res.Records {
			out = append(out, &geologv1.StoredRecord{Offset: r.Offset, Value: r.Value, Epoch: r.Epoch})
		}
		if res.NextOffset >= res.TailOffset || len(res.Records) == 0 {
			return out
		}
		from = res.NextOffset
	}
}

// waitFailback waits until the returned region's copy of every range
// equals the new home's (as read from another surviving region), then
// reads the returned region's orphan log: range → offset → record.
func (c *cluster) waitFailback(t *testing.T, ctx context.Context, returned, survivor, stream string, ranges uint32) map[uint32]map[uint64]*geologv1.StoredRecord {
	t.Helper()
	admin := c.admin(t, returned)
	deadline := time.Now().Add(2 * time.Minute)
	for r := uint32(0); r < ranges; r++ {
		for {
			want := c.readRange(t, ctx, survivor, stream, r)
			got, err := c.tryReadLocal(ctx, returned, stream, r, uint64(len(want)))
			if err == nil && len(got) == len(want) {
				same := true
				for i := range got {
					same = same && string(got[i].Value) == string(want[i].GetValue()) && got[i].Epoch == want[i].GetEpoch()
				}
				if same {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's copy of %s/%d did not come to equal the new home's (%d records): %v", returned, stream, r, len(want), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	out := map[uint32]map[uint64]*geologv1.StoredRecord{}
	forks, err := admin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: stream})
	if err != nil {
		t.Fatalf("list orphans in %s: %v", returned, err)
	}
	for _, f := range forks.GetForks() {
		if out[f.GetRange()] == nil {
			out[f.GetRange()] = map[uint64]*geologv1.StoredRecord{}
		}
		for from := f.GetFirstOffset(); from < f.GetNextOffset(); {
			res, err := admin.ReadOrphans(ctx, &geologv1.ReadOrphansRequest{Stream: stream, Range: f.GetRange(), ForkIndex: f.GetForkIndex(), FromOffset: from})
			if err != nil {
				t.Fatalf("read orphans in %s: %v", returned, err)
			}
			for _, r := range res.GetRecords() {
				out[f.GetRange()][r.GetOffset()] = r
			}
			if res.GetNextOffset() <= from {
				break
			}
			from = res.GetNextOffset()
		}
	}
	return out
}

// tryReadLocal reads [0, n) of a range from region's own copy.
func (c *cluster) tryReadLocal(ctx context.Context, region, stream string, rng uint32, n uint64) ([]client.StoredRecord, error) {
	cl, err := client.New(c.addrs[region], c.tlsOpt()...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []client.StoredRecord
	for from := uint64(0); from < n; {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := cl.Read(cctx, stream, rng, from, client.ReadOptions{Consistency: client.ConsistencyMinOffset, MinOffset: n, MaxRecords: 5000, MaxBytes: 4 << 20})
		cancel()
		if err != nil {
			return out, err
		}
		if len(res.Records) == 0 {
			return out, nil
		}
		out = append(out, res.Records...)
		from = res.NextOffset
	}
	return out, nil
}

func (c *cluster) admin(t *testing.T, region string) geologv1.AdminClient {
	conn, err := grpc.NewClient(strings.Split(c.addrs[region], ",")[0], grpc.WithTransportCredentials(c.creds()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return geologv1.NewAdminClient(conn)
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	// Nearest rank: with fewer than 100 samples, p99 is the largest.
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(i, 0)]
}

// TestRegionFailoverDrill kills every node of a stream's home region under
// load, -runs times (the home rotates over the regions), and reports the
// failover time (kill → first ack under the new epoch) and the records
// orphaned (acked by the old home, past the fork: the RPO suffered). It
// checks the invariants on the new home's log: acked records at their
// offsets or past the fork, no duplicates, per-key order.
func TestRegionFailoverDrill(t *testing.T) {
	c := attach(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	regions := []string{"us", "eu", "ap"}
	var times []time.Duration
	var rpo []int
	for run := 0; run < *runs; run++ {
		home := regions[run%3]
		var others []string
		for _, r := range regions {
			if r != home {
				others = append(others, r)
			}
		}
		stream := fmt.Sprintf("fo%d-%d", run, time.Now().Unix())
		c.createStream(t, ctx, stream, home, 4)
		w := c.produce(t, ctx, stream, others)
		time.Sleep(3 * time.Second)
		killAt := time.Now()
		c.ctl(t, "kill", home)
		var first time.Time
		for first.IsZero() {
			if time.Since(killAt) > 2*time.Minute {
				t.Fatalf("run %d: no ack under a new epoch 2 minutes after killing %s", run, home)
			}
			time.Sleep(20 * time.Millisecond)
			w.mu.Lock()
			for _, a := range w.acks {
				if a.epoch >= 2 && (first.IsZero() || a.at.Before(first)) {
					first = a.at
				}
			}
			w.mu.Unlock()
		}
		took := first.Sub(killAt)
		times = append(times, took)
		time.Sleep(2 * time.Second)
		w.finish()
		c.ctl(t, "start", home)
		if len(w.fails) > 0 {
			t.Fatalf("run %d: %d produce failures (first: %v)", run, len(w.fails), w.fails[0])
		}
		// Failback: the old home returns as a mirror and forks its
		// divergent tail off into its orphan log.
		orphanLog := c.waitFailback(t, ctx, home, others[0], stream, 4)
		orphaned := 0
		for rng := uint32(0); rng < 4; rng++ {
			recs := c.readRange(t, ctx, others[0], stream, rng)
			byOff := map[uint64]*geologv1.StoredRecord{}
			seen := map[string]bool{}
			fork := ^uint64(0)
			for _, r := range recs {
				byOff[r.GetOffset()] = r
				if seen[string(r.GetValue())] {
					t.Fatalf("run %d range %d: %q twice", run, rng, r.GetValue())
				}
				seen[string(r.GetValue())] = true
				if r.GetEpoch() >= 2 && fork == ^uint64(0) {
					fork = r.GetOffset()
				}
			}
			last := map[string]uint64{}
			lastSeq := map[string]int{}
			for _, a := range w.acks {
				if a.rng != rng {
					continue
				}
				r, ok := byOff[a.offset]
				switch {
				case ok && string(r.GetValue()) == a.value:
				case a.epoch < 2 && a.offset >= fork:
					o, ok := orphanLog[rng][a.offset]
					if !ok || string(o.GetValue()) != a.value || o.GetEpoch() != a.epoch {
						t.Fatalf("run %d range %d: %q acked at %d (epoch %d) is neither in the new home's log nor in %s's orphan log", run, rng, a.value, a.offset, a.epoch, home)
					}
					orphaned++
					continue
				default:
					t.Fatalf("run %d range %d: %q acked at %d (epoch %d) is not in the new home's log (fork %d)", run, rng, a.value, a.offset, a.epoch, fork)
				}
				if s, ok := lastSeq[a.key]; ok && a.seq > s && a.offset <= last[a.key] {
					t.Fatalf("run %d key %s: seq %d at offset %d after seq %d at %d", run, a.key, a.seq, a.offset, s, last[a.key])
				}
				if s, ok := lastSeq[a.key]; !ok || a.seq > s {
					lastSeq[a.key], last[a.key] = a.seq, a.offset
				}
			}
		}
		rpo = append(rpo, orphaned)
		t.Logf("run %d: killed %s; first ack under the new epoch after %v; %d acks; %d acked records orphaned (RPO)", run, home, took.Round(time.Millisecond), len(w.acks), orphaned)
		// Let the returned region rejoin before the next run.
		time.Sleep(5 * time.Second)
	}
	t.Logf("region failover over %d runs: p50 %v, p99 %v, max %v (lease TTL %v; bound TTL + 2s = %v); orphaned per run %v",
		len(times), percentile(times, 0.5).Round(time.Millisecond), percentile(times, 0.99).Round(time.Millisecond),
		percentile(times, 1).Round(time.Millisecond), *leaseTTL, *leaseTTL+2*time.Second, rpo)
}

// TestRehomeDrill moves a stream's homes around the regions under load
// (-moves planned rehomes of every range) and reports the pause; every
// acked record must be in the final home's log at its offset, none twice.
func TestRehomeDrill(t *testing.T) {
	c := attach(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	stream := fmt.Sprintf("rh-%d", time.Now().Unix())
	c.createStream(t, ctx, stream, "us", 4)
	w := c.produce(t, ctx, stream, []string{"us", "eu", "ap"})
	conn, err := grpc.NewClient(strings.Split(c.addrs["eu"], ",")[0], grpc.WithTransportCredentials(c.creds()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := geologv1.NewAdminClient(conn)
	targets := []string{"eu", "ap", "us"}
	var pauses []time.Duration
	phases := map[string][]time.Duration{}
	phaseNames := []string{"prepare", "stop_old", "catch_up", "complete", "start_new"}
	var completeRetries int
	type window struct{ from, to time.Time }
	var windows []window
	for i := 0; i < *moves; i++ {
		time.Sleep(time.Second)
		to := targets[i%3]
		began := time.Now()
		resp, err := admin.Rehome(ctx, &geologv1.RehomeRequest{Stream: stream, AllRanges: true, Region: to})
		windows = append(windows, window{began, time.Now()})
		if err != nil {
			t.Fatalf("rehome to %s: %v", to, err)
		}
		for _, r := range resp.GetRanges() {
			if r.GetStatus() != "moved" {
				t.Fatalf("rehome to %s: range %d: %s", to, r.GetRange(), r.GetStatus())
			}
			pauses = append(pauses, time.Duration(r.GetPauseMicros())*time.Microsecond)
			if p := r.GetPhases(); p != nil && r.GetRange() == resp.GetRanges()[0].GetRange() { // one per request
				for i, us := range []int64{p.GetPrepareMicros(), p.GetStopOldMicros(), p.GetCatchUpMicros(), p.GetCompleteMicros(), p.GetStartNewMicros()} {
					phases[phaseNames[i]] = append(phases[phaseNames[i]], time.Duration(us)*time.Microsecond)
				}
				completeRetries += int(p.GetCompleteAttempts()) - 1
			}
		}
	}
	time.Sleep(time.Second)
	w.finish()
	if len(w.fails) > 0 {
		t.Fatalf("%d produce failures (first: %v)", len(w.fails), w.fails[0])
	}
	final := targets[(*moves-1)%3]
	for rng := uint32(0); rng < 4; rng++ {
		recs := c.readRange(t, ctx, final, stream, rng)
		seen := map[string]bool{}
		for i, r := range recs {
			if r.GetOffset() != uint64(i) || seen[string(r.GetValue())] {
				t.Fatalf("range %d: offset %d at %d, or %q twice", rng, r.GetOffset(), i, r.GetValue())
			}
			seen[string(r.GetValue())] = true
		}
		for _, a := range w.acks {
			if a.rng == rng && (a.offset >= uint64(len(recs)) || string(recs[a.offset].GetValue()) != a.value) {
				t.Fatalf("range %d: %q acked at %d is not in the final home's log", rng, a.value, a.offset)
			}
		}
	}
	// What producers saw: per move and range, the longest time without an
	// ack across the move (acks come every few ms otherwise).
	var gaps []time.Duration
	for _, win := range windows {
		for rng := uint32(0); rng < 4; rng++ {
			var ats []time.Time
			for _, a := range w.acks {
				if a.rng == rng {
					ats = append(ats, a.at)
				}
			}
			sort.Slice(ats, func(i, j int) bool { return ats[i].Before(ats[j]) })
			var gap time.Duration
			for i := 1; i < len(ats); i++ {
				if ats[i].After(win.from) && ats[i-1].Before(win.to) {
					gap = max(gap, ats[i].Sub(ats[i-1]))
				}
			}
			gaps = append(gaps, gap)
		}
	}
	t.Logf("producers' longest wait for an ack across a move (per range and move): p50 %v, p99 %v, max %v",
		percentile(gaps, 0.5).Round(time.Millisecond), percentile(gaps, 0.99).Round(time.Millisecond), percentile(gaps, 1).Round(time.Millisecond))
	var breakdown []string
	for _, name := range phaseNames {
		if ds := phases[name]; len(ds) > 0 {
			breakdown = append(breakdown, fmt.Sprintf("%s p50 %v p99 %v", name, percentile(ds, 0.5).Round(time.Millisecond), percentile(ds, 0.99).Round(time.Millisecond)))
		}
	}
	if len(breakdown) > 0 { // nodes that report phases
		t.Logf("pause by phase (per request): %s; complete retried %d times", strings.Join(breakdown, ", "), completeRetries)
	}
	t.Logf("planned rehome over %d range moves (%d requests of 4 ranges, load %d records/s from each region): pause p50 %v, p99 %v, max %v; %d acks, zero lost, zero duplicated",
		len(pauses), *moves, *rate, percentile(pauses, 0.5).Round(time.Millisecond), percentile(pauses, 0.99).Round(time.Millisecond),
		percentile(pauses, 1).Round(time.Millisecond), len(w.acks))
}

// TestLeaseStoreOutageDrill stops the cluster's PostgreSQL (the lease
// store) for twice the lease TTL under load: no append is acked after the
// home's lease could have expired, appends are refused with a retriable
// LEASE_EXPIRED meanwhile, no epoch changes (no takeover without the
// store), and service resumes once the store is back.
func TestLeaseStoreOutageDrill(t *testing.T) {
	c := attach(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	stream := fmt.Sprintf("lo-%d", time.Now().Unix())
	c.createStream(t, ctx, stream, "us", 4)
	var apis []geologv1.LogClient
	for _, addr := range strings.Split(c.addrs["us"], ",") {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		apis = append(apis, geologv1.NewLogClient(conn))
	}
	// appendOne tries each node of us until one answers other than
	// NOT_LEADER (the range's leader).
	appendOne := func(rng uint32, v string) error {
		var err error
		for _, api := range apis {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = api.Append(cctx, &geologv1.AppendRequest{Stream: stream, Range: rng, Records: []*geologv1.Record{{Value: []byte(v)}}})
			cancel()
			if rpcerr.CodeOf(err) != apierr.NotLeader {
				return err
			}
		}
		return err
	}
	var mu sync.Mutex
	var lastAck, lastAckCall time.Time // when the last acked append returned; when it was invoked
	var refused, acked int
	others := map[string]int{} // other outcomes, by code
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			called := time.Now()
			err := appendOne(uint32(i%4), fmt.Sprint(i))
			mu.Lock()
			switch {
			case err == nil:
				lastAck, lastAckCall, acked = time.Now(), called, acked+1
			case rpcerr.CodeOf(err) == apierr.LeaseExpired:
				refused++
			default:
				if others[rpcerr.CodeOf(err).String()]++; others[rpcerr.CodeOf(err).String()] == 1 {
					t.Logf("append: %v", err)
				}
			}
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second)
	stoppedAt := time.Now()
	c.ctl(t, "pg-stop")
	// A heartbeat that reached the store was sent before the stop
	// returned: no lease runs past stopDone + TTL, and no append invoked
	// later may be acked (when an ack arrives proves nothing: a busy
	// machine may deliver one decided in time late).
	stopDone := time.Now()
	time.Sleep(2 * *leaseTTL)
	mu.Lock()
	last, lastCall, ref := lastAck, lastAckCall, refused
	mu.Unlock()
	c.ctl(t, "pg-start")
	startedAt := time.Now()
	var resumed time.Duration
	for {
		mu.Lock()
		ok := lastAck.After(startedAt)
		mu.Unlock()
		if ok {
			resumed = time.Since(startedAt)
			break
		}
		if time.Since(startedAt) > time.Minute {
			t.Fatal("no append acked within a minute of the lease store's return")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if lastCall.After(stopDone.Add(*leaseTTL)) {
		t.Fatalf("an append invoked %v after the lease store stopped was acked, past the lease TTL %v", lastCall.Sub(stopDone), *leaseTTL)
	}
	if ref == 0 {
		t.Fatalf("no append refused with LEASE_EXPIRED while the lease store was down (other outcomes: %v)", others)
	}
	for r := uint32(0); r < 4; r++ {
		desc, err := c.client(t, "us").DescribeStream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if h := desc.Ranges[r]; h.HomeRegion != "us" || h.Epoch != 1 {
			t.Fatalf("range %d homed in %s at epoch %d after the outage; want us at 1", r, h.HomeRegion, h.Epoch)
		}
	}
	t.Logf("lease store down %v: last ack %v after the stop (TTL %v), %d appends refused with LEASE_EXPIRED, acks resumed %v after it returned",
		2**leaseTTL, last.Sub(stoppedAt).Round(time.Millisecond), *leaseTTL, ref, resumed.Round(time.Millisecond))
}
