package chaos

import (
	"testing"
	"time"
)

// TestSplitReads: a read of the divergent tail (c, forked off into the
// orphan log) is allowed before the fault that took its home away ended,
// and for KnowledgeSlack after; later it is a split read, as it is when
// no fault explains it. A reader that read it may go back to the fork
// point and read the log from there (no gap); going back elsewhere is one.
func TestSplitReads(t *testing.T) {
	fault := func(f *failoverHistory) *FaultEvent { return &f.h.Faults[0] }
	cases := []struct {
		name string
		edit func(f *failoverHistory)
		want map[AnomalyKind]int
	}{
		{"read before the fault ended", func(f *failoverHistory) {}, nil},
		{"read within the slack after it", func(f *failoverHistory) {
			lateRead(f, fault(f).End+int64(KnowledgeSlack(&f.h)))
		}, nil},
		{"read after the slack", func(f *failoverHistory) {
			lateRead(f, fault(f).End+int64(KnowledgeSlack(&f.h))+int64(time.Millisecond))
		}, map[AnomalyKind]int{SplitRead: 1}},
		{"no fault took the home away", func(f *failoverHistory) {
			f.h.Faults[0].HomeEpochs = nil
			f.append(OK, 0, 0, "k1", 9, 9, 1) // keeps the orphaned ack's Lost apart
		}, map[AnomalyKind]int{SplitRead: 1}},
		{"back to the fork point", func(f *failoverHistory) {
			f.log("consume/us", "us", false, 0, 2, rec{f.d, 2}, rec{f.e, 2})
		}, nil},
		{"back elsewhere", func(f *failoverHistory) {
			f.log("consume/us", "us", false, 0, 1, rec{f.b, 1})
		}, map[AnomalyKind]int{Gap: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFailoverHistory()
			f.h.LeaseTTL = D(3 * time.Second)
			tc.edit(f)
			q := CheckQueue(f.history())
			for _, k := range []AnomalyKind{SplitRead, Gap, Inconsistent} {
				if q.Counts[k] != tc.want[k] {
					t.Fatalf("%s: %d, want %d (%v)", k, q.Counts[k], tc.want[k], q.Anomalies)
				}
			}
		})
	}
}

// lateRead adds a reader in us that reads a, b and the divergent c, c at
// history time at.
func lateRead(f *failoverHistory, at int64) {
	f.log("consume/us-late", "us", false, 0, 0, rec{f.a, 1}, rec{f.b, 1}, rec{f.c, 1})
	f.h.Reads[len(f.h.Reads)-1].At = at
}
