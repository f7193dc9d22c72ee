package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The parallel runner (make sim RUNS=n: -jobs processes). etcd raft draws
// its election jitter from crypto/rand.Reader, a process-wide variable
// that Run points at the seed's generator, so two seeds cannot run at
// once in one process and stay deterministic. The runner starts -jobs
// copies of this test binary instead (-simchild=k/n: seeds first+k,
// first+k+n, ...), each running its seeds one after another exactly as
// make sim SEED=n replays one, and reporting each seed on a line of its
// own; it prints each failing seed with its replay command as it comes,
// stops the others at the first failure (unless -keepgoing), and sums
// the runs.

// childLine prefixes a child's report of one seed on its stdout.
const childLine = "simseed "

// childReport is one seed's outcome as a child reports it.
type childReport struct {
	Seed int64
	Res  Result
	Err  string
}

// runChild runs share "k/n" of the seeds and reports each.
func runChild(t *testing.T, share string) {
	var k, n int64
	if _, err := fmt.Sscanf(share, "%d/%d", &k, &n); err != nil || n <= 0 || k < 0 || k >= n {
		t.Fatalf("-simchild %q: want k/n with 0 <= k < n", share)
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for seed := *firstFlag + k; seed < *firstFlag+int64(*runsFlag); seed += n {
		res, err := Run(Options{Seed: seed, Steps: *stepsFlag, Regions: *regions, mut: mutations{tolerateOldHomeReads: *known}})
		rep := childReport{Seed: seed, Res: res}
		if err != nil {
			rep.Err = err.Error()
		}
		b, _ := json.Marshal(rep)
		fmt.Fprintf(out, "%s%s\n", childLine, b)
		out.Flush()
		if err != nil && !*keepGoing {
			return
		}
	}
}

// runParallel starts the children and sums their reports.
func runParallel(t *testing.T) {
	jobs := min(*jobsFlag, max(*runsFlag, 1))
	var s summary
	s.start(*regions, *stepsFlag, jobs)
	reports := make(chan childReport)
	var procs []*exec.Cmd
	var wg sync.WaitGroup
	for k := 0; k < jobs; k++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSimulator$", "-test.timeout=0",
			"-simchild="+strconv.Itoa(k)+"/"+strconv.Itoa(jobs), "-first="+strconv.FormatInt(*firstFlag, 10),
			"-runs="+strconv.Itoa(*runsFlag), "-steps="+strconv.Itoa(*stepsFlag), "-regions="+strconv.Itoa(*regions),
			"-keepgoing="+strconv.FormatBool(*keepGoing), "-known="+strconv.FormatBool(*known))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			readChild(stdout, reports)
			cmd.Wait() // a child that stopped at a failure exits non-zero: its report says why
		}()
	}
	go func() { wg.Wait(); close(reports) }()
	stopped := false
	for rep := range reports {
		var err error
		if rep.Err != "" {
			err = fmt.Errorf("%s", rep.Err)
			t.Errorf("%s\n%s", rep.Err, replayLine(rep.Seed, *stepsFlag, *regions))
		}
		s.add(rep.Res, err)
		s.progress(t, *runsFlag)
		if err != nil && !*keepGoing && !stopped {
			stopped = true
			for _, p := range procs {
				p.Process.Kill() // the children this runner started, and no other
			}
		}
	}
	if !stopped && s.seeds < *runsFlag {
		t.Errorf("sim: only %d of %d seeds reported: a child process died (its output is above)", s.seeds, *runsFlag)
	}
	s.report(t, *runsFlag)
}

// readChild forwards a child's seed reports; its other output (a test
// binary's PASS/FAIL lines) is dropped.
func readChild(r interface{ Read([]byte) (int, error) }, reports chan<- childReport) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), childLine)
		if !ok {
			continue
		}
		var rep childReport
		if err := json.Unmarshal([]byte(line), &rep); err != nil {
			rep = childReport{Seed: -1, Err: "sim: a child's report does not decode: " + err.Error()}
		}
		reports <- rep
	}
}

// replayLine is the command that replays seed.
func replayLine(seed int64, steps, regions int) string {
	return fmt.Sprintf("replay: make sim SEED=%d STEPS=%d REGIONS=%d", seed, steps, regions)
}

// summary sums the runs of a make sim or make test slice.
type summary struct {
	regions, steps, jobs int
	began                time.Time
	lastProgress         time.Time
	seeds, failed        int
	compacting           int
	balancing            int
	total                Result
}

func (s *summary) start(regions, steps, jobs int) {
	*s = summary{regions: regions, steps: steps, jobs: jobs, began: time.Now()}
	s.lastProgress = s.began
}

func (s *summary) add(res Result, err error) {
	s.seeds++
	if err != nil {
		s.failed++
	}
	if res.Compaction {
		s.compacting++
	}
	if res.LeaderBalanceTicks > 0 {
		s.balancing++
	}
	t := &s.total
	t.Acked += res.Acked
	t.AckedAhead += res.AckedAhead
	t.Committed += res.Committed
	t.Retries += res.Retries
	t.Duplicates += res.Duplicates
	t.Crashes += res.Crashes
	t.Partitions += res.Partitions
	t.Dropped += res.Dropped
	t.Duped += res.Duped
	t.LostReplies += res.LostReplies
	t.LeaderChanges += res.LeaderChanges
	t.SegmentsCompacted += res.SegmentsCompacted
	t.SnapshotsSent += res.SnapshotsSent
	t.SnapsFailed += res.SnapsFailed
	t.SnapshotsInstalled += res.SnapshotsInstalled
	t.Geo = t.Geo.add(res.Geo)
	t.Homing = t.Homing.add(res.Homing)
	t.Orphans = t.Orphans.add(res.Orphans)
	t.Moves = t.Moves.add(res.Moves)
	t.Splits = t.Splits.add(res.Splits)
	t.VirtualMs += res.VirtualMs
	t.BalanceTransfers += res.BalanceTransfers
}

