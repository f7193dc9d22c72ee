package chaos

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// rec is one record of a hand-made log: value and epoch.
type rec struct {
	v string
	e uint64
}

// log records a source's reads of range rng from offset from on.
func (b *hb) log(source, region string, final bool, rng uint32, from uint64, recs ...rec) {
	for i, r := range recs {
		b.h.Reads = append(b.h.Reads, Observation{Source: source, Region: region, Final: final, Range: rng, Offset: from + uint64(i), Epoch: r.e, Value: r.v, At: b.tick()})
	}
	if final {
		b.h.FinalRead[FinalKey(region, rng)] = true
	}
}

// homeRead records a home read returning the prefix recs.
func (b *hb) homeRead(rng uint32, recs ...rec) *Op {
	var hash uint64
	for i, r := range recs {
		hash = ChainHash(hash, uint64(i), r.e, r.v)
	}
	call := b.tick()
	b.h.Ops = append(b.h.Ops, Op{Kind: OpRead, Process: 100, Range: rng, Call: call, Return: b.tick(), Outcome: OK, Tail: uint64(len(recs)), Hash: hash})
	return &b.h.Ops[len(b.h.Ops)-1]
}

func (b *hb) orphan(node string, rng uint32, forkAt, offset, epoch uint64, value string) {
	b.h.Orphans = append(b.h.Orphans, OrphanRecord{Node: node, Range: rng, ForkOffset: forkAt, Offset: offset, Epoch: epoch, Value: value})
	b.h.OrphansRead = true
}

// failoverHistory: range 0 homed in us at epoch 1 (a, b, c acked at 0-2);
// us dies (the fault event), eu takes over at epoch 2 from offset 2 (c was
// never shipped), acks d and e at 2 and 3; us returns, forks c off into
// its orphan log (both of its replicas hold it). A consumer in us read c
// before the fork, then e; a home read before the takeover saw a, b, c.
type failoverHistory struct {
	*hb
	a, b, c, d, e string
}

func newFailoverHistory() *failoverHistory {
	f := &failoverHistory{hb: newHB([]string{"us", "eu"}, "us")}
	f.h.FinalHomes = []string{"eu"}
	f.a = f.append(OK, 0, 0, "k1", 0, 0, 1)
	f.b = f.append(OK, 1, 0, "k2", 0, 1, 1)
	f.c = f.append(OK, 0, 0, "k1", 1, 2, 1)
	f.homeRead(0, rec{f.a, 1}, rec{f.b, 1}, rec{f.c, 1})
	f.log("consume/us", "us", false, 0, 0, rec{f.a, 1}, rec{f.b, 1}, rec{f.c, 1})
	kill := f.tick()
	f.d = f.append(OK, 1, 0, "k2", 1, 2, 2)
	f.e = f.append(OK, 0, 0, "k1", 2, 3, 2)
	f.h.Faults = append(f.h.Faults, FaultEvent{Fault: Fault{Kind: KindKill}, What: "kill us", Start: kill, End: f.tick(), HomeEpochs: map[uint32]uint64{0: 1}})
	f.log("consume/us", "us", false, 0, 3, rec{f.e, 2})
	f.homeRead(0, rec{f.a, 1}, rec{f.b, 1}, rec{f.d, 2}, rec{f.e, 2})
	f.log("final/eu", "eu", true, 0, 0, rec{f.a, 1}, rec{f.b, 1}, rec{f.d, 2}, rec{f.e, 2})
	f.log("final/us", "us", true, 0, 0, rec{f.a, 1}, rec{f.b, 1}, rec{f.d, 2}, rec{f.e, 2})
	f.orphan("us:n1", 0, 2, 2, 1, f.c)
	f.orphan("us:n2", 0, 2, 2, 1, f.c)
	return f
}

func TestCheckersPassFailoverWithOrphans(t *testing.T) {
	h := newFailoverHistory().history()
	q := CheckQueue(h)
	if q.Total() != 0 || len(q.Unverified) != 0 || len(q.Unconverged) != 0 {
		t.Fatalf("anomalies %v, unverified %v, unconverged %v", q.Anomalies, q.Unverified, q.Unconverged)
	}
	if q.Orphaned != 1 || q.OrphanRecords != 1 || q.Acked != 5 {
		t.Fatalf("orphaned %d, orphan records %d, acked %d; want 1, 1, 5", q.Orphaned, q.OrphanRecords, q.Acked)
	}
	l := CheckLinearizable(h, 10*time.Second, "")
	if l.Result != porcupine.Ok || l.OrphanedAcks != 1 || l.OrphanReads != 1 {
		t.Fatalf("linearizability %s %v, orphaned acks %d, orphan reads %d", l.Result, l.Details, l.OrphanedAcks, l.OrphanReads)
	}
	f, unrecovered := failovers(h)
	if len(f) != 1 || unrecovered != 0 {
		t.Fatalf("failovers %v, unrecovered %d", f, unrecovered)
	}
}

