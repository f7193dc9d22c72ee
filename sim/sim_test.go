package sim

import (
	"flag"
	"testing"

	"github.com/hashicorp/go-hclog"
)

var (
	seedFlag  = flag.Int64("seed", -1, "replay one seed")
	runsFlag  = flag.Int("runs", 50, "number of seeds to run, starting at -first")
	firstFlag = flag.Int64("first", 1, "first seed of a multi-seed run")
	stepsFlag = flag.Int("steps", 3000, "virtual milliseconds under faults per run")
	verbose   = flag.Bool("simlog", false, "log the replicas (useful with -seed)")
)

// TestSimulator runs the simulator over many seeds (make test runs the fixed
// slice 1..50; make sim RUNS=n runs more; make sim SEED=n replays one).
func TestSimulator(t *testing.T) {
	seeds := []int64{}
	if *seedFlag >= 0 {
		seeds = append(seeds, *seedFlag)
	} else {
		for i := 0; i < *runsFlag; i++ {
			seeds = append(seeds, *firstFlag+int64(i))
		}
	}
	var total Result
	compacting := 0
	for _, seed := range seeds {
		opt := Options{Seed: seed, Steps: *stepsFlag}
		if *verbose {
			opt.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug})
		}
		res, err := Run(opt)
		if err != nil {
			t.Fatalf("%v\nreplay: make sim SEED=%d", err, seed)
		}
		if len(seeds) == 1 {
			t.Log(res)
		}
		total.Acked += res.Acked
		total.AckedAhead += res.AckedAhead
		total.Committed += res.Committed
		total.Retries += res.Retries
		total.Duplicates += res.Duplicates
		total.Crashes += res.Crashes
		total.Partitions += res.Partitions
		total.Dropped += res.Dropped
		total.Duped += res.Duped
		total.LostReplies += res.LostReplies
		total.LeaderChanges += res.LeaderChanges
		if res.Compaction {
			compacting++
		}
		total.SegmentsCompacted += res.SegmentsCompacted
		total.SnapshotsSent += res.SnapshotsSent
		total.SnapsFailed += res.SnapsFailed
		total.SnapshotsInstalled += res.SnapshotsInstalled
	}
	t.Logf("%d seeds: %d acked (%d ahead of the leader's own write), %d committed, %d retries (%d duplicates), %d crashes, %d partitions, %d msgs dropped, %d duplicated, %d replies lost, %d leader changes",
		len(seeds), total.Acked, total.AckedAhead, total.Committed, total.Retries, total.Duplicates, total.Crashes, total.Partitions,
		total.Dropped, total.Duped, total.LostReplies, total.LeaderChanges)
	t.Logf("%d seeds compacting: %d segments compacted, %d snapshots sent (%d failed), %d installed",
		compacting, total.SegmentsCompacted, total.SnapshotsSent, total.SnapsFailed, total.SnapshotsInstalled)
	if total.Acked == 0 {
		t.Fatal("no record was acked in any run: the simulator exercised nothing")
	}
	if len(seeds) >= 20 && (total.SegmentsCompacted == 0 || total.SnapshotsInstalled == 0) {
		t.Fatal("no snapshot was installed in any run: compaction and catch-up went unexercised")
	}
}

// TestSimulatorIsDeterministic: the same seed gives the same run.
func TestSimulatorIsDeterministic(t *testing.T) {
	a, errA := Run(Options{Seed: 7, Steps: 1500})
	b, errB := Run(Options{Seed: 7, Steps: 1500})
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if a != b {
		t.Fatalf("seed 7 ran differently:\n%v\n%v", a, b)
	}
}
