package cursors

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/geolog/geolog/apierr"
)

// TestDatadriven runs the scripts of testdata/: each drives one range of
// the cursor stream (a State, a Coordinator and a virtual clock). Commands
// that change anything open a Batch, print the records it would propose,
// and apply them to the State, as the committed log would (unless "hold"
// is given: the records are kept aside, as in a log that forked away, for
// apply-held). Regenerate the expected output with -rewrite.
//
//	commit cursor=C [member=M epoch=E] [hold]   positions, one per line: STREAM/RANGE off=N [gen=G] [epoch=E] [meta=X]
//	merge cursor=C                              positions as for commit: merged back from an orphan log
//	get cursor=C [stream=S]
//	reset cursor=C stream=S                     targets, one per line: RANGE off=N
//	delete name=N
//	join group=G member=M stream=S ranges=N [instance=I] [session=D] [rebalance=D]
//	heartbeat group=G member=M epoch=E [owned=1,2]
//	leave group=G member=M epoch=E [temporary]
//	tick D                                      advances the clock by D and expires sessions
//	failover [homing=H]                         a new coordinator (sessions lost), homed at H
//	fetch group=G member=M epoch=E stream=S range=R
//	group G
//	apply-held
//
// Epochs print and parse as H.N: the homing epoch in the high bits, the
// count below.
func TestDatadriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{s: NewState(Limits{PositionsMax: 64, GroupsMax: 8}), c: NewCoordinator(),
			now: time.Unix(1_700_000_000, 0), homing: 1}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return h.run(t, d)
		})
	})
}

type harness struct {
	s      *State
	c      *Coordinator
	now    time.Time
	homing uint64
	held   []Record
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "get":
		var cursor, stream string
		d.ScanArgs(t, "cursor", &cursor)
		d.MaybeScanArgs(t, "stream", &stream)
		return fmtPositions(h.s.Positions(cursor, stream))
	case "group":
		return fmtGroup(h.s.Group(d.CmdArgs[0].Key))
	case "fetch":
		return fmtErr(h.s.CheckFetch(argStr(t, d, "group"), argStr(t, d, "member"), argEpoch(t, d, "epoch"),
			argStr(t, d, "stream"), uint32(argInt(t, d, "range"))))
	case "tick":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		h.now = h.now.Add(dur)
		b := h.s.Begin(h.now, h.homing)
		var out strings.Builder
		for _, e := range h.c.Expire(b) {
			fmt.Fprintf(&out, "expired %s/%s: %s\n", e.Group, e.MemberID, e.Reason)
		}
		return out.String() + h.finish(b, false)
	case "failover":
		d.MaybeScanArgs(t, "homing", &h.homing)
		h.c = NewCoordinator()
		return "ok"
	case "apply-held":
		for _, r := range h.held {
			if err := h.s.Apply(r); err != nil {
				d.Fatalf(t, "apply: %v", err)
			}
		}
		out := fmtRecords(h.held)
		h.held = nil
		return out
	}
	b := h.s.Begin(h.now, h.homing)
	out, err := h.change(t, d, b)
	if err != nil {
		if !b.Empty() {
			d.Fatalf(t, "a failed request staged changes: %v", b.Records())
		}
		return fmtErr(err)
	}
	return out + h.finish(b, d.HasArg("hold"))
}

