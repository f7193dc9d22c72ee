package regionsvc

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
)

// Homing on a node (DESIGN.md "Homing", "Fencing"): with a lease store
// configured, which region is home for each range, and at which epoch, comes
// from the store, not from the stream's spec:
//
//   - The node heartbeats its liveness record (homing.Homes); the records
//     of the ranges homed in its region come back with it. A range is home
//     here while that view has it; an append is admitted only if the lease
//     allows it now (homing.Homes.Check) and the batch is stamped with the
//     epoch the check returned; the ack is checked again (the lease may
//     have ended, or the epoch moved, while the batch committed).
//   - Ranges homed elsewhere are looked up in the store (homeDirectory),
//     for redirects, replication roles and failover.
//   - The region's catalogue leader runs the failover agent (failover.go).

// rangeRole is where a range is homed, as this node knows it now.
type rangeRole struct {
	// home: homed in this node's region (possibly moving away: Check
	// says whether appends are admitted).
	home bool
	// region is the home region; "" when unknown (homing on, no record
	// found yet).
	region string
	// epoch is the homing epoch of region's home (0 unknown), and start
	// the offset it starts at (the home record's; for a home elsewhere).
	epoch uint64
	start uint64
}

func (d *rangeDriver) role() rangeRole {
	if p := d.roleP.Load(); p != nil {
		return *p
	}
	return rangeRole{home: d.cfg.home, region: d.cfg.homeRegion, epoch: d.cfg.epoch}
}

func (d *rangeDriver) isHome() bool { return d.role().home }

func (d *rangeDriver) setRole(r rangeRole) {
	if cur := d.roleP.Load(); cur != nil && *cur == r {
		return
	}
	old := d.role()
	if r.epoch > 0 {
		d.raiseEpoch(r.epoch)
	}
	// The fence for the new role is in place before the role shows
	// (DescribeStream): a node that says it knows the new home serves
	// nothing that home replaced.
	d.updateFenceFor(&r)
	if old != r {
		d.logger.Info("home changed", "home_region", r.region, "epoch", r.epoch, "homed_here", r.home)
	}
}

// homingState is a node's homing machinery (nil when homing is off).
type homingState struct {
	store homing.Store
	homes *homing.Homes

	dirMu sync.Mutex
	// dir holds the home records of the node's ranges homed elsewhere, as
	// last read from the store.
	dir map[homing.RangeKey]homing.Home
	// created remembers the streams whose homes this node made sure exist.
	created map[string]bool

	failover *failoverAgent
	// refresh asks the homing loop to read the directory now (capacity 1;
	// see refreshHomesSoon).
	refresh chan struct{}
	// writeMu serialises the rehome coordinator's store writes.
	writeMu sync.Mutex
	// wants are the epoch starts range fences lack (timeline.go).
	wants epochWants

	stop chan struct{}
	done chan struct{}
}

// homeDirectoryInterval is how often a node reads the homes of its ranges
// homed elsewhere: one statement per node per interval, whatever the range
// count (reads; the writes stay one heartbeat per node per interval).
const homeDirectoryInterval = time.Second

// storeTimeout bounds the node's lease-store reads whose answers live as
// short as a heartbeat's (the home directory, the liveness a failover
// judges by): homing.DefaultHeartbeatTimeout of the node's lease. Not the
// directory interval: a store slower than that (under load) would never
// answer one read in time, and a read that is late is still worth having.
func (n *Node) storeTimeout() time.Duration {
	return homing.DefaultHeartbeatTimeout(n.cfg.LeaseHeartbeat, n.cfg.LeaseTTL, n.cfg.MaxClockOffset)
}

// LivenessID is the node's id in the lease store's liveness table: unique
// across regions (Raft ids are per region), derived from the region and
// the Raft id, positive in a signed 63-bit column.
func LivenessID(region string, nodeID uint64) uint64 {
	h := fnv.New64a()
	h.Write([]byte(region))
	h.Write([]byte{0})
	var b [8]byte
	for i := range b {
		b[i] = byte(nodeID >> (8 * i))
	}
	h.Write(b[:])
	return h.Sum64()&(1<<53-1) | 1
}

