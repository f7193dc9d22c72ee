package homing

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs the scripts in testdata/ against the Core and each
// Store implementation: the in-memory twin and PostgreSQL. Both must
// produce the golden output (regenerate with -rewrite), which is how the
// twin is held to the SQL store's semantics.
//
// Commands (times are durations from the clock's zero; a node's clock
// reads at + its skew):
//
//	config ttl=5s offset=500ms interval=1s retry=250ms
//	node id=1 region=us [skew=100ms]
//	heartbeat id=1 at=1s [force]      Core.Next + Store.Heartbeat + Core.Done
//	check id=1 stream=chat range=0 at=2s
//	check-read|check-final id=1 stream=chat range=0 at=2s   View.CheckRead, View.CheckFinal
//	create region=us stream=chat ranges=0-3 [start=0]
//	takeover from=us to=eu at=10s stream=chat ranges=0-1 epoch=1 [start=7]
//	prepare|complete|cancel stream=chat range=0 epoch=1 [to=eu] [start=9] [at=3s]
//	store down|up
//	liveness | homes region=us | history stream=chat range=0
func TestDataDriven(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			// The scripts of the store; testdata/cores holds the protocol
			// cores' (TestTakeoverCore, TestRehomeCore).
			paths, err := filepath.Glob("testdata/*.txt")
			if err != nil || len(paths) == 0 {
				t.Fatalf("no scripts in testdata: %v", err)
			}
			for _, path := range paths {
				t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
					h := &ddHarness{
						store: &faultStore{Store: newStore(t, kind)},
						nodes: map[uint64]*ddNode{},
						cfg: CoreConfig{HeartbeatIntervalNanos: int64(time.Second), RetryIntervalNanos: int64(250 * time.Millisecond),
							LivenessTTLNanos: int64(5 * time.Second), MaxOffsetNanos: int64(500 * time.Millisecond)},
					}
					datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
						return h.run(t, d)
					})
				})
			}
		})
	}
}

type ddNode struct {
	core *Core
	skew int64
}

type ddHarness struct {
	store *faultStore
	nodes map[uint64]*ddNode
	cfg   CoreConfig
}

func ddDur(t *testing.T, d *datadriven.TestData, key string) int64 {
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", d.Pos, key, s, err)
	}
	return int64(v)
}

func ddDurOr(t *testing.T, d *datadriven.TestData, key string, def int64) int64 {
	if !d.HasArg(key) {
		return def
	}
	return ddDur(t, d, key)
}

func ddUint(t *testing.T, d *datadriven.TestData, key string, def uint64) uint64 {
	if !d.HasArg(key) {
		return def
	}
	var v uint64
	d.ScanArgs(t, key, &v)
	return v
}

func ddStr(t *testing.T, d *datadriven.TestData, key, def string) string {
	if !d.HasArg(key) {
		return def
	}
	var v string
	d.ScanArgs(t, key, &v)
	return v
}

// ddRanges parses ranges=0-3 or ranges=5.
func ddRanges(t *testing.T, d *datadriven.TestData) []uint32 {
	s := ddStr(t, d, "ranges", "")
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		hi = lo
	}
	a, err1 := strconv.ParseUint(lo, 10, 32)
	b, err2 := strconv.ParseUint(hi, 10, 32)
	if err1 != nil || err2 != nil || b < a {
		t.Fatalf("%s: bad ranges=%q", d.Pos, s)
	}
	var out []uint32
	for r := a; r <= b; r++ {
		out = append(out, uint32(r))
	}
	return out
}

func dur(n int64) string { return time.Duration(n).String() }

func fmtHome(h Home) string {
	if h.Epoch == 0 {
		return h.Key.String() + ": no home"
	}
	s := fmt.Sprintf("%s: %s@%d start=%d", h.Key, h.Region, h.Epoch, h.StartOffset)
	if h.PrevRegion != "" {
		s += " prev=" + h.PrevRegion
	}
	if h.MovingTo != "" {
		s += fmt.Sprintf(" moving-to=%s drain-version=%d", h.MovingTo, h.DrainVersion)
	}
	return s
}

