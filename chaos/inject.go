package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/internal/failpoint"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
)

// injector applies a scenario's faults to a cluster and remembers what it
// broke, so that the end of the scenario can mend everything.
type injector struct {
	cl      Cluster
	wan     *wanClient // nil without Caps.WAN
	stream  string
	homes   []string // per range
	regions []string // the stream's
	rec     *recorder
	log     hclog.Logger

	rngMu sync.Mutex
	rng   *rand.Rand

	connsMu sync.Mutex
	conns   map[string]*grpc.ClientConn // admin connections by node address

	mu         sync.Mutex
	killed     map[NodeRef]bool
	paused     map[NodeRef]bool
	failpoints map[NodeRef]failpoint.Settings
	latency    map[string][2]time.Duration // link → latency and jitter before the fault
	pgStopped  bool
	httpClient *http.Client

	// group is the scenario's consumer group (inject_group.go), nil
	// without one; memberFaults counts member faults applied.
	group        *groupRun
	memberFaults int
}

func newInjector(cl Cluster, stream string, homes, regions []string, rec *recorder, seed uint64, log hclog.Logger) *injector {
	in := &injector{cl: cl, stream: stream, homes: homes, regions: regions, rec: rec, log: log,
		rng: rand.New(rand.NewPCG(seed, 0x6368616f73)), conns: map[string]*grpc.ClientConn{},
		killed: map[NodeRef]bool{}, paused: map[NodeRef]bool{}, failpoints: map[NodeRef]failpoint.Settings{},
		latency: map[string][2]time.Duration{}, httpClient: &http.Client{Timeout: 5 * time.Second}}
	if cl.Caps().WAN {
		in.wan = newWANClient(cl.WANControl())
	}
	return in
}

func (in *injector) close() {
	in.connsMu.Lock()
	defer in.connsMu.Unlock()
	for _, c := range in.conns {
		c.Close()
	}
}

// check says why the cluster cannot inject f, or nil.
func (in *injector) check(f Fault) error {
	caps := in.cl.Caps()
	sides := []string{f.Target.A, f.Target.B}
	nodeSides := 0
	for _, s := range sides {
		if strings.Contains(s, ":") {
			nodeSides++
		}
	}
	switch {
	case (f.Kind == KindKill || f.Kind == KindPause) && !caps.Processes:
		return fmt.Errorf("%w: %s needs process control", ErrUnsupported, f.Kind)
	case (f.Kind == KindDisk || f.Kind == KindClockSkew) && !caps.Failpoints:
		return fmt.Errorf("%w: %s needs nodes with --debug-failpoints", ErrUnsupported, f.Kind)
	case f.Kind == KindKill && f.Params.DropReplies && !caps.ClientLinks:
		return fmt.Errorf("%w: drop_replies needs client links", ErrUnsupported)
	case (f.Kind == KindPartition || f.Kind == KindLatency || f.Kind == KindReplicatorStop) && !caps.WAN:
		return fmt.Errorf("%w: %s needs the WAN emulator's control API", ErrUnsupported, f.Kind)
	case (f.Kind == KindPartition || f.Kind == KindLatency) && nodeSides == 2 && !caps.IntraRegionLinks:
		return fmt.Errorf("%w: %s between nodes of a region needs intra-region links", ErrUnsupported, f.Kind)
	case slices.Contains(sides, "client") && !caps.ClientLinks:
		return fmt.Errorf("%w: a client side needs client links", ErrUnsupported)
	case f.Kind == KindLeaseStoreOutage && f.Params.StoreMode == "stop" && !caps.LeaseStore:
		return fmt.Errorf("%w: no lease store the harness can stop", ErrUnsupported)
	case f.Kind == KindLeaseStoreOutage && f.Params.StoreMode != "stop" && (caps.LeaseTTL == 0 || !caps.WAN):
		return fmt.Errorf("%w: a lease-store cut needs homing and the WAN emulator", ErrUnsupported)
	case f.Kind == KindJoin && !canJoin(in.cl):
		return fmt.Errorf("%w: join needs a cluster that starts nodes (LocalCluster with spare nodes)", ErrUnsupported)
	case f.Kind == KindDrain && !canOperate(in.cl):
		return fmt.Errorf("%w: drain needs the cluster's operator credentials (LocalCluster)", ErrUnsupported)
	case f.Kind == KindRehome && caps.LeaseTTL == 0:
		return fmt.Errorf("%w: rehome needs homing (a lease store)", ErrUnsupported)
	}
	if f.Kind == KindLeaseStoreOutage && f.Params.StoreMode != "stop" {
		// The links are looked up now: a cut that touches nothing would
		// pass for a survived outage.
		all, err := in.wan.Links(context.Background())
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(all, func(l wan.LinkStatus) bool { return slices.Contains(endsOf(l).to, "pg") }) {
			return fmt.Errorf("%w: the WAN emulator has no links to the lease store (<region>->pg)", ErrUnsupported)
		}
	}
	return nil
}