// startHoming starts the node's homes driver and its loop.
func (n *Node) startHoming() error {
	if n.cfg.LeaseStore == nil {
		return nil
	}
	h, err := homing.Start(homing.Config{
		NodeID:            LivenessID(n.cfg.Region, n.cfg.NodeID),
		Region:            n.cfg.Region,
		Store:             n.cfg.LeaseStore,
		Now:               n.cfg.Now,
		HeartbeatInterval: n.cfg.LeaseHeartbeat,
		LivenessTTL:       n.cfg.LeaseTTL,
		MaxClockOffset:    n.cfg.MaxClockOffset,
		Logger:            n.cfg.Logger,
	})
	if err != nil {
		return err
	}
	n.homing = &homingState{
		store:   n.cfg.LeaseStore,
		homes:   h,
		dir:     map[homing.RangeKey]homing.Home{},
		created: map[string]bool{},
		refresh: make(chan struct{}, 1),
		wants:   epochWants{ch: make(chan struct{}, 1)},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	n.homing.failover = newFailoverAgent(n)
	go n.homingLoop()
	return nil
}

func (n *Node) closeHoming() {
	hs := n.homing
	if hs == nil {
		return
	}
	close(hs.stop)
	<-hs.done
	hs.homes.Close()
}

// homingLoop keeps the ranges' roles current: at every change of the view
// (a heartbeat brought new homes, or the lease was first extended) and on
// the directory interval; and runs the failover agent.
func (n *Node) homingLoop() {
	hs := n.homing
	defer close(hs.done)
	dirTick := time.NewTicker(homeDirectoryInterval)
	defer dirTick.Stop()
	failTick := time.NewTicker(failoverScanInterval)
	defer failTick.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-hs.stop; cancel() }()
	n.refreshDirectory(ctx)
	lastRead := time.Now()
	for {
		select {
		case <-hs.homes.Changed():
			n.applyRoles()
		case <-dirTick.C:
			n.refreshDirectory(ctx)
			n.warmEpochHistories(ctx)
			lastRead = time.Now()
			n.serveEpochWants(ctx)
		case <-hs.refresh:
			// At most one extra read per homeRefreshIntervalMin, however
			// often mirrors ask (a peer can make them ask).
			if time.Since(lastRead) >= homeRefreshIntervalMin {
				n.refreshDirectory(ctx)
				lastRead = time.Now()
			}
		case <-hs.wants.ch:
			n.serveEpochWants(ctx)
		case <-failTick.C:
			hs.failover.scan(ctx)
		case <-hs.stop:
			return
		}
	}
}

// homeRefreshIntervalMin bounds how often refreshHomesSoon reads the
// directory between its regular reads.
const homeRefreshIntervalMin = 100 * time.Millisecond

// refreshHomesSoon asks the homing loop to read the homes of the ranges
// homed elsewhere now rather than at its next interval: a mirror heard of
// an epoch it does not know. It never blocks; without homing it does
// nothing.
func (n *Node) refreshHomesSoon() {
	if n.homing == nil {
		return
	}
	select {
	case n.homing.refresh <- struct{}{}:
	default:
	}
}

// rangeKeys lists the node's ranges (streams placed in its region).
func (n *Node) rangeKeys() []homing.RangeKey {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var keys []homing.RangeKey
	for _, st := range n.streams {
		for r := range st.ranges {
			keys = append(keys, homing.RangeKey{Stream: st.spec.Name, Range: uint32(r)})
		}
	}
	return keys
}

