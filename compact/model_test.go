package compact

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
)

// model is the log as appended (every record, markers left out), what
// retention deleted and the decisions made: what a copy must hold is
// computed from it by the rule alone, independently of Plan.
type model struct {
	recs      []rec
	start     uint64 // offsets below it were deleted by retention
	decisions []batch.Compaction
}

// want returns the records a copy must hold after compacting at the
// model's last decision: the retained ones, less, below the point, those
// that are not their key's newest below it or are tombstones appended
// before the cutoff.
func (m *model) want() []rec {
	var d batch.Compaction
	if n := len(m.decisions); n > 0 {
		d = m.decisions[n-1]
	}
	newest := map[string]uint64{}
	for _, r := range m.recs {
		if r.off < d.Point && !r.keyless {
			newest[r.key] = r.off
		}
	}
	var out []rec
	for _, r := range m.recs {
		switch {
		case r.off < m.start:
		case r.off >= d.Point || r.keyless:
			out = append(out, r)
		case newest[r.key] == r.off && !(r.tomb && r.appendTime < d.TombstoneCutoffUnixNanos):
			out = append(out, r)
		}
	}
	return out
}

// latest is the changelog a consumer reading the model from the start
// folds into: key → value, a tombstone deleting.
func latest(rs []rec) map[string]string {
	m := map[string]string{}
	for _, r := range rs {
		switch {
		case r.keyless:
		case r.tomb:
			delete(m, r.key)
		default:
			m[r.key] = r.value
		}
	}
	return m
}

// TestModel holds a copy, under random puts, tombstones, keyless records,
// markers, retention deletes, compactions at points and cutoffs moving
// forward (some skipped, some repeated, some limited to part of the log)
// and reopens, to the model: after every complete compaction it holds
// exactly the model's records, and a consumer folding it from the start
// sees the same latest value per key as one folding everything appended
// (while retention deleted nothing). A failure names its seed.
func TestModel(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 15
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed) })
	}
}

func runModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 77))
	l := newTestLog(t, seed, []int64{1024, 2048, 8192}[rng.IntN(3)], rng.IntN(2) == 0)
	m := &model{}
	keys := 3 + rng.IntN(30)
	var boundaries []uint64 // frame ends: where a decision may point
	for step := range 400 {
		switch x := rng.IntN(100); {
		case x < 70:
			recs := make([]batch.Record, 1+rng.IntN(4))
			tm := l.tm + int64(rng.IntN(3))
			for i := range recs {
				r := batch.Record{Key: fmt.Appendf(nil, "k%d", rng.IntN(keys)), Value: fmt.Appendf(nil, "v%d.%d", step, i)}
				switch rng.IntN(10) {
				case 0:
					r.Value, r.Tombstone = nil, true
				case 1:
					r.Key = nil
				}
				recs[i] = r
			}
			h := l.put(0, 0, tm, recs)
			for i, r := range recs {
				m.recs = append(m.recs, rec{off: h.BaseOffset + uint64(i), key: string(r.Key), keyless: r.Key == nil,
					value: string(r.Value), tomb: r.Tombstone, appendTime: h.AppendTimeUnixNanos, epoch: 1})
			}
			boundaries = append(boundaries, h.NextOffset())
		case x < 75 && l.raft:
			l.noop()
		case x < 80 && len(boundaries) > 0:
			// A decision and its marker; sometimes the copy compacts
			// later, or only at the next decision.
			d := nextDecision(rng, m, boundaries, l.tm)
			m.decisions = append(m.decisions, d)
			h := l.mark(d)
			boundaries = append(boundaries, h.NextOffset())
			if rng.IntN(3) > 0 {
				compactAndCheck(t, rng, l, m)
			}
		case x < 83:
			// Retention deletes the oldest sealed segment.
			if sealed := l.s.Sealed(); len(sealed) > 1 {
				if err := l.s.DeletePrefix(sealed[0].NextOffset); err != nil {
					t.Fatal(err)
				}
				m.start = l.s.StartOffset()
			}
		case x < 85:
			l.reopen()
		}
	}
	if len(m.decisions) > 0 {
		compactAndCheck(t, rng, l, m)
	}
}

