package homing

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestTakeoverCore runs the scripts in testdata/cores/takeover*.txt against
// the failover decision core. The script plays the driver: it ticks the
// core and answers its ops, in any order and with any answer, so every
// interleaving can be forced (regenerate with -rewrite).
//
//	config region=eu regions=(us,eu,ap) settle=5.5s grace=3s offset=500ms [chunk=2]
//	stream name=chat regions=(eu,ap,us)         preference order
//	home stream=chat ranges=0-3 region=us epoch=1 [moving-to=ap]   the directory
//	unhome stream=chat ranges=0-1                 drop from the directory
//	tick at=10s [serve-until=20s] [lead=false] [unreached=true] [reached=8s]
//	                                              (serve-until defaults to at+4s;
//	                                              reached: store reached since)
//	lead false|true                               LeaderChanged
//	current [round=N]                             Current
//	liveness [round=N] exp=(1s,2s) | err          answers OpReadLiveness
//	tails [round=N] local=(5,7,_,3) [ap=(6,9,3,3)] [stream=chat]   answers OpSurveyTails
//	result [round=N] granted=(0,1) | err          answers OpTakeover
//
// Every command prints the ops and notes Ready returns after it. round
// defaults to the round of the last op printed.
func TestTakeoverCore(t *testing.T) {
	paths, err := filepath.Glob("testdata/cores/takeover*.txt")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no takeover scripts: %v", err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			h := &toHarness{streams: map[string][]string{}, dir: map[RangeKey]Home{}}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				return h.run(t, d)
			})
		})
	}
}

type toHarness struct {
	core    *Takeover
	streams map[string][]string
	dir     map[RangeKey]Home
	round   uint64
	sent    []TakeoverRange // the last OpTakeover's ranges
}

// ddList returns an argument's values: key=(a,b) or key=a.
func ddList(d *datadriven.TestData, key string) []string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			var out []string
			for _, v := range a.Vals {
				for _, f := range strings.Split(v, ",") {
					if f = strings.TrimSpace(f); f != "" {
						out = append(out, f)
					}
				}
			}
			return out
		}
	}
	return nil
}

func (h *toHarness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "config":
		c, err := NewTakeover(TakeoverConfig{Region: ddStr(t, d, "region", ""), Regions: ddList(d, "regions"),
			SettleNanos: ddDurOr(t, d, "settle", 0), GraceNanos: ddDurOr(t, d, "grace", 0),
			MaxOffsetNanos: ddDurOr(t, d, "offset", 0), ChunkRangesMax: int(ddUint(t, d, "chunk", 0))})
		if err != nil {
			return "error: " + err.Error()
		}
		h.core = c
		return "ok"
	case "stream":
		h.streams[ddStr(t, d, "name", "")] = ddList(d, "regions")
		return "ok"
	case "home", "unhome":
		for _, r := range ddRanges(t, d) {
			k := RangeKey{Stream: ddStr(t, d, "stream", "chat"), Range: r}
			if d.Cmd == "unhome" {
				delete(h.dir, k)
				continue
			}
			h.dir[k] = Home{Key: k, Region: ddStr(t, d, "region", ""), Epoch: ddUint(t, d, "epoch", 1), MovingTo: ddStr(t, d, "moving-to", "")}
		}
		return "ok"
	case "tick":
		at := ddDur(t, d, "at")
		tk := TakeoverTick{NowNanos: at, Leading: ddStr(t, d, "lead", "true") == "true",
			ServeUntilNanos: ddDurOr(t, d, "serve-until", at+int64(4*time.Second)), Streams: h.streams,
			StoreUnreached: ddStr(t, d, "unreached", "false") == "true", ReachedSinceNanos: ddDurOr(t, d, "reached", 0)}
		for _, k := range slices.SortedFunc(func(yield func(RangeKey) bool) {
			for k := range h.dir {
				if !yield(k) {
					return
				}
			}
		}, compareKeys) {
			tk.Homes = append(tk.Homes, h.dir[k])
		}
		h.core.Tick(tk)
	case "lead":
		h.core.LeaderChanged(d.CmdArgs[0].Key == "true")
	case "current":
		if h.core.Current(h.roundOf(t, d)) {
			return "current"
		}
		return "stale: an awaited op of it is not carried out"
	case "liveness":
		var live []Liveness
		for i, e := range ddList(d, "exp") {
			v, err := time.ParseDuration(e)
			if err != nil {
				t.Fatalf("%s: exp %q: %v", d.Pos, e, err)
			}
			live = append(live, Liveness{NodeID: uint64(i + 1), ExpirationNanos: int64(v)})
		}
		h.core.LivenessRead(h.roundOf(t, d), live, h.errOf(d))
	case "tails":
		stream := ddStr(t, d, "stream", "chat")
		rep := TailReport{Remote: map[string]map[string][]uint64{}, Local: map[RangeKey]uint64{}}
		for _, a := range d.CmdArgs {
			switch a.Key {
			case "round", "stream":
				continue
			}
			tails := ddList(d, a.Key)
			if a.Key == "local" {
				for r, s := range tails {
					if s != "_" {
						rep.Local[RangeKey{Stream: stream, Range: uint32(r)}] = h.uint(t, d, s)
					}
				}
				continue
			}
			var rt []uint64
			for _, s := range tails {
				rt = append(rt, h.uint(t, d, s))
			}
			rep.Remote[a.Key] = map[string][]uint64{stream: rt}
		}
		h.core.TailsRead(h.roundOf(t, d), rep)
	case "result":
		var res TakeoverResult
		granted := ddList(d, "granted")
		for _, tr := range h.sent {
			o := RangeOutcome{Key: tr.Key, Outcome: OutcomeEpochMismatch}
			if slices.Contains(granted, strconv.Itoa(int(tr.Key.Range))) {
				o.Outcome = Granted
			}
			res.Ranges = append(res.Ranges, o)
		}
		h.core.TakeoverDone(h.roundOf(t, d), res, h.errOf(d))
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return h.ready()
}