// refreshDirectory reads the home records of the ranges not homed here,
// makes sure the ranges this region homes by their spec have records (a
// create whose registration was cut short), then applies the roles.
func (n *Node) refreshDirectory(ctx context.Context) {
	hs := n.homing
	view := hs.homes.View()
	var keys []homing.RangeKey
	hs.dirMu.Lock()
	for _, k := range n.rangeKeys() {
		if _, ok := view.Home(k); !ok {
			keys = append(keys, k)
		} else {
			delete(hs.dir, k) // homed here now: the view is the source
		}
	}
	hs.dirMu.Unlock()
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), homing.RangesPerRequestMax)]
		keys = keys[len(chunk):]
		cctx, cancel := context.WithTimeout(ctx, n.storeTimeout())
		homes, err := hs.store.Homes(cctx, chunk)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				n.logger.Debug("read home directory", "error", err)
			}
			break
		}
		var missing []homing.HomeSpec
		hs.dirMu.Lock()
		for i, h := range homes {
			if h.Epoch == 0 {
				delete(hs.dir, chunk[i])
				if spec, ok := n.streamSpec(chunk[i].Stream); ok && spec.home(chunk[i].Range) == n.cfg.Region && n.leadsCatalogue() {
					missing = append(missing, homing.HomeSpec{Key: chunk[i], Region: n.cfg.Region})
				}
				continue
			}
			hs.dir[chunk[i]] = h
		}
		hs.dirMu.Unlock()
		if len(missing) > 0 {
			if err := n.registerHomes(ctx, missing); err != nil {
				n.logger.Warn("register homes", "ranges", len(missing), "error", err)
			}
		}
	}
	n.applyRoles()
}

// registerHomes creates home records at epoch 1 (those that exist are kept)
// and refreshes this node's view.
func (n *Node) registerHomes(ctx context.Context, specs []homing.HomeSpec) error {
	hs := n.homing
	for len(specs) > 0 {
		chunk := specs[:min(len(specs), homing.RangesPerRequestMax)]
		specs = specs[len(chunk):]
		homes, err := hs.store.CreateHomes(ctx, chunk)
		if err != nil {
			return err
		}
		hs.dirMu.Lock()
		for _, h := range homes {
			if h.Region != n.cfg.Region {
				hs.dir[h.Key] = h
			}
		}
		hs.dirMu.Unlock()
	}
	if err := hs.homes.Refresh(ctx); err != nil {
		return err
	}
	n.applyRoles()
	return nil
}

// registerStreamHomes registers a new stream's homes (every range, at its
// spec's home region): the create returns once appends can be admitted.
func (n *Node) registerStreamHomes(ctx context.Context, spec streamSpec) error {
	if n.homing == nil {
		return nil
	}
	specs := make([]homing.HomeSpec, spec.RangeCount)
	for r := range specs {
		specs[r] = homing.HomeSpec{Key: homing.RangeKey{Stream: spec.Name, Range: uint32(r)}, Region: spec.home(uint32(r))}
	}
	if err := n.registerHomes(ctx, specs); err != nil {
		return apierr.New(apierr.Unavailable, "stream %q was created but its homes are not registered yet (the region's catalogue leader retries): %v", spec.Name, homingErr(err))
	}
	// Every node of the stream's regions learns the homes now, not at its
	// next heartbeat: the create returns when appends can be admitted and
	// redirected everywhere.
	var wg sync.WaitGroup
	for _, r := range spec.Regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := n.refreshRegion(cctx, r); err != nil {
				n.logger.Debug("refresh after create", "region", r, "error", err)
			}
		}()
	}
	wg.Wait()
	return nil
}

func (n *Node) streamSpec(name string) (streamSpec, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.streams[name]
	if !ok {
		return streamSpec{}, false
	}
	return st.spec, true
}

// leadsCatalogue reports whether this node leads its region's catalogue
// group: the region's agent for homing chores.
func (n *Node) leadsCatalogue() bool {
	return n.replicated() && n.region.meta.rep != nil && n.region.meta.rep.LeaderID() == n.cfg.NodeID
}

