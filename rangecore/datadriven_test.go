package rangecore

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs the scripts in testdata/ (regenerate the golden
// output with -rewrite). Each script drives one Timeline and one
// StartGate, whose held appends are named strings.
//
// Timeline:
//
//	learn epoch=2 start=10            Timeline.LearnStart
//	history 2=10 3=17                 Timeline.LearnHistory
//	fence log=1 [heard=3] [home] [region=eu epoch=3 start=17]
//	                                  Timeline.Fence (no region: none known)
//
// StartGate (leader sets the replica's state the gate reads):
//
//	leader [lead] term=5 highest=1 committed=10 pending=0
//	admit op=a epoch=2                StartGate.Admit
//	mirrored epoch=1                  StartGate.AdmitMirrored
//	indexed term=5 [err=x]            StartGate.Indexed
//	done epoch=2 term=5 end=10 [err=inflight|x]   StartGate.Done
//	stop                              StartGate.Stop
//	check lease-epoch=2 lease-start=10 epoch=2 end=12 log-start=0 first=1 [diverge=11]
//	                                  CheckStart
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &ddHarness{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return h.run(t, d)
		})
	})
}

type ddHarness struct {
	drv    *driverHarness // driver_test.go
	tl     Timeline
	gate   StartGate[string]
	leader Leader
}

func ddUint(t *testing.T, d *datadriven.TestData, key string, def uint64) uint64 {
	t.Helper()
	if !d.HasArg(key) {
		return def
	}
	var s string
	d.ScanArgs(t, key, &s)
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return v
}

func ddErr(d *datadriven.TestData) error {
	if !d.HasArg("err") {
		return nil
	}
	for _, a := range d.CmdArgs {
		if a.Key == "err" && len(a.Vals) > 0 {
			if a.Vals[0] == "inflight" {
				return ErrStartInFlight
			}
			return errors.New(a.Vals[0])
		}
	}
	return nil
}

func (h *ddHarness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "group":
		var veto uint64
		if d.HasArg("veto") {
			veto = ddUint(t, d, "veto", 0)
		}
		h.drv = newDriverHarness(t, ddUint(t, d, "size", 3), d.HasArg("nodetector"), veto,
			int(ddUint(t, d, "balance", 0)), ddUint(t, d, "groupid", 0))
		return strings.Join(h.drv.state(), "\n")
	case "start", "propose", "tick", "down", "up", "state", "diskfull", "name-leader":
		return h.drv.run(t, d)
	case "learn", "history", "fence":
		return h.runTimeline(t, d)
	case "check":
		return h.runCheck(t, d)
	default:
		return h.runGate(t, d)
	}
}

func (h *ddHarness) runTimeline(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "learn":
		h.tl.LearnStart(ddUint(t, d, "epoch", 0), ddUint(t, d, "start", 0))
		return h.starts()
	case "history":
		starts := map[uint64]uint64{}
		for _, a := range d.CmdArgs {
			e, err1 := strconv.ParseUint(a.Key, 10, 64)
			s, err2 := strconv.ParseUint(a.Vals[0], 10, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("history: %s=%v", a.Key, a.Vals)
			}
			starts[e] = s
		}
		h.tl.LearnHistory(starts)
		return h.starts()
	}
	role := Role{Home: d.HasArg("home"), Epoch: ddUint(t, d, "epoch", 0), Start: ddUint(t, d, "start", 0)}
	if d.HasArg("region") {
		d.ScanArgs(t, "region", &role.Region)
	}
	f, want := h.tl.Fence(role, ddUint(t, d, "log", 0), ddUint(t, d, "heard", 0))
	wants := [...]string{"nothing", "home", "history"}
	if f == nil {
		return fmt.Sprintf("no fence, want %s", wants[want])
	}
	kind := "known"
	if !f.Known() {
		kind = "provisional"
	}
	return fmt.Sprintf("fence %d (%s, epoch %d, log epoch %d), want %s", f.Offset, kind, f.Epoch, f.LogEpoch, wants[want])
}

func (h *ddHarness) starts() string {
	var out []string
	for e := range h.tl.starts {
		out = append(out, fmt.Sprintf("%d:%d", e, h.tl.starts[e]))
	}
	sort.Strings(out)
	return "starts " + strings.Join(out, " ")
}

func (h *ddHarness) runCheck(t *testing.T, d *datadriven.TestData) string {
	c := CheckStart(ddUint(t, d, "lease-epoch", 0), ddUint(t, d, "lease-start", 0), ddUint(t, d, "epoch", 0),
		ddUint(t, d, "end", 0), ddUint(t, d, "log-start", 0), ddUint(t, d, "first", 0), ddUint(t, d, "diverge", NoFence))
	return [...]string{"ok", "not home", "below", "keep", "raise", "fork", "diverged below"}[c]
}

func (h *ddHarness) runGate(t *testing.T, d *datadriven.TestData) string {
	g := &h.gate
	switch d.Cmd {
	case "leader":
		h.leader = Leader{IsLeader: d.HasArg("lead"), Term: ddUint(t, d, "term", 0), HighestEpoch: ddUint(t, d, "highest", 0),
			Committed: ddUint(t, d, "committed", 0), Pending: int(ddUint(t, d, "pending", 0))}
		return "ok"
	case "admit":
		var op string
		d.ScanArgs(t, "op", &op)
		v, start := g.Admit(op, ddUint(t, d, "epoch", 0), h.leader)
		out := [...]string{"pass", "held", "refuse stale", "refuse full"}[v]
		if start {
			out += ", start a round: read index"
		}
		return fmt.Sprintf("%s (held %d, floor %d)", out, g.Held(), g.Floor())
	case "mirrored":
		return [...]string{"pass", "held", "refuse stale", "refuse full"}[g.AdmitMirrored(ddUint(t, d, "epoch", 0))]
	case "indexed":
		if err := g.Indexed(ddUint(t, d, "term", 0), ddErr(d), h.leader); err != nil {
			return "done with: " + err.Error()
		}
		return "ask the node"
	case "done":
		retry, release, err := g.Done(ddUint(t, d, "epoch", 0), ddUint(t, d, "term", 0), ddUint(t, d, "end", 0), ddErr(d), h.leader)
		if retry {
			return fmt.Sprintf("retry: read index again (held %d)", g.Held())
		}
		e, term := g.Confirmed()
		if err != nil {
			return fmt.Sprintf("refuse (%s): %v (confirmed epoch %d term %d)", strings.Join(release, ","), err, e, term)
		}
		return fmt.Sprintf("propose (%s) (confirmed epoch %d term %d)", strings.Join(release, ","), e, term)
	case "stop":
		return "refuse (" + strings.Join(g.Stop(), ",") + ")"
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}