// change runs one changing command through b.
func (h *harness) change(t *testing.T, d *datadriven.TestData, b *Batch) (string, error) {
	switch d.Cmd {
	case "commit":
		req := CommitRequest{Cursor: argStr(t, d, "cursor")}
		d.MaybeScanArgs(t, "member", &req.MemberID)
		if d.HasArg("epoch") {
			req.MemberEpoch = argEpoch(t, d, "epoch")
		}
		req.Positions = parsePositions(t, d)
		res, err := b.Commit(req)
		if err != nil {
			return "", err
		}
		var out strings.Builder
		for _, r := range res {
			fmt.Fprintf(&out, "%s applied=%t\n", fmtPosition(r.Position), r.Applied)
		}
		return out.String(), nil
	case "merge":
		res, err := b.Merge(argStr(t, d, "cursor"), parsePositions(t, d))
		if err != nil {
			return "", err
		}
		var out strings.Builder
		for _, r := range res {
			fmt.Fprintf(&out, "%s applied=%t\n", fmtPosition(r.Position), r.Applied)
		}
		return out.String(), nil
	case "reset":
		ps, err := b.Reset(argStr(t, d, "cursor"), argStr(t, d, "stream"), parsePositions(t, d))
		return fmtPositions(ps), err
	case "delete":
		n, err := b.Delete(argStr(t, d, "name"))
		return fmt.Sprintf("deleted %d positions\n", n), err
	case "join":
		req := JoinRequest{Group: argStr(t, d, "group"), MemberID: argStr(t, d, "member"), Stream: argStr(t, d, "stream"),
			RangeCount: uint32(argInt(t, d, "ranges"))}
		d.MaybeScanArgs(t, "instance", &req.InstanceID)
		req.SessionTimeout = argDuration(t, d, "session")
		req.RebalanceTimeout = argDuration(t, d, "rebalance")
		a, err := h.c.Join(b, req)
		return fmtAssignment(a), err
	case "heartbeat":
		a, err := h.c.Heartbeat(b, HeartbeatRequest{Group: argStr(t, d, "group"), MemberID: argStr(t, d, "member"),
			MemberEpoch: argEpoch(t, d, "epoch"), Owned: argRanges(t, d, "owned")})
		return fmtAssignment(a), err
	case "leave":
		err := h.c.Leave(b, LeaveRequest{Group: argStr(t, d, "group"), MemberID: argStr(t, d, "member"),
			MemberEpoch: argEpoch(t, d, "epoch"), Temporary: d.HasArg("temporary")})
		return "", err
	}
	d.Fatalf(t, "unknown command %s", d.Cmd)
	return "", nil
}

// finish prints the batch's records and applies them (or holds them).
func (h *harness) finish(b *Batch, hold bool) string {
	recs := b.Records()
	if hold {
		h.held = append(h.held, recs...)
		return "held:\n" + fmtRecords(recs)
	}
	for _, r := range recs {
		if err := h.s.Apply(r); err != nil {
			panic(fmt.Sprintf("apply of a record the batch wrote: %v", err))
		}
	}
	return fmtRecords(recs)
}

func argStr(t *testing.T, d *datadriven.TestData, key string) string {
	var s string
	d.ScanArgs(t, key, &s)
	return s
}

func argInt(t *testing.T, d *datadriven.TestData, key string) int {
	var n int
	d.ScanArgs(t, key, &n)
	return n
}

func argDuration(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	if !d.MaybeScanArgs(t, key, &s) {
		return 0
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

func argRanges(t *testing.T, d *datadriven.TestData, key string) []uint32 {
	var s string
	if !d.MaybeScanArgs(t, key, &s) || s == "" {
		return nil
	}
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			d.Fatalf(t, "%s: %v", key, err)
		}
		out = append(out, uint32(v))
	}
	return out
}

// argEpoch parses an epoch as H.N (or a plain number).
func argEpoch(t *testing.T, d *datadriven.TestData, key string) uint64 {
	s := argStr(t, d, key)
	hi, lo, ok := strings.Cut(s, ".")
	if !ok {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			d.Fatalf(t, "%s: %v", key, err)
		}
		return v
	}
	h, err1 := strconv.ParseUint(hi, 10, 64)
	n, err2 := strconv.ParseUint(lo, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return h<<epochShift | n
}

func fmtEpoch(e uint64) string { return EpochString(e) }

// parsePositions reads "STREAM/RANGE off=N gen=G epoch=E meta=X" or
// "RANGE off=N" lines.
func parsePositions(t *testing.T, d *datadriven.TestData) []Position {
	var out []Position
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		var p Position
		sr := fields[0]
		if stream, rng, ok := strings.Cut(sr, "/"); ok {
			p.Stream, sr = stream, rng
		}
		lo, hi, span := strings.Cut(sr, "-")
		r, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			d.Fatalf(t, "%q: %v", line, err)
		}
		last := r
		if span {
			if last, err = strconv.ParseUint(hi, 10, 32); err != nil {
				d.Fatalf(t, "%q: %v", line, err)
			}
		}
		p.Range = uint32(r)
		for _, f := range fields[1:] {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseUint(v, 10, 64)
			switch k {
			case "off":
				p.Offset = n
			case "gen":
				p.Generation = n
			case "epoch":
				p.Epoch = n
			case "meta":
				p.Metadata = []byte(v)
			case "metabytes":
				p.Metadata = make([]byte, n)
			default:
				d.Fatalf(t, "unknown field %q", f)
			}
		}
		for ; uint64(p.Range) <= last; p.Range++ {
			out = append(out, p)
		}
	}
	return out
}