// applyRoles sets every range's role from the view and the directory.
func (n *Node) applyRoles() {
	hs := n.homing
	view := hs.homes.View()
	// The ranges are listed under n.mu and their roles set under dirMu
	// alone: refreshDirectory takes n.mu (rangeKeys, streamSpec) while
	// holding dirMu, and with the ticker waiting to write n.mu, holding
	// n.mu here while waiting for dirMu deadlocked the node.
	type keyed struct {
		d   *rangeDriver
		key homing.RangeKey
	}
	var all []keyed
	n.mu.RLock()
	for _, st := range n.streams {
		for r, d := range st.ranges {
			all = append(all, keyed{d, homing.RangeKey{Stream: st.spec.Name, Range: uint32(r)}})
		}
	}
	n.mu.RUnlock()
	hs.dirMu.Lock()
	defer hs.dirMu.Unlock()
	for _, k := range all {
		k.d.setRole(n.roleOf(view, k.key))
	}
}

// roleOf is a range's role from the view and the directory (dirMu held).
func (n *Node) roleOf(view *homing.View, key homing.RangeKey) rangeRole {
	if h, ok := view.Home(key); ok {
		return rangeRole{home: true, region: n.cfg.Region, epoch: h.Epoch}
	}
	if h, ok := n.homing.dir[key]; ok && h.Region != n.cfg.Region {
		return rangeRole{region: h.Region, epoch: h.Epoch, start: h.StartOffset}
	}
	return rangeRole{}
}

// initialRole is a new range's role: from the spec without homing; with
// it, from what the node knows now.
func (n *Node) initialRole(stream string, r uint32, spec streamSpec) rangeRole {
	if n.cfg.LeaseStore == nil {
		return rangeRole{home: spec.home(r) == n.cfg.Region, region: spec.home(r), epoch: n.cfg.Epoch}
	}
	if n.homing == nil {
		return rangeRole{} // homing starts with the server: unknown until then
	}
	n.homing.dirMu.Lock()
	defer n.homing.dirMu.Unlock()
	return n.roleOf(n.homing.homes.View(), homing.RangeKey{Stream: stream, Range: r})
}

// admit is the lease check for an append to a range homed here: the epoch
// to stamp the batch with, or why it may not be admitted now.
func (n *Node) admit(d *rangeDriver) (uint64, error) {
	if n.homing == nil {
		return 0, nil
	}
	e, err := n.homing.homes.Check(d.cfg.stream, d.cfg.rangeID)
	if err != nil {
		if errors.Is(err, homing.ErrNotHome) {
			ne := apierr.As(n.notHome(d))
			ne.Message += " (" + err.Error() + ")"
			return 0, ne
		}
		return 0, homingErr(err)
	}
	return e, nil
}

// leaseCheck is a range's lease check before it proposes an admitted
// append and before it acks one (rangeDriverConfig.leaseCheck). A
// duplicate (a retry of a batch already in this home's log) carries the
// epoch it was first appended at, possibly an older one: it is in the log
// the home serves, so only the lease matters.
func (n *Node) leaseCheck(d *rangeDriver, epoch uint64, duplicate, committed bool) error {
	e, err := n.homing.homes.Check(d.cfg.stream, d.cfg.rangeID)
	if err == nil && (e == epoch || duplicate) {
		return nil
	}
	if !committed {
		if err == nil || errors.Is(err, homing.ErrNotHome) {
			return n.notHome(d)
		}
		return homingErr(err)
	}
	if err != nil {
		ae := apierr.As(homingErr(err))
		ae.Message = "batch committed but not acknowledged, the outcome is unknown: " + ae.Message
		ae.Retriable = true
		return ae
	}
	return apierr.New(apierr.NotHome, "stream %s range %d: batch committed at homing epoch %d, the range is now at epoch %d: not acknowledged, the outcome is unknown",
		d.cfg.stream, d.cfg.rangeID, epoch, e)
}

// homingErr maps a homing error to the API's typed error.
func homingErr(err error) error {
	if err == nil {
		return nil
	}
	var ae *apierr.Error
	if errors.As(err, &ae) {
		out := *ae
		out.Message = err.Error()
		return &out
	}
	return apierr.Wrap(apierr.Unavailable, err, "")
}

// orderRegions is the stream's regions, the preference order first.
func orderRegions(regions, preferred []string) []string {
	out := make([]string, 0, len(regions))
	for _, r := range preferred {
		if slices.Contains(regions, r) && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for _, r := range regions {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}