func (h *toHarness) uint(t *testing.T, d *datadriven.TestData, s string) uint64 {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q: %v", d.Pos, s, err)
	}
	return v
}

func (h *toHarness) roundOf(t *testing.T, d *datadriven.TestData) uint64 {
	return ddUint(t, d, "round", h.round)
}

func (h *toHarness) errOf(d *datadriven.TestData) error {
	if d.HasArg("err") {
		return newError(ErrStoreUnavailable, "lease store unavailable: timeout")
	}
	return nil
}

// ready prints what Ready returns.
func (h *toHarness) ready() string {
	ops, notes := h.core.Ready()
	var out []string
	for _, n := range notes {
		switch {
		case n.Down:
			out = append(out, fmt.Sprintf("note: %s down (%d ranges)", n.Region, n.Ranges))
		case n.Granted:
			out = append(out, fmt.Sprintf("note: granted %s from %s at epoch %d start=%d", n.Range.Key, n.Region, n.Range.Epoch+1, n.Range.StartOffset))
		}
	}
	for _, op := range ops {
		h.round = op.Round
		s := fmt.Sprintf("op r%d %s", op.Round, op.Kind)
		switch op.Kind {
		case OpReadLiveness:
			s += " " + op.Region
		case OpSurveyTails:
			var asks, keys []string
			for _, a := range op.Asks {
				asks = append(asks, a.Region+":"+a.Stream)
			}
			for _, k := range op.Keys {
				keys = append(keys, k.String())
			}
			s += fmt.Sprintf(" from=%s ask=(%s) local=(%s)", op.Region, strings.Join(asks, ","), strings.Join(keys, ","))
		case OpTakeover:
			h.sent = op.Ranges
			var rs []string
			for _, r := range op.Ranges {
				rs = append(rs, fmt.Sprintf("%s@%d+%d", r.Key, r.Epoch, r.StartOffset))
			}
			s += fmt.Sprintf(" from=%s (%s)", op.Region, strings.Join(rs, " "))
		case OpRefreshRegions:
			s += " " + strings.Join(op.Regions, ",")
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return "nothing"
	}
	return strings.Join(out, "\n")
}