// nextDecision picks a decision past the last: a frame boundary at or
// below the tail, cutoffs not going back.
func nextDecision(rng *rand.Rand, m *model, boundaries []uint64, now int64) batch.Compaction {
	var last batch.Compaction
	if n := len(m.decisions); n > 0 {
		last = m.decisions[n-1]
	}
	i := sort(boundaries, last.Point) + rng.IntN(len(boundaries)+1)
	p := boundaries[min(i, len(boundaries)-1)]
	return batch.Compaction{Point: max(p, last.Point),
		TombstoneCutoffUnixNanos: max(last.TombstoneCutoffUnixNanos, now-int64(rng.IntN(20))),
		ProducerCutoffUnixNanos:  last.ProducerCutoffUnixNanos}
}

// sort returns the position of the first boundary past p.
func sort(boundaries []uint64, p uint64) int {
	i, _ := slices.BinarySearch(boundaries, p+1)
	return i
}

// compactAndCheck compacts at the model's last decision, sometimes first
// at a limit short of the whole log (as a Raft replica whose followers
// hold compaction back does), and checks the copy against the model.
func compactAndCheck(t *testing.T, rng *rand.Rand, l *testLog, m *model) {
	t.Helper()
	d := m.decisions[len(m.decisions)-1]
	if rng.IntN(3) == 0 {
		if sealed := l.s.Sealed(); len(sealed) > 0 {
			res := l.compact(d, sealed[rng.IntN(len(sealed))].NextOffset)
			checkPartial(t, l, m, res)
		}
	}
	res := l.compact(d, math.MaxUint64)
	if !res.Complete {
		t.Fatalf("compaction at %+v without a limit is not complete", d)
	}
	got, markers := records(t, l.s)
	want := m.want()
	if !equalRecs(got, want) {
		t.Fatalf("after compacting at %+v (start %d):\n got  %s\n want %s", d, m.start, recordsString(got), recordsString(want))
	}
	for _, off := range markers {
		if off < d.Point {
			t.Fatalf("a marker at %d below the point %d is still one", off, d.Point)
		}
	}
	if m.start == 0 {
		if g, w := latest(got), latest(m.recs); fmt.Sprint(g) != fmt.Sprint(w) {
			t.Fatalf("a consumer of the compacted log sees %v, of the whole log %v", g, w)
		}
	}
	// Compacting again at the same decision changes nothing.
	if res := l.compact(d, math.MaxUint64); res.SegmentsRewritten != 0 {
		t.Fatalf("a second compaction at %+v rewrote %d segments", d, res.SegmentsRewritten)
	}
}

// checkPartial: a compaction limited to part of the log holds what the
// rule keeps in the part it rewrote and everything elsewhere.
func checkPartial(t *testing.T, l *testLog, m *model, res Result) {
	t.Helper()
	got, _ := records(t, l.s)
	want := m.want()
	all := map[uint64]bool{}
	for _, r := range m.recs {
		all[r.off] = true
	}
	kept := map[uint64]bool{}
	for _, r := range want {
		kept[r.off] = true
	}
	for _, r := range got {
		if !all[r.off] {
			t.Fatalf("partial compaction holds a record at %d never appended", r.off)
		}
	}
	// Every record the rule keeps is still there.
	have := map[uint64]bool{}
	for _, r := range got {
		have[r.off] = true
	}
	for _, r := range want {
		if !have[r.off] {
			t.Fatalf("partial compaction (%+v) lost the record at %d the rule keeps", res, r.off)
		}
	}
}

