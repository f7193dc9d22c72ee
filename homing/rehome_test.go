package homing

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestRehomeCore runs the scripts in testdata/cores/rehome*.txt against
// the rehome coordinator core. The script plays the driver and answers
// every op as it likes (regenerate with -rewrite). Ranges are of stream
// chat; lists are by range in request order, _ for none.
//
//	rehome from=us to=eu ranges=0-2 [epoch=1] [offset=500ms] [retry=100ms]
//	tails-read at=1s tails=(5,7,9) | none          answers OpReadTails
//	tails-awaited at=1s [fail=(1)]                 answers OpAwaitTails (fail: a timeout)
//	prepared at=1s [drain=5] [fail=(1)] [err] [no-snapshot]   answers OpPrepare
//	stopped at=1s tails=(10,_,12) [seen=(1:5,2:5)] [err]       answers OpStop
//	drained-tails at=1s tails=(10,11) [fail=(1)]   answers OpDrainedTails
//	liveness at=1s live=(1/9s/4,2/9s/5) | err      id/expiration/homes-seen
//	confirmed at=1s [seen=(2:5)]
//	tick at=1s
//	completed at=1s [not-drained=(0)] [fail=(1)] [err]   answers OpComplete
//	started at=1s
//	abandon at=1s
//	results
//
// Every answer prints the ops and notes Ready returns after it.
func TestRehomeCore(t *testing.T) {
	paths, err := filepath.Glob("testdata/cores/rehome*.txt")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no rehome scripts: %v", err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			h := &rhHarness{}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				return h.run(t, d)
			})
		})
	}
}

type rhHarness struct {
	core     *Rehome
	from, to string
	reqs     []RehomeRequest // the last prepare's or complete's
	version  uint64          // homes versions handed out
}

func chat(r int) RangeKey { return RangeKey{Stream: "chat", Range: uint32(r)} }

// byRange parses a list by range: (5,_,7) → chat/0=5, chat/2=7.
func byRange(t *testing.T, d *datadriven.TestData, key string) map[RangeKey]uint64 {
	out := map[RangeKey]uint64{}
	for r, s := range ddList(d, key) {
		if s == "_" {
			continue
		}
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %s: %v", d.Pos, key, err)
		}
		out[chat(r)] = v
	}
	return out
}

// rangeSet parses fail=(1,2) as range numbers.
func rangeSet(d *datadriven.TestData, key string) map[RangeKey]bool {
	out := map[RangeKey]bool{}
	for _, s := range ddList(d, key) {
		r, _ := strconv.Atoi(s)
		out[chat(r)] = true
	}
	return out
}

func seenOf(t *testing.T, d *datadriven.TestData) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, s := range ddList(d, "seen") {
		a, b, _ := strings.Cut(s, ":")
		id, err1 := strconv.ParseUint(a, 10, 64)
		v, err2 := strconv.ParseUint(b, 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: seen %q", d.Pos, s)
		}
		out[id] = v
	}
	return out
}

var errScript = errors.New("scripted failure")