func TestQueueCheckerFindsHomingAnomalies(t *testing.T) {
	cases := []struct {
		name string
		edit func(f *failoverHistory)
		want AnomalyKind
	}{
		{"orphaned without an unplanned failover", func(f *failoverHistory) {
			f.h.Faults = nil
		}, Lost},
		{"orphaned under an epoch newer than the failed home's", func(f *failoverHistory) {
			f.h.Faults[0].HomeEpochs = map[uint32]uint64{0: 0}
		}, Lost},
		{"acked record in neither log", func(f *failoverHistory) {
			f.h.Orphans = f.h.Orphans[:0]
		}, Lost},
		{"orphaned and in the final log too", func(f *failoverHistory) {
			for i := range f.h.Reads {
				if f.h.Reads[i].Source == "final/eu" && f.h.Reads[i].Value == f.d {
					f.h.Reads[i].Value = f.c
				}
			}
		}, Duplicated},
		{"orphan logs disagree", func(f *failoverHistory) {
			f.h.Orphans[1].Value = f.d
		}, Inconsistent},
		{"orphan log holds a record never attempted", func(f *failoverHistory) {
			f.orphan("us:n1", 0, 2, 3, 1, "p9|k1|0|")
		}, Unexpected},
		{"final log's epochs go back", func(f *failoverHistory) {
			f.h.Reads = append(f.h.Reads, Observation{Source: "final/eu", Region: "eu", Final: true, Range: 0, Offset: 4, Epoch: 1, Value: f.append(Info, 1, 0, "k2", 2, 0, 0)})
		}, OutOfOrder},
		{"ack under the old epoch invoked after the new one's ack", func(f *failoverHistory) {
			f.append(OK, 1, 0, "k2", 3, 4, 1)
		}, Stale},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFailoverHistory()
			tc.edit(f)
			q := CheckQueue(f.history())
			if q.Counts[tc.want] == 0 {
				t.Fatalf("want a %s anomaly, got %v", tc.want, q.Anomalies)
			}
			t.Logf("found: %v", q.Anomalies)
		})
	}
}

// TestStaleAckUnderExpiredLease: a home cut off from the lease store acks
// after its lease may have expired.
func TestStaleAckUnderExpiredLease(t *testing.T) {
	// producer 0 produces from region from; with partitioned, its region
	// and us are partitioned during the cut too.
	build := func(ackAfter time.Duration, from string, partitioned bool) *History {
		b := newHB([]string{"us", "eu"}, "us")
		b.h.LeaseTTL = D(3 * time.Second)
		b.h.ProducerRegions = []string{from}
		a := b.append(OK, 0, 0, "k1", 0, 0, 1)
		cut := b.tick()
		b.now = cut + int64(ackAfter)
		c := b.append(OK, 0, 0, "k1", 1, 1, 1)
		end := cut + int64(9*time.Second)
		b.h.Faults = append(b.h.Faults, FaultEvent{Fault: Fault{Kind: KindLeaseStoreOutage}, Start: cut, End: end,
			HomeEpochs: map[uint32]uint64{0: 1}, LeaseCut: true, Sides: [][]string{{"us"}, {"pg"}}})
		if partitioned {
			b.h.Faults = append(b.h.Faults, FaultEvent{Fault: Fault{Kind: KindPartition}, Start: cut, End: end, Sides: [][]string{{"us"}, {"eu"}}})
		}
		b.reads("final/us", "us", true, 0, a, c)
		return b.history()
	}
	if q := CheckQueue(build(2*time.Second, "us", false)); q.Total() != 0 {
		t.Fatalf("an ack within the lease: %v", q.Anomalies)
	}
	if q := CheckQueue(build(4*time.Second, "us", false)); q.Counts[Stale] != 1 {
		t.Fatalf("an ack 4s into a cut with a 3s lease: %v", q.Anomalies)
	}
	if q := CheckQueue(build(4*time.Second, "eu", false)); q.Counts[Stale] != 1 {
		t.Fatalf("an ack to eu 4s into a cut with a 3s lease, no partition: %v", q.Anomalies)
	}
	if q := CheckQueue(build(4*time.Second, "us", true)); q.Counts[Stale] != 1 {
		t.Fatalf("an ack in us 4s into a cut with a 3s lease, us and eu partitioned: %v", q.Anomalies)
	}
	// The reply to eu crossed the partitioned link: its return time says
	// when the link let it through, not when it was given.
	if q := CheckQueue(build(4*time.Second, "eu", true)); q.Total() != 0 {
		t.Fatalf("a reply held by a partition: %v", q.Anomalies)
	}
	if q := CheckQueue(build(10*time.Second, "us", false)); q.Total() != 0 {
		t.Fatalf("an ack after the store came back: %v", q.Anomalies)
	}
}

// TestLinearizabilityFindsStaleOrphanRead: a home read that returns the
// old home's divergent tail after the new home acked is stale.
func TestLinearizabilityFindsStaleOrphanRead(t *testing.T) {
	f := newFailoverHistory()
	f.homeRead(0, rec{f.a, 1}, rec{f.b, 1}, rec{f.c, 1}) // after d and e were acked
	l := CheckLinearizable(f.history(), 10*time.Second, "")
	if l.Result != porcupine.Illegal {
		t.Fatalf("want Illegal, got %s (orphan reads left out: %d)", l.Result, l.OrphanReads)
	}
}
