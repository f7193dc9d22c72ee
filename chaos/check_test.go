package chaos

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// hb builds hand-made histories: one stream, homes given per range, every
// append's value from EncodeValue.
type hb struct {
	h   History
	now int64
}

func newHB(regions []string, homes ...string) *hb {
	return &hb{h: History{Homes: homes, Regions: regions, FinalRead: map[string]bool{}}}
}

func (b *hb) tick() int64 { b.now += 10; return b.now }

// append records one append op and returns its value.
func (b *hb) append(outcome Outcome, producer int, rng uint32, key string, seq, offset, epoch uint64) string {
	v := EncodeValue(producer, key, seq, 0)
	call := b.tick()
	op := Op{Kind: OpAppend, Process: producer, Range: rng, Call: call, Return: b.tick(), Outcome: outcome, Key: key, Value: v}
	if outcome == OK {
		op.Offset, op.Epoch = offset, epoch
	}
	b.h.Ops = append(b.h.Ops, op)
	return v
}

// reads records a source's reads of one range from offset 0.
func (b *hb) reads(source, region string, final bool, rng uint32, values ...string) {
	for i, v := range values {
		b.h.Reads = append(b.h.Reads, Observation{Source: source, Region: region, Final: final, Range: rng, Offset: uint64(i), Epoch: 1, Value: v, At: b.tick()})
	}
	if final {
		b.h.FinalRead[FinalKey(region, rng)] = true
	}
}

// tailRead records a home read returning the prefix values (epoch 1).
func (b *hb) tailRead(rng uint32, values ...string) {
	var hash uint64
	for i, v := range values {
		hash = ChainHash(hash, uint64(i), 1, v)
	}
	call := b.tick()
	b.h.Ops = append(b.h.Ops, Op{Kind: OpRead, Process: 100, Range: rng, Call: call, Return: b.tick(), Outcome: OK, Tail: uint64(len(values)), Hash: hash})
}

func (b *hb) history() *History { b.h.End = b.tick(); return &b.h }

// goodHistory: two producers on range 0 homed in us, mirrored in eu; an
// ambiguous append that landed, one that did not, a definite failure; reads
// by consumers, the tail reader and the final reads agree.
func goodHistory() *hb {
	b := newHB([]string{"us", "eu"}, "us", "eu")
	a := b.append(OK, 0, 0, "k1", 0, 0, 1)
	c := b.append(OK, 1, 0, "k2", 0, 1, 1)
	b.tailRead(0, a, c)
	amb := b.append(Info, 0, 0, "k1", 1, 0, 0) // landed at 2
	b.append(Info, 1, 0, "k2", 1, 0, 0)        // never landed
	b.append(Fail, 1, 0, "k2", 2, 0, 0)
	d := b.append(OK, 0, 0, "k1", 2, 3, 1)
	e := b.append(OK, 2, 1, "k9", 0, 0, 1) // range 1, homed in eu
	b.tailRead(0, a, c, amb, d)
	b.reads("consume/us", "us", false, 0, a, c, amb)
	b.reads("consume/eu", "eu", false, 0, a, c, amb, d)
	b.reads("final/us", "us", true, 0, a, c, amb, d)
	b.reads("final/eu", "eu", true, 0, a, c, amb, d)
	b.reads("final/us", "us", true, 1, e)
	b.reads("final/eu", "eu", true, 1, e)
	return b
}

func TestCheckersPassGoodHistory(t *testing.T) {
	h := goodHistory().history()
	q := CheckQueue(h)
	if q.Total() != 0 || len(q.Unverified) != 0 || len(q.Unconverged) != 0 {
		t.Fatalf("good history: %d anomalies %v, unverified %v, unconverged %v", q.Total(), q.Anomalies, q.Unverified, q.Unconverged)
	}
	if q.Acked != 4 || q.Ambiguous != 2 || q.AmbiguousPresent != 1 || q.Failed != 1 {
		t.Fatalf("counts: %+v", q)
	}
	l := CheckLinearizable(h, 10*time.Second, "")
	if l.Result != porcupine.Ok {
		t.Fatalf("good history: %s %v", l.Result, l.Details)
	}
}