// runSchedule runs every fault of faults from start until window ends,
// each in its own goroutine, and returns when the window has ended and
// all are reverted (the workload runs for the whole window: what follows
// the last fault, e.g. a returned region serving as a mirror, is part of
// the run).
func (in *injector) runSchedule(ctx context.Context, faults []Fault, window time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, f := range faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rep := 0; ; rep++ {
				at := start.Add(f.Start.Std() + time.Duration(rep)*f.Every.Std())
				if !sleepUntil(wctx, at) {
					return
				}
				in.once(wctx, f, rep)
				if f.Every <= 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	<-wctx.Done()
}

// once applies one repetition of f, holds it for its duration (or until
// ctx ends) and reverts it.
func (in *injector) once(ctx context.Context, f Fault, rep int) {
	rng := f.Target.Range
	if f.Target.RotateRanges {
		rng = (rng + uint32(rep)) % uint32(len(in.homes))
	}
	ev := FaultEvent{Fault: f, Range: rng, Start: in.rec.now()}
	// The fault starts when it is applied, after its target was resolved
	// (finding a leader takes a round of calls): failover counts from here.
	marked := false
	mark := func() {
		if !marked {
			marked, ev.Start = true, in.rec.now()
		}
	}
	revert, err := in.apply(ctx, f, rng, mark, &ev)
	what := ev.What
	if err != nil {
		ev.Err = err.Error()
		in.log.Warn("fault not injected", "fault", f.String(), "error", err)
	} else {
		in.log.Info("fault on", "what", what, "range", rng)
		sleepUntil(ctx, time.Now().Add(f.Duration.Std()))
		// Reverting must happen even when the window closed.
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := revert(rctx); err != nil {
			ev.Err = "revert: " + err.Error()
			in.log.Warn("fault revert failed", "what", what, "error", err)
		}
		cancel()
		in.log.Info("fault off", "what", what)
	}
	ev.End = in.rec.now()
	in.rec.addFault(ev)
}

// apply injects f on range rng and returns how to revert it; it fills in
// what it hit (ev.What), whether that was the range's leader or a whole
// home region (ev.LeaderFault, ev.HomeEpochs, ev.LeaseCut) and a rehome's
// pauses.
func (in *injector) apply(ctx context.Context, f Fault, rng uint32, mark func(), ev *FaultEvent) (revert func(context.Context) error, err error) {
	// Both sides of a fault see the same leader, even if it moves while
	// the second is resolved.
	ctx = context.WithValue(ctx, leaderCacheKey{}, map[string]Node{})
	switch f.Kind {
	case KindKill, KindPause, KindDisk, KindClockSkew:
		nodes, err := in.resolveNodes(ctx, f.Target.Node, rng)
		if err != nil {
			return nil, err
		}
		regionSel, part, hasNode := strings.Cut(f.Target.Node, ":")
		ev.LeaderFault = (part == "leader" || part == "all" || !hasNode) && (f.Kind == KindKill || f.Kind == KindPause)
		if regionSel == "cursors" {
			// The group's coordinator: no range of the stream fails over.
			ev.LeaderFault, ev.Coordinator = false, true
		}
		ev.What = fmt.Sprintf("%s %v", f.Kind, nodes)
		if f.Kind == KindKill && (part == "all" || !hasNode) && len(nodes) == len(regionNodes(in.cl, nodes[0].Region)) {
			// A whole region dies: each range homed there fails over.
			ev.HomeEpochs = in.homeEpochs(ctx, []string{nodes[0].Region})
		}
		switch f.Kind {
		case KindKill:
			revert, err = in.kill(ctx, nodes, f.Params.DropReplies, mark)
			if err == nil && f.Params.Replaced {
				revert = in.replacedBefore(revert, nodes, ev)
			}
		case KindPause:
			revert, err = in.pause(nodes, mark)
		default:
			revert, err = in.failpoint(ctx, nodes, f, mark)
		}
		return revert, err
	case KindPartition, KindLatency, KindReplicatorStop:
		a, err := in.resolveSide(ctx, f.Target.A, rng)
		if err != nil {
			return nil, err
		}
		var b []string
		oneWay := f.Target.OneWay
		if f.Kind == KindReplicatorStop {
			oneWay = true
			if f.Target.B == "" {
				for _, r := range in.regions {
					if !slices.Contains(a, r) {
						b = append(b, r)
					}
				}
			}
		}
		if b == nil {
			if b, err = in.resolveSide(ctx, f.Target.B, rng); err != nil {
				return nil, err
			}
		}
		links, err := in.links(ctx, a, b, oneWay)
		if err != nil {
			return nil, err
		}
		_, pa, _ := strings.Cut(f.Target.A, ":")
		_, pb, _ := strings.Cut(f.Target.B, ":")
		ev.LeaderFault = f.Kind == KindPartition && (pa == "leader" || pb == "leader")
		ev.What = fmt.Sprintf("%s %v|%v (%d links)", f.Kind, a, b, len(links))
		ev.Sides = [][]string{a, b}
		if f.Kind == KindLatency {
			return in.slow(ctx, links, f.Params.Latency.Std(), f.Params.Jitter.Std(), mark)
		}
		mode, _ := parseCutMode(f.Params.CutMode)
		if f.Kind == KindReplicatorStop {
			mode = "reset"
		}
		return in.cutLinks(ctx, links, mode, mark)
	case KindLeaseStoreOutage:
		a := in.regions
		if f.Target.A != "" && f.Params.StoreMode != "stop" {
			if a, err = in.resolveSide(ctx, f.Target.A, rng); err != nil {
				return nil, err
			}
		}
		if in.cl.Caps().LeaseTTL > 0 {
			ev.HomeEpochs, ev.LeaseCut = in.homeEpochs(ctx, a), true
		}
		if f.Params.StoreMode == "stop" {
			ev.What = "lease store stopped"
			mark()
			return in.stopLeaseStore()
		}
		links, err := in.links(ctx, a, []string{"pg"}, false)
		if err != nil {
			return nil, err
		}
		ev.What = fmt.Sprintf("lease store cut from %v (%d links)", a, len(links))
		ev.Sides = [][]string{a, {"pg"}}
		return in.cutLinks(ctx, links, "blackhole", mark)
	case KindMemberKill, KindMemberPartition:
		return in.memberFault(f, mark, ev)
	case KindSplit:
		ev.What, err = in.split(ctx, rng, mark)
		return func(context.Context) error { return nil }, err
	case KindJoin:
		ev.What, err = in.join(ctx, f.Target.A, mark)
		return func(context.Context) error { return nil }, err
	case KindDrain:
		ev.What, err = in.drain(ctx, f, rng, mark)
		return func(context.Context) error { return nil }, err
	case KindRehome:
		to, err := in.region(ctx, f.Target.A, rng)
		if err != nil {
			return nil, err
		}
		ev.What = fmt.Sprintf("rehome r%d to %s", rng, to)
		if f.Params.AllRanges {
			ev.What = "rehome every range to " + to
		}
		ev.Pauses, err = in.rehome(ctx, rng, f.Params.AllRanges, to, mark)
		return func(context.Context) error { return nil }, err
	}
	return nil, fmt.Errorf("chaos: unknown kind %q", f.Kind)
}

func (in *injector) kill(ctx context.Context, nodes []Node, dropReplies bool, mark func()) (func(context.Context) error, error) {
	var clientLinks []wan.LinkStatus
	defer mark() // at the latest
	if dropReplies {
		var ends []string
		for _, n := range nodes {
			ends = append(ends, n.NodeRef.String())
		}
		var err error
		if clientLinks, err = in.links(ctx, []string{"client"}, ends, true); err != nil {
			return nil, err
		}
		// Reset first: acks still inside the proxy are dropped with the
		// connections, so their records' outcome is unknown to the client.
		mark()
		for _, l := range clientLinks {
			if err := in.wan.Cut(ctx, l.Name, "reset"); err != nil {
				return nil, err
			}
		}
	}
	var killed []NodeRef
	var errs []error
	for _, n := range nodes {
		mark()
		if err := in.cl.Kill(n.NodeRef); err != nil {
			errs = append(errs, err)
			continue
		}
		in.mu.Lock()
		in.killed[n.NodeRef] = true
		in.mu.Unlock()
		killed = append(killed, n.NodeRef)
	}
	for _, l := range clientLinks {
		errs = append(errs, in.wan.Heal(ctx, l.Name))
	}
	restart := func(ctx context.Context) error {
		var errs []error
		for _, n := range killed {
			errs = append(errs, in.restart(n))
		}
		return errors.Join(errs...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, restart(ctx))
	}
	return restart, nil
}

func (in *injector) restart(n NodeRef) error {
	in.mu.Lock()
	down := in.killed[n]
	delete(in.killed, n)
	in.mu.Unlock()
	if !down {
		return nil
	}
	return in.cl.Restart(n)
}

func (in *injector) pause(nodes []Node, mark func()) (func(context.Context) error, error) {
	var paused []NodeRef
	for _, n := range nodes {
		mark()
		if err := in.cl.Pause(n.NodeRef); err != nil {
			for _, p := range paused {
				in.resume(p)
			}
			return nil, err
		}
		in.mu.Lock()
		in.paused[n.NodeRef] = true
		in.mu.Unlock()
		paused = append(paused, n.NodeRef)
	}
	return func(context.Context) error {
		var errs []error
		for _, p := range paused {
			errs = append(errs, in.resume(p))
		}
		return errors.Join(errs...)
	}, nil
}

func (in *injector) resume(n NodeRef) error {
	in.mu.Lock()
	was := in.paused[n]
	delete(in.paused, n)
	in.mu.Unlock()
	if !was {
		return nil
	}
	return in.cl.Resume(n)
}

// failpoint sets the disk or clock switches of nodes, and reverts them; a
// failing disk poisons the node's stores (a failed fdatasync is final), so
// its revert restarts the node.
func (in *injector) failpoint(ctx context.Context, nodes []Node, f Fault, mark func()) (func(context.Context) error, error) {
	var done []Node
	revert := func(ctx context.Context) error {
		var errs []error
		for _, n := range done {
			in.mu.Lock()
			s := in.failpoints[n.NodeRef]
			if f.Kind == KindDisk {
				s.FsyncDelay, s.FsyncFail = 0, false
			} else {
				s.ClockSkew = 0
			}
			if s == (failpoint.Settings{}) {
				delete(in.failpoints, n.NodeRef)
			} else {
				in.failpoints[n.NodeRef] = s
			}
			in.mu.Unlock()
			errs = append(errs, in.setFailpoints(ctx, n, s))
			if f.Kind == KindDisk && f.Params.FsyncFail {
				if err := in.cl.Kill(n.NodeRef); err != nil {
					errs = append(errs, err)
					continue
				}
				errs = append(errs, in.cl.Restart(n.NodeRef))
			}
		}
		return errors.Join(errs...)
	}
	for _, n := range nodes {
		in.mu.Lock()
		s := in.failpoints[n.NodeRef]
		if f.Kind == KindDisk {
			s.FsyncDelay, s.FsyncFail = failpoint.Duration(f.Params.FsyncDelay), f.Params.FsyncFail
		} else {
			s.ClockSkew = failpoint.Duration(f.Params.ClockSkew)
		}
		in.failpoints[n.NodeRef] = s
		in.mu.Unlock()
		done = append(done, n)
		mark()
		if err := in.setFailpoints(ctx, n, s); err != nil {
			return nil, errors.Join(err, revert(ctx))
		}
	}
	return revert, nil
}

func (in *injector) setFailpoints(ctx context.Context, n Node, s failpoint.Settings) error {
	if n.DebugAddr == "" {
		return fmt.Errorf("%w: %s has no debug address", ErrUnsupported, n.NodeRef)
	}
	body, _ := json.Marshal(s)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.DebugAddr+failpoint.Path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := in.httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("failpoints of %s: %w", n.NodeRef, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("failpoints of %s: %s", n.NodeRef, resp.Status)
	}
	return nil
}

func (in *injector) cutLinks(ctx context.Context, links []wan.LinkStatus, mode string, mark func()) (func(context.Context) error, error) {
	heal := func(ctx context.Context) error {
		var errs []error
		for _, l := range links {
			errs = append(errs, in.wan.Heal(ctx, l.Name))
		}
		return errors.Join(errs...)
	}
	for _, l := range links {
		mark()
		if err := in.wan.Cut(ctx, l.Name, mode); err != nil {
			return nil, errors.Join(err, heal(ctx))
		}
	}
	return heal, nil
}

func (in *injector) slow(ctx context.Context, links []wan.LinkStatus, latency, jitter time.Duration, mark func()) (func(context.Context) error, error) {
	restore := func(ctx context.Context) error {
		var errs []error
		for _, l := range links {
			in.mu.Lock()
			orig, ok := in.latency[l.Name]
			delete(in.latency, l.Name)
			in.mu.Unlock()
			if ok {
				errs = append(errs, in.wan.SetLatency(ctx, l.Name, orig[0], orig[1]))
			}
		}
		return errors.Join(errs...)
	}
	for _, l := range links {
		in.mu.Lock()
		if _, ok := in.latency[l.Name]; !ok {
			in.latency[l.Name] = [2]time.Duration{msDuration(l.LatencyMs), msDuration(l.JitterMs)}
		}
		in.mu.Unlock()
		mark()
		if err := in.wan.SetLatency(ctx, l.Name, latency, jitter); err != nil {
			return nil, errors.Join(err, restore(ctx))
		}
	}
	return restore, nil
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

func (in *injector) stopLeaseStore() (func(context.Context) error, error) {
	if err := in.cl.StopLeaseStore(); err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.pgStopped = true
	in.mu.Unlock()
	return func(context.Context) error {
		in.mu.Lock()
		in.pgStopped = false
		in.mu.Unlock()
		return in.cl.StartLeaseStore()
	}, nil
}

// healAll mends whatever is still broken: the end of a scenario's fault
// window, whatever happened to the reverts.
func (in *injector) healAll(ctx context.Context) error {
	in.mu.Lock()
	killed, paused := keys(in.killed), keys(in.paused)
	fps := map[NodeRef]bool{}
	for n := range in.failpoints {
		fps[n] = true
	}
	lat := in.latency
	in.latency = map[string][2]time.Duration{}
	pg := in.pgStopped
	in.pgStopped = false
	in.mu.Unlock()
	var errs []error
	for _, n := range paused {
		errs = append(errs, in.resume(n))
	}
	for _, n := range killed {
		errs = append(errs, in.restart(n))
	}
	for _, n := range in.cl.Nodes() {
		if fps[n.NodeRef] {
			errs = append(errs, in.setFailpoints(ctx, n, failpoint.Settings{}))
		}
	}
	if in.wan != nil {
		errs = append(errs, in.wan.HealAll(ctx))
		for name, orig := range lat {
			errs = append(errs, in.wan.SetLatency(ctx, name, orig[0], orig[1]))
		}
	}
	if pg {
		errs = append(errs, in.cl.StartLeaseStore())
	}
	return errors.Join(errs...)
}

func keys[K comparable, V any](m map[K]V) []K {
	var out []K
	for k := range m {
		out = append(out, k)
	}
	return out
}

// links returns the WAN links between sides a and b; none is an error
// (a fault that touches nothing would pass for a survived one).
func (in *injector) links(ctx context.Context, a, b []string, oneWay bool) ([]wan.LinkStatus, error) {
	if in.wan == nil {
		return nil, fmt.Errorf("%w: no WAN emulator", ErrUnsupported)
	}
	all, err := in.wan.Links(ctx)
	if err != nil {
		return nil, err
	}
	links := linksBetween(all, a, b, oneWay)
	if len(links) == 0 {
		return nil, fmt.Errorf("chaos: no links between %v and %v", a, b)
	}
	return links, nil
}

// resolveSide turns a link-side selector into link endpoint names.
func (in *injector) resolveSide(ctx context.Context, sel string, rng uint32) ([]string, error) {
	region, _, hasNode := strings.Cut(sel, ":")
	switch region {
	case "client", "pg":
		if hasNode {
			return nil, fmt.Errorf("chaos: %q takes no node part", sel)
		}
		return []string{region}, nil
	}
	if !hasNode {
		r, err := in.region(ctx, region, rng)
		if err != nil {
			return nil, err
		}
		return []string{r}, nil
	}
	nodes, err := in.resolveNodes(ctx, sel, rng)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes {
		out = append(out, n.NodeRef.String())
	}
	return out, nil
}

// region resolves the region part of a selector: "home" is where range
// rng is homed now (homing may have moved it), "mirror" the first other
// region of the stream, "next" the one after the home in the stream's
// region order.
func (in *injector) region(ctx context.Context, sel string, rng uint32) (string, error) {
	if int(rng) >= len(in.homes) {
		return "", fmt.Errorf("chaos: range %d: the stream has %d", rng, len(in.homes))
	}
	switch sel {
	case "home", "mirror", "next":
	default:
		if !slices.Contains(in.cl.Regions(), sel) {
			return "", fmt.Errorf("chaos: no region %q", sel)
		}
		return sel, nil
	}
	home := in.homes[rng]
	if in.cl.Caps().LeaseTTL > 0 {
		home = in.currentHomes(ctx)[rng].region
	}
	switch sel {
	case "home":
		return home, nil
	case "next":
		if i := slices.Index(in.regions, home); i >= 0 && len(in.regions) > 1 {
			return in.regions[(i+1)%len(in.regions)], nil
		}
		return "", fmt.Errorf("chaos: range %d has no next region", rng)
	}
	for _, r := range in.regions {
		if r != home {
			return r, nil
		}
	}
	return "", fmt.Errorf("chaos: range %d has no mirror region", rng)
}

// resolveNodes turns a node selector into nodes, finding the range's
// leader when asked.
func (in *injector) resolveNodes(ctx context.Context, sel string, rng uint32) ([]Node, error) {
	regionSel, part, hasNode := strings.Cut(sel, ":")
	stream, region, err := in.stream, "", error(nil)
	if regionSel == "cursors" {
		// The group's range of the cursor stream, in its home region.
		stream = cursorStream
		region, rng, err = in.cursorTarget(ctx)
	} else {
		region, err = in.region(ctx, regionSel, rng)
	}
	if err != nil {
		return nil, err
	}
	nodes := regionNodes(in.cl, region)
	if !hasNode {
		part = "all"
	}
	pick := func(from []Node) []Node {
		in.rngMu.Lock()
		defer in.rngMu.Unlock()
		return []Node{from[in.rng.IntN(len(from))]}
	}
	switch part {
	case "all":
		return nodes, nil
	case "any":
		return pick(nodes), nil
	case "leader", "followers", "follower":
		leader, err := in.leader(ctx, stream, region, rng)
		if err != nil {
			return nil, err
		}
		if part == "leader" {
			return []Node{leader}, nil
		}
		var followers []Node
		for _, n := range nodes {
			if n.NodeRef != leader.NodeRef {
				followers = append(followers, n)
			}
		}
		if len(followers) == 0 {
			return nil, fmt.Errorf("chaos: range %d has no follower in %s", rng, region)
		}
		if part == "follower" {
			return pick(followers), nil
		}
		return followers, nil
	}
	for _, n := range nodes {
		if fmt.Sprintf("n%d", n.ID) == part {
			return []Node{n}, nil
		}
	}
	return nil, fmt.Errorf("chaos: no node %s", sel)
}

// leader finds the node of region that leads rng, waiting up to 15 s for
// one (only a leader answers DescribeReplicas; should two answer, as a
// deposed leader may until it hears the new term, the one further ahead
// wins).
func (in *injector) leader(ctx context.Context, stream, region string, rng uint32) (n Node, err error) {
	if cache, ok := ctx.Value(leaderCacheKey{}).(map[string]Node); ok {
		if n, ok := cache[stream+"/"+region]; ok {
			return n, nil
		}
		defer func() {
			if err == nil {
				cache[stream+"/"+region] = n
			}
		}()
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		var best *Node
		var bestIndex uint64
		for _, n := range regionNodes(in.cl, region) {
			conn, err := in.conn(n.Addr)
			if err != nil {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			resp, err := geologv1.NewAdminClient(conn).DescribeReplicas(cctx, &geologv1.DescribeReplicasRequest{Stream: stream, Range: rng})
			cancel()
			if err == nil && (best == nil || resp.GetLastIndex() > bestIndex) {
				best, bestIndex = &n, resp.GetLastIndex()
			}
		}
		if best != nil {
			return *best, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return Node{}, fmt.Errorf("chaos: no leader of %s/%d in %s", stream, rng, region)
		}
		sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
	}
}

// leaderCacheKey keys the leaders one apply resolved (a context value:
// the resolution helpers are shared by every kind).
type leaderCacheKey struct{}

func (in *injector) conn(addr string) (*grpc.ClientConn, error) {
	in.connsMu.Lock()
	defer in.connsMu.Unlock()
	if c, ok := in.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(transportCreds(in.cl.ClientTLS())))
	if err != nil {
		return nil, err
	}
	in.conns[addr] = c
	return c, nil
}

// sleepUntil waits until t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	return backoff.Sleep(ctx, time.Until(t)) == nil
}