func fmtLiveness(l Liveness) string {
	return fmt.Sprintf("n%d %s epoch=%d exp=%s seen=%d", l.NodeID, l.Region, l.Epoch, dur(l.ExpirationNanos), l.HomesSeen)
}

func fmtView(v *View) string {
	var b strings.Builder
	fmt.Fprintf(&b, "n%d: liveness-epoch=%d", v.NodeID, v.LivenessEpoch)
	if v.ServeUntilNanos != 0 {
		fmt.Fprintf(&b, " expiration=%s serve-until=%s", dur(v.ExpirationNanos), dur(v.ServeUntilNanos))
	} else {
		b.WriteString(" not-serving")
	}
	fmt.Fprintf(&b, " homes-version=%d", v.HomesVersion)
	for _, h := range v.Homes() {
		b.WriteString("\n  " + fmtHome(h))
	}
	return b.String()
}

func (h *ddHarness) node(t *testing.T, d *datadriven.TestData) *ddNode {
	id := ddUint(t, d, "id", 0)
	n, ok := h.nodes[id]
	if !ok {
		t.Fatalf("%s: no node %d", d.Pos, id)
	}
	return n
}

func (h *ddHarness) run(t *testing.T, d *datadriven.TestData) string {
	ctx := ctxT(t)
	switch d.Cmd {
	case "config":
		h.cfg.LivenessTTLNanos = ddDurOr(t, d, "ttl", h.cfg.LivenessTTLNanos)
		h.cfg.MaxOffsetNanos = ddDurOr(t, d, "offset", h.cfg.MaxOffsetNanos)
		h.cfg.HeartbeatIntervalNanos = ddDurOr(t, d, "interval", h.cfg.HeartbeatIntervalNanos)
		h.cfg.RetryIntervalNanos = ddDurOr(t, d, "retry", h.cfg.RetryIntervalNanos)
		return "ok"

	case "node":
		cfg := h.cfg
		cfg.NodeID = ddUint(t, d, "id", 0)
		cfg.Region = ddStr(t, d, "region", "")
		c, err := NewCore(cfg)
		if err != nil {
			return "error: " + err.Error()
		}
		h.nodes[cfg.NodeID] = &ddNode{core: c, skew: ddDurOr(t, d, "skew", 0)}
		return "ok"

	case "heartbeat":
		n := h.node(t, d)
		now := ddDur(t, d, "at") + n.skew
		if d.HasArg("force") {
			n.core.Force()
		}
		req, ok := n.core.Next(now)
		if !ok {
			return fmt.Sprintf("not due (next at %s)\n%s", dur(n.core.Wake()-n.skew), fmtView(n.core.View()))
		}
		res, err := h.store.Heartbeat(ctx, req)
		ev := n.core.Done(req, res, err)
		var out []string
		switch {
		case ev.Err != nil:
			out = append(out, "error: "+ev.Err.Error())
		case ev.Registered:
			out = append(out, "registered")
		case ev.LostEpoch:
			out = append(out, fmt.Sprintf("lost liveness epoch %d", ev.OldEpoch))
		case ev.Extended:
			out = append(out, "extended")
		}
		if ev.HomesChanged {
			out = append(out, "homes changed")
		}
		return strings.Join(out, ", ") + "\n" + fmtView(n.core.View())

	case "check":
		n := h.node(t, d)
		now := ddDur(t, d, "at") + n.skew
		key := RangeKey{Stream: ddStr(t, d, "stream", ""), Range: uint32(ddUint(t, d, "range", 0))}
		l, err := n.core.View().Lease(key, now)
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("ok epoch=%d start=%d until=%s", l.Epoch, l.StartOffset, dur(l.UntilNanos))

	case "check-read", "check-final":
		n := h.node(t, d)
		now := ddDur(t, d, "at") + n.skew
		key := RangeKey{Stream: ddStr(t, d, "stream", ""), Range: uint32(ddUint(t, d, "range", 0))}
		check := n.core.View().CheckRead
		if d.Cmd == "check-final" {
			check = n.core.View().CheckFinal
		}
		e, err := check(key, now)
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("ok epoch=%d", e)

	case "create":
		var specs []HomeSpec
		for _, r := range ddRanges(t, d) {
			specs = append(specs, HomeSpec{Key: RangeKey{Stream: ddStr(t, d, "stream", ""), Range: r},
				Region: ddStr(t, d, "region", ""), StartOffset: ddUint(t, d, "start", 0)})
		}
		homes, err := h.store.CreateHomes(ctx, specs)
		if err != nil {
			return "error: " + err.Error()
		}
		var out []string
		for _, hm := range homes {
			out = append(out, fmtHome(hm))
		}
		return strings.Join(out, "\n")

	case "takeover":
		req := TakeoverRequest{From: ddStr(t, d, "from", ""), To: ddStr(t, d, "to", ""), NowNanos: ddDur(t, d, "at"), MaxOffsetNanos: h.cfg.MaxOffsetNanos}
		for _, r := range ddRanges(t, d) {
			req.Ranges = append(req.Ranges, TakeoverRange{Key: RangeKey{Stream: ddStr(t, d, "stream", ""), Range: r},
				Epoch: ddUint(t, d, "epoch", 1), StartOffset: ddUint(t, d, "start", 0)})
		}
		res, err := h.store.Takeover(ctx, req)
		if err != nil {
			return "error: " + err.Error()
		}
		var out []string
		for _, o := range res.Ranges {
			out = append(out, fmt.Sprintf("%s %s -> %s", o.Key, o.Outcome, fmtHome(o.Home)))
		}
		for _, l := range res.Fenced {
			out = append(out, "fenced "+fmtLiveness(l))
		}
		return strings.Join(out, "\n")

	case "prepare", "complete", "cancel":
		req := RehomeRequest{Key: RangeKey{Stream: ddStr(t, d, "stream", ""), Range: uint32(ddUint(t, d, "range", 0))},
			Epoch: ddUint(t, d, "epoch", 1), To: ddStr(t, d, "to", ""), StartOffset: ddUint(t, d, "start", 0),
			NowNanos: ddDurOr(t, d, "at", 0), MaxOffsetNanos: h.cfg.MaxOffsetNanos}
		var home Home
		var err error
		switch d.Cmd {
		case "prepare":
			home, err = h.store.PrepareRehome(ctx, req)
		case "complete":
			home, err = h.store.CompleteRehome(ctx, req)
		default:
			home, err = h.store.CancelRehome(ctx, req)
		}
		if err != nil {
			return "error: " + err.Error()
		}
		return fmtHome(home)

	case "store":
		switch {
		case d.HasArg("down"):
			h.store.down.Store(true)
		case d.HasArg("up"):
			h.store.down.Store(false)
		default:
			t.Fatalf("%s: store down|up", d.Pos)
		}
		return "ok"

	case "liveness":
		ls, err := h.store.Liveness(ctx, ddStr(t, d, "region", ""))
		if err != nil {
			return "error: " + err.Error()
		}
		var out []string
		for _, l := range ls {
			out = append(out, fmtLiveness(l))
		}
		return strings.Join(out, "\n")

	case "homes":
		homes, version, err := h.store.RegionHomes(ctx, ddStr(t, d, "region", ""))
		if err != nil {
			return "error: " + err.Error()
		}
		out := []string{fmt.Sprintf("version=%d", version)}
		for _, hm := range homes {
			out = append(out, fmtHome(hm))
		}
		return strings.Join(out, "\n")

	case "history":
		recs, err := h.store.History(ctx, RangeKey{Stream: ddStr(t, d, "stream", ""), Range: uint32(ddUint(t, d, "range", 0))})
		if err != nil {
			return "error: " + err.Error()
		}
		var out []string
		for _, r := range recs {
			out = append(out, fmt.Sprintf("epoch %d: %s %s start=%d prev=%q at=%s", r.Epoch, r.Kind, r.Region, r.StartOffset, r.PrevRegion, dur(r.GrantedNanos)))
		}
		return strings.Join(out, "\n")
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}
