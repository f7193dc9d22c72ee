package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/client"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// snapshot is the whole cluster as the console last saw it, before any
// viewer's filter.
type snapshot struct {
	at             time.Time
	regions        []Region
	streams        []*Stream
	streamsLeftOut int
	streamGroups   map[string][]*Group
	orphans        map[string]*Orphans
	errors         []string
}

// nodeConn is one node the console asks.
type nodeConn struct {
	region, addr string
	c            *client.Client
}

// collector builds snapshots (doc.go, steps 1 and 4).
type collector struct {
	cfg    *Config
	logger hclog.Logger
	// self is a client of this node (the stream list, groups); admin is a
	// connection to it for ListOrphans, which the SDK does not wrap.
	self  *client.Client
	admin *grpc.ClientConn
	nodes []nodeConn

	// mu serialises collections: one at a time, and the viewers who asked
	// meanwhile share its result.
	mu        sync.Mutex
	last      *snapshot
	orphans   map[string]*Orphans
	orphansAt time.Time
	closed    bool
}

func newCollector(cfg *Config) (*collector, error) {
	creds := cfg.Credentials
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	opts := func() []client.Opt {
		return []client.Opt{client.RetriesMax(0), client.CallTimeout(cfg.CallTimeout),
			client.Logger(cfg.Logger.Named("console")), client.DialOptions(grpc.WithTransportCredentials(creds))}
	}
	col := &collector{cfg: cfg, logger: cfg.Logger.Named("console")}
	var err error
	if col.self, err = client.New(cfg.Self, opts()...); err != nil {
		return nil, err
	}
	if col.admin, err = grpc.NewClient(cfg.Self, grpc.WithTransportCredentials(creds)); err != nil {
		col.close()
		return nil, err
	}
	for _, region := range sortedRegions(cfg.Region, cfg.Nodes) {
		for _, addr := range cfg.Nodes[region] {
			c, err := client.New(addr, opts()...)
			if err != nil {
				col.close()
				return nil, fmt.Errorf("console: node %s: %w", addr, err)
			}
			col.nodes = append(col.nodes, nodeConn{region, addr, c})
		}
	}
	return col, nil
}

func (col *collector) close() error {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.closed = true
	var errs []error
	if col.self != nil {
		errs = append(errs, col.self.Close())
	}
	if col.admin != nil {
		errs = append(errs, col.admin.Close())
	}
	for _, n := range col.nodes {
		errs = append(errs, n.c.Close())
	}
	return errors.Join(errs...)
}

// snapshot returns one at most RefreshInterval old, collecting a new one
// when the last is older. The collection is not the viewer's: it runs to
// its end (each call bounded) when the viewer who started it goes away.
func (col *collector) snapshot(ctx context.Context) (*snapshot, error) {
	col.mu.Lock()
	defer col.mu.Unlock()
	if col.closed {
		return nil, errors.New("console: closed")
	}
	now := col.cfg.Now()
	if col.last != nil && now.Sub(col.last.at) < col.cfg.RefreshInterval {
		return col.last, nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), collectTimeout)
	defer cancel()
	col.last = col.collect(cctx, now)
	return col.last, nil
}

func (col *collector) collect(ctx context.Context, now time.Time) *snapshot {
	snap := &snapshot{at: now, streamGroups: map[string][]*Group{}}
	infos, nodeErrs, err := col.listStreams(ctx)
	if err != nil {
		snap.errors = append(snap.errors, "stream list: no node answered: "+trimError(err))
	}
	slices.SortFunc(infos, func(a, b client.StreamInfo) int { return cmp.Compare(a.Name, b.Name) })
	if len(infos) > col.cfg.StreamsMax {
		snap.streamsLeftOut = len(infos) - col.cfg.StreamsMax
		infos = infos[:col.cfg.StreamsMax]
	}
	answers := col.describeAll(ctx, infos, nodeErrs)
	for i, info := range infos {
		s := &Stream{Name: info.Name, Regions: info.Regions, RangeCount: info.RangeCount}
		shown := info.RangeCount
		if shown > uint32(col.cfg.RangesMax) {
			shown = uint32(col.cfg.RangesMax)
			s.RangesLeftOut = info.RangeCount - shown
		}
		var errs []error
		for _, a := range answers[i] {
			if a.err != nil {
				errs = append(errs, a.err)
			}
		}
		if len(errs) > 0 && len(errs) == len(answers[i]) {
			s.Error = trimError(errs[0])
		}
		s.Ranges = mergeRanges(info.Regions, shown, answers[i])
		snap.streams = append(snap.streams, s)
	}
	snap.regions = col.regions(nodeErrs)
	col.groups(ctx, snap)
	snap.orphans = col.orphansOf(ctx, now, infos)
	return snap
}

