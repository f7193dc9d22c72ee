package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/geolog/geolog/client"
	"github.com/hashicorp/go-hclog"
)

// RunConfig is how scenarios run.
type RunConfig struct {
	// Cluster provides each scenario's cluster. Required.
	Cluster ClusterFactory
	// Seed drives every random choice of the harness (which follower,
	// jitter of the plan); the same seed picks the same targets.
	Seed uint64
	// Dir, when set, receives each scenario's history (history.json) and
	// any linearizability visualisation, in Dir/<scenario>.
	Dir string
	// LinearTimeout bounds porcupine's search per range, default 60s.
	LinearTimeout time.Duration
	// Logger hears progress, default null.
	Logger hclog.Logger
}

// Result is one scenario's outcome: the table row and what is behind it.
type Result struct {
	Scenario string
	// Skipped says why the scenario did not run (pending, or a fault the
	// cluster cannot inject).
	Skipped string
	// Err is a harness failure (the cluster did not start, the stream could
	// not be created); the checks did not run.
	Err     error
	Elapsed time.Duration

	Queue  QueueResult
	Linear LinearResult
	// Orphaned counts acknowledged records found in an orphan log instead
	// of the final log (the RPO of unplanned failovers); -1 when the
	// cluster runs without homing (no orphan logs).
	Orphaned int
	// RehomePauses are the pauses planned rehomes reported, sorted.
	RehomePauses []Duration
	// Failovers are the times from each leader fault to the first ack of
	// an append to that range invoked after it; Unrecovered counts leader
	// faults with no such ack before the workload ended.
	Failovers   []time.Duration
	Unrecovered int
	// MaxLag is the largest delay between a record's append (home clock)
	// and its delivery to a consumer in a mirror region (-1: no mirror).
	MaxLag time.Duration
	// Group is what CheckGroup found (Ran false without a group).
	Group GroupResult
	// FaultErrors are faults that could not be injected or reverted.
	FaultErrors []string
	// ConsumersBehind lists consumers that had not caught up at the end.
	ConsumersBehind []string
	HistoryPath     string
	// History is what the checks read (nil when they did not run).
	History *History
}

// Safe reports whether no checker found a violation: no anomaly, and no
// illegal history. It is false for a harness error too (nothing was shown
// safe), and true for a skipped scenario.
func (r Result) Safe() bool {
	if r.Skipped != "" {
		return true
	}
	return r.Err == nil && r.Queue.Total() == 0 && r.Linear.Result != porcupine.Illegal && !r.Group.Violated()
}

// Verified reports whether the checks covered everything: every home final
// read completed and porcupine reached a verdict on every range.
func (r Result) Verified() bool {
	return r.Skipped != "" || (r.Err == nil && len(r.Queue.Unverified) == 0 && r.Linear.Result == porcupine.Ok &&
		len(r.Group.Unverified) == 0)
}