// TestQueueCheckerFinds makes every anomaly kind happen once and expects the
// checker to report it.
func TestQueueCheckerFinds(t *testing.T) {
	cases := []struct {
		name  string
		build func() *History
		want  AnomalyKind
	}{
		{"lost", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			b.append(OK, 0, 0, "k1", 1, 1, 1)
			b.reads("final/us", "us", true, 0, a) // offset 1 never made it
			return b.history()
		}, Lost},
		{"duplicated ambiguous", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			amb := b.append(Info, 0, 0, "k1", 1, 0, 0)
			b.reads("final/us", "us", true, 0, a, amb, amb)
			return b.history()
		}, Duplicated},
		{"duplicated acked (retry appended twice)", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 1, 1)
			b.reads("final/us", "us", true, 0, a, a)
			return b.history()
		}, Duplicated},
		{"inconsistent across regions", func() *History {
			b := newHB([]string{"us", "eu"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			c := b.append(OK, 0, 0, "k1", 1, 1, 1)
			d := b.append(Info, 1, 0, "k2", 0, 0, 0)
			b.reads("final/us", "us", true, 0, a, c)
			b.reads("final/eu", "eu", true, 0, a, d) // a mirror diverged at 1
			return b.history()
		}, Inconsistent},
		{"inconsistent ack vs read", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			c := b.append(OK, 1, 0, "k2", 0, 0, 1) // acked at an offset another ack holds
			b.reads("final/us", "us", true, 0, a, c)
			return b.history()
		}, Inconsistent},
		{"inconsistent epoch", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 2) // acked under epoch 2, read as epoch 1
			b.reads("final/us", "us", true, 0, a)
			return b.history()
		}, Inconsistent},
		{"mirror past the home's tail", func() *History {
			b := newHB([]string{"us", "eu"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			c := b.append(Info, 0, 0, "k1", 1, 0, 0)
			b.reads("final/us", "us", true, 0, a)
			b.reads("final/eu", "eu", true, 0, a, c)
			return b.history()
		}, Inconsistent},
		{"out of order", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 1, 1)
			c := b.append(OK, 0, 0, "k1", 1, 0, 1) // seq 1 before seq 0
			b.reads("final/us", "us", true, 0, c, a)
			return b.history()
		}, OutOfOrder},
		{"unexpected: never attempted", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			b.reads("final/us", "us", true, 0, a, "p7|k3|0|")
			return b.history()
		}, Unexpected},
		{"unexpected: definitely failed", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(Fail, 0, 0, "k1", 0, 0, 0)
			b.reads("final/us", "us", true, 0, a)
			return b.history()
		}, Unexpected},
		{"gap in a consumer", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			c := b.append(OK, 0, 0, "k1", 1, 1, 1)
			b.reads("final/us", "us", true, 0, a, c)
			b.h.Reads = append(b.h.Reads, Observation{Source: "consume/us", Region: "us", Range: 0, Offset: 1, Epoch: 1, Value: c})
			return b.history()
		}, Gap},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := CheckQueue(tc.build())
			if q.Counts[tc.want] == 0 {
				t.Fatalf("want a %s anomaly, got %v", tc.want, q.Anomalies)
			}
			t.Logf("found: %v", q.Anomalies)
		})
	}
}

func TestQueueCheckerUnverifiedAndUnconverged(t *testing.T) {
	b := newHB([]string{"us", "eu"}, "us", "eu")
	a := b.append(OK, 0, 0, "k1", 0, 0, 1)
	b.append(OK, 0, 1, "k9", 0, 0, 1)
	b.reads("final/us", "us", true, 0, a)
	b.reads("final/eu", "eu", true, 0) // eu's copy of range 0 is empty: behind
	q := CheckQueue(b.history())
	if q.Total() != 0 {
		t.Fatalf("anomalies %v", q.Anomalies)
	}
	if len(q.Unverified) != 1 || q.Unverified[0] != "eu/1" {
		t.Fatalf("unverified %v, want [eu/1] (range 1's home never read)", q.Unverified)
	}
	if len(q.Unconverged) != 1 || q.Unconverged[0] != "eu/0" {
		t.Fatalf("unconverged %v, want [eu/0]", q.Unconverged)
	}
}

// TestLinearizabilityCheckerFinds: histories the queue checker may accept
// but that no sequential log explains.
func TestLinearizabilityCheckerFinds(t *testing.T) {
	cases := []struct {
		name  string
		build func() *History
	}{
		{"stale read after an ack", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			c := b.append(OK, 0, 0, "k1", 1, 1, 1)
			b.tailRead(0, a) // returned after c was acked, without c
			b.reads("final/us", "us", true, 0, a, c)
			return b.history()
		}},
		{"read from the future", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			b.tailRead(0, a, EncodeValue(0, "k1", 1, 0)) // sees seq 1 before it was invoked
			c := b.append(OK, 0, 0, "k1", 1, 1, 1)
			b.reads("final/us", "us", true, 0, a, c)
			return b.history()
		}},
		{"sequential appends acked in reverse offset order", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 1, 1)
			c := b.append(OK, 1, 0, "k2", 0, 0, 1)
			b.reads("final/us", "us", true, 0, c, a)
			return b.history()
		}},
		{"epoch goes back", func() *History {
			b := newHB([]string{"us"}, "us")
			b.append(OK, 0, 0, "k1", 0, 0, 2)
			b.append(OK, 0, 0, "k1", 1, 1, 1) // acked under an older epoch
			b.h.FinalRead[FinalKey("us", 0)] = true
			return b.history()
		}},
		{"ambiguous append at a taken offset", func() *History {
			b := newHB([]string{"us"}, "us")
			a := b.append(OK, 0, 0, "k1", 0, 0, 1)
			amb := b.append(Info, 1, 0, "k2", 0, 0, 0)
			b.tailRead(0, a)
			b.reads("final/us", "us", true, 0, amb) // the final read puts it at 0
			return b.history()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := CheckLinearizable(tc.build(), 10*time.Second, "")
			if l.Result != porcupine.Illegal {
				t.Fatalf("want Illegal, got %s %v", l.Result, l.Details)
			}
			t.Logf("found: %v", l.Details)
		})
	}
}

func TestLinearizabilityUnknownWithoutHomeFinalRead(t *testing.T) {
	b := newHB([]string{"us"}, "us")
	b.append(OK, 0, 0, "k1", 0, 0, 1)
	if l := CheckLinearizable(b.history(), time.Second, ""); l.Result != porcupine.Unknown {
		t.Fatalf("want Unknown, got %s", l.Result)
	}
}

func TestValueRoundTrip(t *testing.T) {
	v := EncodeValue(3, "k12", 42, 5)
	p, k, s, ok := DecodeValue(v)
	if !ok || p != 3 || k != "k12" || s != 42 {
		t.Fatalf("DecodeValue(%q) = %d %q %d %v", v, p, k, s, ok)
	}
	for _, bad := range []string{"", "x|k|1|", "p1|k|x|", "p1||1|", "p1|k|1"} {
		if _, _, _, ok := DecodeValue(bad); ok {
			t.Fatalf("DecodeValue(%q) accepted", bad)
		}
	}
}