// listStreams asks every node for the stream list: whether a node answers
// is its state on the page, and the stream list is this node's (another
// node's when this one does not answer).
func (col *collector) listStreams(ctx context.Context) ([]client.StreamInfo, map[string]error, error) {
	lists := make([][]client.StreamInfo, len(col.nodes))
	errs := make([]error, len(col.nodes))
	col.fanOut(len(col.nodes), func(i int) {
		cctx, cancel := context.WithTimeout(ctx, col.cfg.CallTimeout)
		defer cancel()
		lists[i], errs[i] = col.nodes[i].c.ListStreams(cctx)
	})
	nodeErrs := map[string]error{}
	for i, n := range col.nodes {
		if errs[i] != nil {
			nodeErrs[n.addr] = errs[i]
		}
	}
	cctx, cancel := context.WithTimeout(ctx, col.cfg.CallTimeout)
	defer cancel()
	own, err := col.self.ListStreams(cctx)
	if err == nil {
		return own, nodeErrs, nil
	}
	for i := range col.nodes {
		if errs[i] == nil {
			return lists[i], nodeErrs, nil
		}
	}
	return nil, nodeErrs, err
}

// describeAll asks every node of each stream's regions for the stream, a
// bounded number of calls at a time; answers[i] are stream i's. A node
// that did not answer ListStreams just now is not asked again (a region
// cut off would otherwise cost a timeout per stream).
func (col *collector) describeAll(ctx context.Context, infos []client.StreamInfo, nodeErrs map[string]error) [][]answer {
	type call struct{ stream, node int }
	var calls []call
	answers := make([][]answer, len(infos))
	for i, info := range infos {
		for j, n := range col.nodes {
			if !slices.Contains(info.Regions, n.region) {
				continue
			}
			if err := nodeErrs[n.addr]; err != nil {
				answers[i] = append(answers[i], answer{region: n.region, addr: n.addr, c: j, err: err})
				continue
			}
			calls = append(calls, call{i, len(answers[i])})
			answers[i] = append(answers[i], answer{region: n.region, addr: n.addr, c: j})
		}
	}
	col.fanOut(len(calls), func(k int) {
		a := &answers[calls[k].stream][calls[k].node]
		cctx, cancel := context.WithTimeout(ctx, col.cfg.CallTimeout)
		defer cancel()
		a.desc, a.err = col.nodes[a.c].c.DescribeStream(cctx, infos[calls[k].stream].Name)
	})
	return answers
}