func (h *rhHarness) run(t *testing.T, d *datadriven.TestData) string {
	now := ddDurOr(t, d, "at", 0)
	c := h.core
	switch d.Cmd {
	case "rehome":
		h.from, h.to = ddStr(t, d, "from", "us"), ddStr(t, d, "to", "eu")
		cfg := RehomeConfig{From: h.from, To: h.to, MaxOffsetNanos: ddDurOr(t, d, "offset", int64(500*time.Millisecond)),
			DrainRetryNanos: ddDurOr(t, d, "retry", 0)}
		for _, r := range ddRanges(t, d) {
			cfg.Ranges = append(cfg.Ranges, Home{Key: chat(int(r)), Region: h.from, Epoch: ddUint(t, d, "epoch", 1)})
		}
		core, err := NewRehome(cfg)
		if err != nil {
			return "error: " + err.Error()
		}
		h.core, h.version = core, 10
	case "tails-read":
		c.TailsRead(now, byRange(t, d, "tails"), !d.HasArg("none"))
	case "tails-awaited":
		errs := map[RangeKey]error{}
		for k := range rangeSet(d, "fail") {
			errs[k] = fmt.Errorf("%s did not reach its tail: timeout", k)
		}
		c.TailsAwaited(now, errs)
	case "prepared":
		if err := h.err(d); err != nil {
			c.Prepared(now, RehomeBatch{}, err)
		} else {
			c.Prepared(now, h.prepared(t, d), nil)
		}
	case "stopped":
		c.Stopped(now, byRange(t, d, "tails"), seenOf(t, d), h.err(d))
	case "drained-tails":
		errs := map[RangeKey]error{}
		for k := range rangeSet(d, "fail") {
			errs[k] = fmt.Errorf("the home region could not confirm the tail of %s", k)
		}
		c.DrainedTails(now, byRange(t, d, "tails"), errs)
	case "liveness":
		c.LivenessRead(now, h.liveness(t, d), h.err(d))
	case "confirmed":
		c.Confirmed(now, seenOf(t, d))
	case "tick":
		c.Tick(now)
	case "completed":
		if err := h.err(d); err != nil {
			c.Completed(now, RehomeBatch{}, err)
		} else {
			c.Completed(now, h.completed(d), nil)
		}
	case "started":
		c.Started(now)
	case "abandon":
		c.Abandon(now, fmt.Errorf("the caller gave up: %w", errScript))
	case "results":
		return h.results()
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return h.ready()
}

func (h *rhHarness) err(d *datadriven.TestData) error {
	if d.HasArg("err") {
		return newError(ErrStoreUnavailable, "lease store unavailable: timeout")
	}
	return nil
}

// prepared answers the last prepare: each range moving, at the drain
// version, unless it fails (epoch mismatch).
func (h *rhHarness) prepared(t *testing.T, d *datadriven.TestData) RehomeBatch {
	fail := rangeSet(d, "fail")
	drain := ddUint(t, d, "drain", h.version+1)
	var b RehomeBatch
	var homes []Home
	for _, q := range h.reqs {
		if fail[q.Key] {
			b.Homes, b.Errs = append(b.Homes, Home{}), append(b.Errs, newError(ErrEpochMismatch, "range %s is not at epoch %d", q.Key, q.Epoch))
			continue
		}
		hm := Home{Key: q.Key, Region: h.from, Epoch: q.Epoch, MovingTo: h.to, DrainVersion: drain}
		b.Homes, b.Errs = append(b.Homes, hm), append(b.Errs, nil)
		homes = append(homes, hm)
	}
	if !d.HasArg("no-snapshot") && len(homes) > 0 {
		h.version = drain
		b.Regions = []RegionHomes{{Region: h.from, Version: drain, Homes: homes}}
	}
	return b
}

// completed answers the last complete: each range moved at epoch+1, unless
// listed as not drained or failed.
func (h *rhHarness) completed(d *datadriven.TestData) RehomeBatch {
	notDrained, fail := rangeSet(d, "not-drained"), rangeSet(d, "fail")
	var b RehomeBatch
	var moved []Home
	for _, q := range h.reqs {
		switch {
		case notDrained[q.Key]:
			b.Homes, b.Errs = append(b.Homes, Home{}), append(b.Errs, newError(ErrNotDrained, "a node of %s has not confirmed", h.from))
		case fail[q.Key]:
			b.Homes, b.Errs = append(b.Homes, Home{}), append(b.Errs, newError(ErrEpochMismatch, "range %s is not at epoch %d", q.Key, q.Epoch))
		default:
			hm := Home{Key: q.Key, Region: h.to, Epoch: q.Epoch + 1, StartOffset: q.StartOffset, PrevRegion: h.from}
			b.Homes, b.Errs = append(b.Homes, hm), append(b.Errs, nil)
			moved = append(moved, hm)
		}
	}
	if len(moved) > 0 {
		h.version++
		b.Regions = []RegionHomes{{Region: h.to, Version: h.version, Homes: moved}, {Region: h.from, Version: h.version}}
	}
	return b
}

func (h *rhHarness) liveness(t *testing.T, d *datadriven.TestData) []Liveness {
	var out []Liveness
	for _, s := range ddList(d, "live") {
		f := strings.Split(s, "/")
		if len(f) != 3 {
			t.Fatalf("%s: live %q: id/expiration/seen", d.Pos, s)
		}
		id, _ := strconv.ParseUint(f[0], 10, 64)
		exp, err := time.ParseDuration(f[1])
		seen, _ := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			t.Fatalf("%s: live %q: %v", d.Pos, s, err)
		}
		out = append(out, Liveness{NodeID: id, Region: h.from, Epoch: 1, ExpirationNanos: int64(exp), HomesSeen: seen})
	}
	return out
}

