package compact

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/geolog/geolog/batch"
)

// TestDataDriven runs the scripts in testdata/ (regenerate with
// -rewrite). Commands:
//
//	log [raft] [segment=BYTES]        start a copy of a range
//	put [producer=P seq=S] [time=T]   one batch per line: k=v, k=~ (tombstone), -=v (no key)
//	noop                              a Raft leader's empty entry
//	mark point=N [tcut=T] [pcut=T]    a compaction marker
//	seal                              seal the active segment
//	compact point=N [tcut=T] [pcut=T] [limit=N]
//	show                              records, markers, segments
//	reopen
//	decide now=T committed=N lag=N [floor=N] [regions=N] [last=N] [lastat=T] [markerend=N] [minlag=D] [retention=D] [interval=D]
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var l *testLog
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "log":
				var seg uint64 = 4096
				if d.HasArg("segment") {
					d.ScanArgs(t, "segment", &seg)
				}
				l = newTestLog(t, 1, int64(seg), d.HasArg("raft"))
				return ""
			case "put":
				return ddPut(t, d, l)
			case "noop":
				l.noop()
				return ""
			case "mark":
				h := l.mark(ddDecision(t, d))
				return fmt.Sprintf("marker at %d", h.BaseOffset)
			case "seal":
				if err := l.s.SealBefore(l.s.NextOffset()); err != nil {
					t.Fatal(err)
				}
				return ""
			case "compact":
				dec := ddDecision(t, d)
				limit := uint64(math.MaxUint64)
				if d.HasArg("limit") {
					d.ScanArgs(t, "limit", &limit)
				}
				res := l.compact(dec, limit)
				return fmt.Sprintf("rewrote %d segments, %d keys, complete=%v", res.SegmentsRewritten, res.Keys, res.Complete)
			case "show":
				return ddShow(t, l)
			case "reopen":
				l.reopen()
				return ""
			case "decide":
				return ddDecide(t, d)
			}
			t.Fatalf("unknown command %s", d.Cmd)
			return ""
		})
	})
}

func ddPut(t *testing.T, d *datadriven.TestData, l *testLog) string {
	var producer, seq uint64
	if d.HasArg("producer") {
		d.ScanArgs(t, "producer", &producer)
		d.ScanArgs(t, "seq", &seq)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		tm := l.tm + 1
		if d.HasArg("time") {
			var v int64
			d.ScanArgs(t, "time", &v)
			tm = v
		}
		recs := parseRecords(t, line)
		h := l.put(producer, seq, tm, recs)
		if producer != 0 {
			seq += uint64(len(recs))
		}
		out = append(out, fmt.Sprintf("[%d, %d)", h.BaseOffset, h.NextOffset()))
	}
	return strings.Join(out, " ")
}

func ddDecision(t *testing.T, d *datadriven.TestData) batch.Compaction {
	var c batch.Compaction
	d.ScanArgs(t, "point", &c.Point)
	if d.HasArg("tcut") {
		d.ScanArgs(t, "tcut", &c.TombstoneCutoffUnixNanos)
	}
	if d.HasArg("pcut") {
		d.ScanArgs(t, "pcut", &c.ProducerCutoffUnixNanos)
	}
	return c
}

// ddShow prints the records, the markers, and each segment's frames as
// base+span (empty frames of a compacted batch as [base,next) with no
// records, control frames as *).
func ddShow(t *testing.T, l *testLog) string {
	recs, markers := records(t, l.s)
	var b strings.Builder
	fmt.Fprintf(&b, "records: %s\n", recordsString(recs))
	fmt.Fprintf(&b, "markers: %v\n", markers)
	for _, g := range l.s.Sealed() {
		fmt.Fprintf(&b, "segment %d..%d:", g.BaseOffset, g.NextOffset)
		err := l.s.WalkSegment(g.BaseOffset, nil, func(frame []byte, h batch.Header, last bool) error {
			switch {
			case h.IsControl():
				b.WriteString(" *")
			case h.Type == batch.TypeCompact:
				fmt.Fprintf(&b, " m%d", h.BaseOffset)
			case h.Compacted():
				fmt.Fprintf(&b, " [%d,%d)c%d", h.BaseOffset, h.NextOffset(), h.RecordCount)
			default:
				fmt.Fprintf(&b, " [%d,%d)", h.BaseOffset, h.NextOffset())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "next %d", l.s.NextOffset())
	return b.String()
}

func ddDecide(t *testing.T, d *datadriven.TestData) string {
	dur := func(key string) time.Duration {
		if !d.HasArg(key) {
			return 0
		}
		var s string
		d.ScanArgs(t, key, &s)
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	num := func(key string) uint64 {
		if !d.HasArg(key) {
			return 0
		}
		var s string
		d.ScanArgs(t, key, &s)
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	p := Policy{MinLag: dur("minlag"), DeleteRetention: dur("retention"), ProducerRetention: dur("producers"), Interval: dur("interval")}
	in := Inputs{NowUnixNanos: int64(num("now")), Committed: num("committed"), LagPoint: num("lag"),
		Floor: num("floor"), FloorKnown: d.HasArg("floor"), Regions: int(num("regions")),
		Last: batch.Compaction{Point: num("last")}, LastUnixNanos: int64(num("lastat")), MarkerEnd: num("markerend")}
	c, ok := Decide(p, in)
	if !ok {
		return "no decision"
	}
	return fmt.Sprintf("point=%d tcut=%d pcut=%d", c.Point, c.TombstoneCutoffUnixNanos, c.ProducerCutoffUnixNanos)
}