// fanOut runs fn(0..count-1), callConcurrencyMax at a time, and waits.
func (col *collector) fanOut(count int, fn func(i int)) {
	sem := make(chan struct{}, callConcurrencyMax)
	var wg sync.WaitGroup
	for i := range count {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}

func (col *collector) regions(nodeErrs map[string]error) []Region {
	var out []Region
	for _, n := range col.nodes {
		if len(out) == 0 || out[len(out)-1].Name != n.region {
			out = append(out, Region{Name: n.region})
		}
		nv := Node{Addr: n.addr, Up: nodeErrs[n.addr] == nil}
		if err := nodeErrs[n.addr]; err != nil {
			nv.Error = trimError(err)
		}
		out[len(out)-1].Nodes = append(out[len(out)-1].Nodes, nv)
	}
	return out
}

// groups lists the consumer groups (as this node's copy of the cursor
// stream shows them) and describes those of the streams shown.
func (col *collector) groups(ctx context.Context, snap *snapshot) {
	cctx, cancel := context.WithTimeout(ctx, col.cfg.CallTimeout)
	list, err := col.self.ListGroups(cctx, "")
	cancel()
	if err != nil {
		snap.errors = append(snap.errors, "consumer groups: "+trimError(err))
		return
	}
	shown := map[string]bool{}
	for _, s := range snap.streams {
		shown[s.Name] = true
	}
	var picked []client.GroupSummary
	perStream := map[string]int{}
	for _, g := range list {
		if shown[g.Stream] && perStream[g.Stream] < col.cfg.GroupsMax {
			perStream[g.Stream]++
			picked = append(picked, g)
		}
	}
	groups := make([]*Group, len(picked))
	col.fanOut(len(picked), func(i int) {
		g := picked[i]
		groups[i] = &Group{Group: g.Group, State: g.State, Members: g.Members}
		cctx, cancel := context.WithTimeout(ctx, col.cfg.CallTimeout)
		defer cancel()
		d, err := col.self.DescribeGroup(cctx, g.Group)
		if err != nil {
			groups[i].Error = trimError(err)
			return
		}
		for _, rl := range d.Ranges {
			groups[i].LagRecords += rl.LagRecords
			groups[i].Ranges = append(groups[i].Ranges, GroupLag{Range: rl.Range, HasPosition: rl.HasPosition, Committed: rl.Committed,
				Tail: rl.Tail, LagRecords: rl.LagRecords, LagMs: rl.Lag.Milliseconds(), Owner: rl.Owner})
		}
	})
	for i, g := range picked {
		snap.streamGroups[g.Stream] = append(snap.streamGroups[g.Stream], groups[i])
	}
}

// orphansOf lists each shown stream's orphan logs cluster-wide, or keeps
// the last listing while it is younger than OrphansRefreshInterval and
// covers every stream shown: a listing asks every node of the stream's
// regions.
func (col *collector) orphansOf(ctx context.Context, now time.Time, infos []client.StreamInfo) map[string]*Orphans {
	stale := col.orphans == nil || now.Sub(col.orphansAt) >= col.cfg.OrphansRefreshInterval
	for _, info := range infos {
		if col.orphans[info.Name] == nil {
			stale = true // a stream new since the last listing
		}
	}
	if stale {
		fresh := make([]*Orphans, len(infos))
		api := geologv1.NewAdminClient(col.admin)
		col.fanOut(len(infos), func(i int) {
			fresh[i] = col.listOrphans(ctx, api, infos[i].Name)
		})
		col.orphans, col.orphansAt = map[string]*Orphans{}, now
		for i, info := range infos {
			col.orphans[info.Name] = fresh[i]
		}
	}
	out := make(map[string]*Orphans, len(col.orphans))
	for name, o := range col.orphans {
		o := *o
		o.AgeMs = now.Sub(col.orphansAt).Milliseconds()
		out[name] = &o
	}
	return out
}

func (col *collector) listOrphans(ctx context.Context, api geologv1.AdminClient, stream string) *Orphans {
	// The node fans out to every node of the stream's regions under this
	// deadline, and answers with what each said.
	cctx, cancel := context.WithTimeout(ctx, 2*col.cfg.CallTimeout)
	defer cancel()
	resp, err := api.ListOrphans(cctx, &geologv1.ListOrphansRequest{Stream: stream, Scope: geologv1.OrphanScope_ORPHAN_SCOPE_CLUSTER})
	if err != nil {
		return &Orphans{Forks: []Fork{}, Error: trimError(err)}
	}
	o := &Orphans{Forks: []Fork{}}
	seen := map[string]bool{}
	for _, no := range resp.GetNodes() {
		if no.GetError() != "" {
			o.Unanswered = append(o.Unanswered, fmt.Sprintf("%s node %d (%s): %s", no.GetRegion(), no.GetNodeId(), no.GetAddress(), no.GetError()))
			continue
		}
		for _, f := range no.GetForks() {
			k := fmt.Sprintf("%s/%d/%d", no.GetRegion(), f.GetRange(), f.GetForkIndex())
			if seen[k] {
				continue
			}
			seen[k] = true
			o.Forks = append(o.Forks, Fork{Region: no.GetRegion(), Range: f.GetRange(), ForkIndex: f.GetForkIndex(), ForkOffset: f.GetForkOffset(),
				Epoch: f.GetEpoch(), Records: f.GetRecords(), Bytes: uint64(max(f.GetBytes(), 0)), Node: no.GetAddress()})
		}
	}
	slices.SortFunc(o.Forks, func(a, b Fork) int {
		return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.Range, b.Range), cmp.Compare(a.ForkIndex, b.ForkIndex))
	})
	return o
}