// Run runs one scenario and checks its history.
func Run(ctx context.Context, cfg RunConfig, sc Scenario) (res Result) {
	start := time.Now()
	res = Result{Scenario: sc.Name, Orphaned: -1, MaxLag: -1}
	defer func() { res.Elapsed = time.Since(start) }()
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.LinearTimeout <= 0 {
		cfg.LinearTimeout = time.Minute
	}
	log := cfg.Logger.Named(sc.Name)
	if sc.Pending != "" {
		res.Skipped = "pending: " + sc.Pending
		return res
	}
	if err := sc.Validate(); err != nil {
		res.Err = err
		return res
	}
	sc.Shape.setDefaults()
	sc.Workload.setDefaults(sc.Shape)

	for _, f := range sc.Faults {
		if (f.Kind == KindMemberKill || f.Kind == KindMemberPartition || strings.HasPrefix(f.Target.Node, "cursors")) &&
			sc.Workload.Group.Members == 0 {
			res.Err = fmt.Errorf("chaos: fault %s needs a consumer group (workload.group.members)", f)
			return res
		}
	}
	for _, r := range sc.Workload.ProducerRegions {
		if !slices.Contains(sc.Shape.Regions, r) {
			res.Err = fmt.Errorf("chaos: producer region %s is not a region of the scenario", r)
			return res
		}
	}

	cl, err := cfg.Cluster(ctx, sc.Name, sc.Shape)
	if errors.Is(err, ErrUnsupported) {
		res.Skipped = err.Error()
		return res
	}
	if err != nil {
		res.Err = err
		return res
	}
	defer cl.Close()
	if sc.Shape.LeaseStore && cl.Caps().LeaseTTL == 0 {
		res.Skipped = "the scenario needs homing: the cluster runs without a lease store"
		return res
	}
	regions := sc.Shape.Regions
	homes := make([]string, sc.Workload.Ranges)
	for r := range homes {
		homes[r] = sc.Workload.homeOf(uint32(r), regions)
	}
	stream := fmt.Sprintf("chaos-%s-%d-%d", sc.Name, cfg.Seed, time.Now().Unix())
	rec := newRecorder(stream, homes, regions, cl.Caps().LeaseTTL)
	in := newInjector(cl, stream, homes, regions, rec, cfg.Seed, log)
	defer in.close()
	for _, f := range sc.Faults {
		if err := in.check(f); err != nil {
			res.Skipped = err.Error()
			return res
		}
	}

	if err := createStream(ctx, cl, stream, sc.Workload, regions); err != nil {
		res.Err = err
		return res
	}
	wl, err := newWorkload(sc.Workload, cl, stream, regions, homes, rec, log)
	if err != nil {
		res.Err = err
		return res
	}
	defer wl.close()
	if sc.Workload.Group.Members > 0 {
		gr, err := newGroupRun(ctx, sc.Workload.Group, cl, stream, rec, log)
		if err != nil {
			res.Err = err
			return res
		}
		defer gr.close()
		in.group = gr
	}
	wl.startReaders(ctx)
	if err := wl.startProducers(ctx); err != nil {
		res.Err = err
		return res
	}
	log.Info("workload running", "stream", stream, "duration", sc.Duration.Std())

	in.runSchedule(ctx, sc.Faults, sc.Duration.Std())
	if err := in.healAll(ctx); err != nil {
		res.FaultErrors = append(res.FaultErrors, "heal: "+err.Error())
	}
	log.Info("faults over; stopping the workload")
	wl.stopProducers(time.Minute)
	wl.stopTailReaders()

	// The final reads: the home's copy of each range (consistency home),
	// then every other region's, waiting for it to reach the home's tail
	// and to equal it (a returning home forks its divergent tail off only
	// once the new home's replicator reaches it). With homing the home is
	// where the cluster says it is now.
	// Ranges may have split (a split fault, or the nodes' own splitter):
	// the final reads cover every range of the stream's map.
	spans, allHomes, err := wl.rangeMap(ctx, homes[0], homes)
	if err != nil {
		wl.waitConsumers(nil, 0)
		res.Err = fmt.Errorf("chaos: the stream's range map at the end: %w", err)
		return res
	}
	if spans != nil {
		rec.setSpans(spans, allHomes)
	}
	rangeCount := uint32(len(allHomes))
	finalHomes := slices.Clone(allHomes)
	if cl.Caps().LeaseTTL > 0 {
		for r, h := range in.currentHomes(ctx) {
			finalHomes[r] = h.region
		}
		rec.setFinalHomes(finalHomes)
	}
	tails := make([]uint64, rangeCount)
	// One deadline for every copy: a mirror that never converges costs
	// the wait once.
	deadline := time.Now().Add(mirrorConvergeMax)
	for r := range rangeCount {
		home := finalHomes[r]
		want, err := wl.readCopy(ctx, home, r, 0, true)
		rec.setFinal(home, r, err == nil)
		if err != nil {
			log.Warn("final read failed", "region", home, "range", r, "error", err)
			continue
		}
		rec.addReads(want...)
		tails[r] = uint64(len(want))
		for _, region := range regions {
			if region == home {
				continue
			}
			var got []Observation
			for {
				got, err = wl.readCopy(ctx, region, r, tails[r], false)
				if (err == nil && sameLog(got, want)) || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				sleepUntil(ctx, time.Now().Add(300*time.Millisecond))
			}
			rec.setFinal(region, r, err == nil)
			if err != nil {
				log.Warn("final read failed", "region", region, "range", r, "error", err)
				continue
			}
			rec.addReads(got...)
		}
	}
	if cl.Caps().LeaseTTL > 0 {
		orphans, errs := in.readOrphans(ctx)
		rec.setOrphans(orphans)
		res.FaultErrors = append(res.FaultErrors, errs...)
	}
	res.ConsumersBehind = wl.waitConsumers(tails, 30*time.Second)
	if in.group != nil {
		rec.setGroup(in.group.finish(ctx, rec.finalValues(), groupCatchUpMax))
	}
	if slices.ContainsFunc(sc.Faults, func(f Fault) bool { return f.Kind == KindJoin || f.Kind == KindDrain }) {
		// The placement is part of the verdict: every range ends with its
		// replication factor of voters (moves under way get a minute).
		factor := min(3, sc.Shape.NodesPerRegion)
		rec.setReplicas(in.replicaSets(ctx, rangeCount, factor, replicasSettleMax), factor)
	}
	h := rec.finish()

	var vizDir string
	if cfg.Dir != "" {
		vizDir = filepath.Join(cfg.Dir, sc.Name)
		if err := os.MkdirAll(vizDir, 0o755); err == nil {
			res.HistoryPath = filepath.Join(vizDir, "history.json")
			if b, err := json.Marshal(h); err == nil {
				_ = os.WriteFile(res.HistoryPath, b, 0o644)
			}
		}
	}
	res.History = h
	res.Queue = CheckQueue(h)
	res.Linear = CheckLinearizable(h, cfg.LinearTimeout, vizDir)
	res.Orphaned = res.Queue.Orphaned
	res.Failovers, res.Unrecovered = failovers(h)
	for _, ev := range h.Faults {
		res.RehomePauses = append(res.RehomePauses, ev.Pauses...)
	}
	slices.Sort(res.RehomePauses)
	res.MaxLag = maxLag(h)
	res.Group = CheckGroup(h)
	for _, ev := range h.Faults {
		if ev.Err != "" {
			res.FaultErrors = append(res.FaultErrors, fmt.Sprintf("%s: %s", ev.Fault, ev.Err))
		}
	}
	return res
}