// progress logs a line every minute of a long run.
func (s *summary) progress(t *testing.T, of int) {
	if now := time.Now(); now.Sub(s.lastProgress) >= time.Minute {
		s.lastProgress = now
		el := now.Sub(s.began).Seconds()
		t.Logf("sim: %d of %d seeds, %d failed, %.1f seeds/s", s.seeds, of, s.failed, float64(s.seeds)/el)
	}
}

// report logs the totals: seeds, speed, virtual time, the fault mix; and
// fails a run of 20 seeds or more that left a part of the system
// unexercised.
func (s *summary) report(t *testing.T, of int) {
	el := time.Since(s.began).Seconds()
	tot := s.total
	t.Logf("sim: %d of %d seeds run (%d regions, %d virtual ms of faults each), %d clean, %d failed, in %.1f s on %d process(es): %.2f seeds/s; %.1f virtual hours covered (%.0f x real time)",
		s.seeds, of, s.regions, s.steps, s.seeds-s.failed, s.failed, el, s.jobs, float64(s.seeds)/el,
		float64(tot.VirtualMs)/3.6e6, float64(tot.VirtualMs)/1e3/el)
	t.Logf("sim: fault mix: %d node crashes, %d node partitions, %d Raft messages dropped, %d duplicated, %d producer replies lost, %d leader changes; geo: %d region partitions, %d streams broken, %d timed out, %d zombie sources; homing: %d lease-store outages, %d home regions cut off, %d ranges taken over, %d replicas forked, %d acked records orphaned, %d streams resent from an epoch change",
		tot.Crashes, tot.Partitions, tot.Dropped, tot.Duped, tot.LostReplies, tot.LeaderChanges,
		tot.Geo.Partitions, tot.Geo.Broken, tot.Geo.TimedOut, tot.Geo.Zombies,
		tot.Homing.Outages, tot.Homing.Failovers, tot.Homing.Takeovers, tot.Homing.Forks, tot.Homing.Orphaned, tot.Geo.Resends)
	t.Logf("sim: %d acked (%d ahead of the leader's own write), %d committed, %d retries (%d answered as duplicates); %d seeds compacting: %d segments compacted, %d snapshots sent (%d failed), %d installed",
		tot.Acked, tot.AckedAhead, tot.Committed, tot.Retries, tot.Duplicates,
		s.compacting, tot.SegmentsCompacted, tot.SnapshotsSent, tot.SnapsFailed, tot.SnapshotsInstalled)
	if s.regions > 1 {
		t.Logf("sim: %d seeds of %d regions%s%s%s", s.seeds, s.regions, tot.Geo, tot.Homing, tot.Orphans)
	}
	t.Logf("sim: %d seeds balancing leaders: %d hand-offs to a preferred leader", s.balancing, tot.BalanceTransfers)
	if tot.Moves.Spares > 0 {
		t.Logf("sim: %d seeds with moves%s", tot.Moves.Runs, tot.Moves)
	}
	if tot.Splits.Runs > 0 {
		t.Logf("sim: %d seeds with a split%s", tot.Splits.Runs, tot.Splits)
	}
	if s.failed > 0 {
		return
	}
	s.exercised(t)
}

// exercised fails a run of 20 seeds or more in which some part of the
// system never ran: the checks would have had nothing to check.
func (s *summary) exercised(t *testing.T) {
	tot := s.total
	if tot.Acked == 0 {
		t.Fatal("no record was acked in any run: the simulator exercised nothing")
	}
	if s.seeds < 20 {
		return
	}
	if tot.SegmentsCompacted == 0 || tot.SnapshotsInstalled == 0 {
		t.Fatal("no snapshot was installed in any run: compaction and catch-up went unexercised")
	}
	if tot.BalanceTransfers == 0 {
		t.Fatal("no leader was handed to its preferred node in any run: leader balance went unexercised")
	}
	if g := tot.Geo; s.regions > 1 && (g.Frames == 0 || g.Partitions == 0 || g.Broken == 0 || g.TimedOut == 0 || g.Duplicates == 0) {
		t.Fatalf("replication went unexercised: %v", g)
	}
	if h := tot.Homing; s.regions > 1 && (h.Outages == 0 || h.Refused == 0 || h.Takeovers == 0 || h.Orphaned == 0 || h.NewHomeAcks == 0 || h.Forks == 0 ||
		h.Reads.Local == 0 || h.Reads.HomeReads == 0 || h.Reads.Fenced == 0 || h.Reads.ForkExplained == 0 ||
		h.Rehomes.Moved == 0 || h.Rehomes.StopLeaderChanges == 0 || h.Replaced.Promoted == 0) {
		t.Fatalf("homing went unexercised: %v", h)
	}
	// Faults aimed at moves: crashes or partitions here (the slice's draws
	// may miss one kind); TestMovesSeeds requires both.
	if m := tot.Moves; s.regions == 1 && (m.Joined == 0 || m.Drained == 0 || m.Done == 0 || m.HandOffs == 0 || m.AimedCrashes+m.AimedPartition == 0) {
		t.Fatalf("replica moves went unexercised: %v", m)
	}
}