// TestDeterministicAcrossCopies: copies of one range whose segments begin
// and end in different places (different segment sizes; one a Raft log
// with control frames), that compact at different moments (one at every
// decision, one only at the last, one twice and after a reopen), hold the
// same records at the same offsets.
func TestDeterministicAcrossCopies(t *testing.T) {
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 5))
		copies := []*testLog{
			newTestLog(t, seed, 1024, false),
			newTestLog(t, seed+100, 4096, false),
			newTestLog(t, seed+200, 2048, true),
		}
		var decisions []batch.Compaction
		var point uint64
		for step := range 300 {
			recs := make([]batch.Record, 1+rng.IntN(3))
			for i := range recs {
				recs[i] = batch.Record{Key: fmt.Appendf(nil, "k%d", rng.IntN(12)), Value: fmt.Appendf(nil, "%d", step)}
				if rng.IntN(8) == 0 {
					recs[i].Value, recs[i].Tombstone = nil, true
				}
			}
			tm := int64(step)
			var h batch.Header
			for i, c := range copies {
				if c.raft && rng.IntN(6) == 0 {
					c.noop()
				}
				h = c.put(0, 0, tm, recs)
				if i == 0 && step%40 == 39 {
					point = h.NextOffset()
				}
			}
			if step%40 == 39 {
				d := batch.Compaction{Point: point, TombstoneCutoffUnixNanos: tm - 30}
				decisions = append(decisions, d)
				for _, c := range copies {
					c.mark(d)
				}
				copies[0].compact(d, math.MaxUint64)
				if rng.IntN(2) == 0 {
					copies[2].compact(d, math.MaxUint64)
				}
			}
		}
		last := decisions[len(decisions)-1]
		copies[1].compact(last, math.MaxUint64)
		copies[2].compact(last, math.MaxUint64)
		copies[2].reopen()
		copies[2].compact(last, math.MaxUint64)
		want, _ := records(t, copies[0].s)
		for i, c := range copies[1:] {
			if got, _ := records(t, c.s); !equalRecs(got, want) {
				t.Fatalf("seed %d: copy %d holds\n %s\ncopy 0 holds\n %s", seed, i+1, recordsString(got), recordsString(want))
			}
		}
		sizes := []int64{copies[0].s.Size(), copies[1].s.Size(), copies[2].s.Size()}
		t.Logf("seed %d: %d records kept, sizes %v", seed, len(want), sizes)
	}
}

// TestCrashDuringCompaction crashes the disk before every file system
// operation of a compaction of several segments: every crash leaves a log
// that opens, holds every record the rule keeps and none it was not
// given, and compacting it again yields exactly the compacted log.
func TestCrashDuringCompaction(t *testing.T) {
	outcomes := map[string]int{}
	for k := 1; ; k++ {
		l := newTestLog(t, uint64(k), 1024, true)
		rng := rand.New(rand.NewPCG(3, 3))
		for step := range 120 {
			l.put(0, 0, int64(step), []batch.Record{{Key: fmt.Appendf(nil, "k%d", rng.IntN(10)), Value: fmt.Appendf(nil, "%d", step)}})
		}
		d := batch.Compaction{Point: l.s.NextOffset()}
		before, _ := records(t, l.s)
		if err := l.s.SealBefore(d.Point); err != nil {
			t.Fatal(err)
		}
		var crashed *vfs.Mem
		ops := 0
		l.mem.SetHook(func(op vfs.Op, name string) error {
			if ops++; ops == k {
				crashed = l.mem.Crash()
			}
			return nil
		})
		l.compact(d, math.MaxUint64)
		l.mem.SetHook(nil)
		after, _ := records(t, l.s)
		if crashed == nil {
			t.Logf("outcomes over %d crash points: %v", k-1, outcomes)
			if outcomes["complete"] == 0 || outcomes["partial"] == 0 && outcomes["none"] == 0 {
				t.Fatalf("outcomes %v", outcomes)
			}
			return
		}
		cfg := l.cfg
		cfg.FS = crashed
		r, err := segment.Open(cfg)
		if err != nil {
			t.Fatalf("crash before operation %d: open: %v", k, err)
		}
		got, _ := records(t, r)
		switch {
		case equalRecs(got, after):
			outcomes["complete"]++
		case equalRecs(got, before):
			outcomes["none"]++
		default:
			outcomes["partial"]++
			checkBetween(t, k, got, before, after)
		}
		c := NewCleaner(CleanerConfig{BytesPerSecond: -1})
		if res := c.RunJob(context.Background(), Job{Log: r, Decision: d, Limit: math.MaxUint64}); res.Err != nil || !res.Complete {
			t.Fatalf("crash before operation %d: compacting again: %+v", k, res)
		}
		if got, _ := records(t, r); !equalRecs(got, after) {
			t.Fatalf("crash before operation %d: compacting again gives\n %s\nwant\n %s", k, recordsString(got), recordsString(after))
		}
		r.Close()
	}
}

// checkBetween checks that got holds every record of after and only
// records of before.
func checkBetween(t *testing.T, k int, got, before, after []rec) {
	t.Helper()
	in := func(rs []rec, r rec) bool { return slices.Contains(rs, r) }
	for _, r := range after {
		if !in(got, r) {
			t.Fatalf("crash before operation %d: lost %v, which the compaction keeps", k, r)
		}
	}
	for _, r := range got {
		if !in(before, r) {
			t.Fatalf("crash before operation %d: holds %v, never appended", k, r)
		}
	}
}