// createStream creates the scenario's stream and waits until every region
// describes it with a leader for every range.
func createStream(ctx context.Context, cl Cluster, name string, w Workload, regions []string) error {
	c, err := newClient(cl, regions[0])
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = waitFor(cctx, time.Minute, func() bool {
		_, err := c.CreateStream(cctx, client.StreamConfig{Name: name, RangeCount: w.Ranges, Regions: regions, HomeRegion: w.Home})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	if err != nil {
		return fmt.Errorf("chaos: create stream %s: %w", name, err)
	}
	for _, region := range regions {
		rc, err := newClient(cl, region)
		if err != nil {
			return err
		}
		err = waitFor(cctx, time.Minute, func() bool {
			d, err := rc.DescribeStream(cctx, name)
			if err != nil || len(d.Ranges) != int(w.Ranges) {
				return false
			}
			for _, r := range d.Ranges {
				if r.Leader == "" {
					return false
				}
			}
			return true
		})
		rc.Close()
		if err != nil {
			return fmt.Errorf("chaos: stream %s not ready in %s: %w", name, region, err)
		}
	}
	return nil
}

// failovers measures, for each leader fault, the time from its start to
// the first ack of an append to its range invoked after it started. For a
// fault that took a whole home region away (FaultEvent.HomeEpochs) it
// measures, per range homed there, the time to the first ack under a newer
// epoch (the takeover's), or, if the home never changed, to the first ack
// of an append invoked after the fault ended.
func failovers(h *History) (out []time.Duration, unrecovered int) {
	for _, ev := range h.Faults {
		if ev.Err != "" {
			continue
		}
		if len(ev.HomeEpochs) > 0 {
			for rng, e0 := range ev.HomeEpochs {
				first := int64(-1)
				for _, op := range h.Ops {
					if op.Kind != OpAppend || op.Outcome != OK || op.Range != rng || op.Return < ev.Start {
						continue
					}
					if (op.Epoch > e0 || op.Call >= ev.End) && (first < 0 || op.Return < first) {
						first = op.Return
					}
				}
				if first < 0 {
					unrecovered++
					continue
				}
				out = append(out, time.Duration(first-ev.Start))
			}
			continue
		}
		if !ev.LeaderFault {
			continue
		}
		first := int64(-1)
		for _, op := range h.Ops {
			if op.Kind == OpAppend && op.Outcome == OK && op.Range == ev.Range && op.Call >= ev.Start && (first < 0 || op.Return < first) {
				first = op.Return
			}
		}
		if first < 0 {
			unrecovered++
			continue
		}
		out = append(out, time.Duration(first-ev.Start))
	}
	slices.Sort(out)
	return out, unrecovered
}

// groupCatchUpMax bounds the wait for the group's members to process
// every record of the final log.
const groupCatchUpMax = time.Minute

// replicasSettleMax bounds the wait for every range to have its
// replication factor of voters at the end of a scenario that moved them.
const replicasSettleMax = time.Minute

// mirrorConvergeMax bounds the wait for the mirrors' copies to equal the
// home's in the final reads (all of them together).
const mirrorConvergeMax = 90 * time.Second

// sameLog reports whether two final reads of a range hold the same records
// at the same offsets under the same epochs.
func sameLog(a, b []Observation) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Offset != b[i].Offset || a[i].Epoch != b[i].Epoch || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}

// maxLag is the largest append-to-delivery delay seen by a consumer in a
// mirror region, or -1 when the stream has none.
func maxLag(h *History) time.Duration {
	lag := time.Duration(-1)
	for _, o := range h.Reads {
		if o.Final || strings.HasPrefix(o.Source, "tail") || int(o.Range) >= len(h.Homes) || o.Region == h.Homes[o.Range] || o.AppendUnixNanos == 0 {
			continue
		}
		lag = max(lag, time.Duration(h.Start.UnixNano()+o.At-o.AppendUnixNanos))
	}
	return lag
}

// percentile returns the q-quantile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return -1
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