func fmtPosition(p Position) string {
	s := fmt.Sprintf("%s/%d gen=%d off=%d", p.Stream, p.Range, p.Generation, p.Offset)
	if p.Epoch != 0 {
		s += fmt.Sprintf(" epoch=%d", p.Epoch)
	}
	if p.MemberID != "" {
		s += fmt.Sprintf(" by=%s@%s", p.MemberID, fmtEpoch(p.MemberEpoch))
	}
	switch {
	case len(p.Metadata) > 16:
		s += fmt.Sprintf(" meta=<%d bytes>", len(p.Metadata))
	case len(p.Metadata) > 0:
		s += fmt.Sprintf(" meta=%q", p.Metadata)
	}
	if p.Deleted {
		s += " deleted"
	}
	return s
}

func fmtPositions(ps []Position) string {
	if len(ps) == 0 {
		return "(none)\n"
	}
	var out strings.Builder
	for _, p := range ps {
		out.WriteString(fmtPosition(p) + "\n")
	}
	return out.String()
}

func fmtRanges(rs []uint32) string {
	return strings.Trim(fmt.Sprint(rs), "[]")
}

func fmtGroup(g *Group) string {
	if g == nil {
		return "(no group)\n"
	}
	var out strings.Builder
	fmt.Fprintf(&out, "group %s stream=%s ranges=%d epoch=%s assigned-at=%s", g.Name, g.Stream, g.RangeCount, fmtEpoch(g.Epoch), fmtEpoch(g.AssignmentEpoch))
	if g.Deleted {
		out.WriteString(" deleted")
	}
	out.WriteString("\n")
	for _, m := range g.Members {
		fmt.Fprintf(&out, "  %s", m.ID)
		if m.InstanceID != "" {
			fmt.Fprintf(&out, " (instance %s)", m.InstanceID)
		}
		fmt.Fprintf(&out, " epoch=%s joined=%s target=[%s] owned=[%s]", fmtEpoch(m.Epoch), fmtEpoch(m.JoinEpoch), fmtRanges(m.Target), fmtRanges(m.Owned))
		if len(m.Revoking) > 0 {
			fmt.Fprintf(&out, " revoking=[%s]", fmtRanges(m.Revoking))
		}
		if m.Away {
			out.WriteString(" away")
		}
		out.WriteString("\n")
	}
	return out.String()
}

func fmtAssignment(a Assignment) string {
	if a.MemberID == "" {
		return ""
	}
	s := fmt.Sprintf("assignment %s epoch=%s group-epoch=%s ranges=[%s]", a.MemberID, fmtEpoch(a.MemberEpoch), fmtEpoch(a.GroupEpoch), fmtRanges(a.Ranges))
	for _, p := range a.Positions {
		s += fmt.Sprintf(" %d@%d", p.Range, p.Offset)
	}
	return s + "\n"
}

func fmtRecords(recs []Record) string {
	var out strings.Builder
	for _, r := range recs {
		d, err := Decode(r)
		switch {
		case err != nil:
			fmt.Fprintf(&out, "record: %v\n", err)
		case d.Position != nil:
			fmt.Fprintf(&out, "record: position %s %s\n", d.Cursor, fmtPosition(*d.Position))
		default:
			out.WriteString("record: " + strings.TrimRight(strings.ReplaceAll(fmtGroup(d.Group), "\n", "\n  "), " "))
		}
	}
	return out.String()
}

func fmtErr(err error) string {
	if err == nil {
		return "ok\n"
	}
	if errors.Is(err, ErrBehind) {
		return "behind: wait for the copy\n"
	}
	e := apierr.As(err)
	s := fmt.Sprintf("error %s: %s", strings.TrimPrefix(e.Code.String(), "ERROR_CODE_"), e.Message)
	if e.MemberEpoch != 0 {
		s += fmt.Sprintf(" (member epoch %s)", fmtEpoch(e.MemberEpoch))
	}
	if e.CursorGeneration != 0 {
		s += fmt.Sprintf(" (generation %d)", e.CursorGeneration)
	}
	return s + "\n"
}