func fmtKeys(keys []RangeKey) string {
	var s []string
	for _, k := range keys {
		s = append(s, k.String())
	}
	return strings.Join(s, ",")
}

func fmtTails(m map[RangeKey]uint64) string {
	keys := slices.SortedFunc(func(yield func(RangeKey) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}, compareKeys)
	var s []string
	for _, k := range keys {
		s = append(s, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(s, ",")
}

func fmtSeen(m map[uint64]uint64) string {
	var s []string
	for _, id := range slices.Sorted(func(yield func(uint64) bool) {
		for id := range m {
			if !yield(id) {
				return
			}
		}
	}) {
		s = append(s, fmt.Sprintf("n%d:%d", id, m[id]))
	}
	return strings.Join(s, ",")
}

func fmtSnap(s *RegionHomes) string {
	if s == nil {
		return " heartbeat"
	}
	return fmt.Sprintf(" homes@%d", s.Version)
}

// ready prints what Ready returns.
func (h *rhHarness) ready() string {
	ops, notes := h.core.Ready()
	var out []string
	for _, n := range notes {
		s := "note: "
		if n.Key != (RangeKey{}) {
			s += n.Key.String() + ": "
		}
		s += n.Msg
		if len(n.Nodes) > 0 {
			s += fmt.Sprintf(" (nodes %v)", n.Nodes)
		}
		if n.Err != nil {
			s += ": " + n.Err.Error()
		}
		out = append(out, s)
	}
	for _, op := range ops {
		s := "op " + op.Kind.String()
		if op.Region != "" {
			s += " " + op.Region
		}
		switch op.Kind {
		case OpReadTails, OpDrainedTails:
			s += " (" + fmtKeys(op.Keys) + ")"
		case OpStop:
			s += " (" + fmtKeys(op.Keys) + ")" + fmtSnap(op.Homes)
		case OpStart, OpRelease:
			s += fmtSnap(op.Homes)
		case OpAwaitTails:
			s += " (" + fmtTails(op.Tails) + ")"
		case OpPrepare, OpComplete:
			h.reqs = op.Reqs
			var rs []string
			for _, q := range op.Reqs {
				r := fmt.Sprintf("%s@%d", q.Key, q.Epoch)
				if op.Kind == OpComplete {
					r += fmt.Sprintf("+%d", q.StartOffset)
				}
				rs = append(rs, r)
			}
			s += " (" + strings.Join(rs, " ") + ")"
			if op.Kind == OpComplete {
				s += " seen=(" + fmtSeen(op.Seen) + ")"
			}
		case OpCancel:
			s += fmt.Sprintf(" %s@%d", op.Key, op.Epoch)
		case OpWait:
			s += " until " + dur(op.AtNanos)
		}
		out = append(out, s)
	}
	if h.core.Done() {
		out = append(out, "done")
	}
	if len(out) == 0 {
		return "nothing"
	}
	return strings.Join(out, "\n")
}

func (h *rhHarness) results() string {
	var out []string
	for _, r := range h.core.Results() {
		if r.Moved {
			out = append(out, fmt.Sprintf("%s: moved to %s@%d start=%d", r.Key, r.Home.Region, r.Home.Epoch, r.StartOffset))
		} else {
			out = append(out, fmt.Sprintf("%s: stayed: %v", r.Key, r.Err))
		}
	}
	tm := h.core.Times()
	out = append(out, fmt.Sprintf("pause=%s prepare=%s stop-old=%s catch-up=%s complete=%s start-new=%s attempts=%d",
		dur(tm.PauseNanos), dur(tm.PrepareNanos), dur(tm.StopOldNanos), dur(tm.CatchUpNanos), dur(tm.CompleteNanos),
		dur(tm.StartNewNanos), tm.CompleteAttempts))
	return strings.Join(out, "\n")
}
