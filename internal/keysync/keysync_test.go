package keysync

import (
	"testing"
	"time"
)

func TestConversationsAreEven(t *testing.T) {
	w := Workload{Records: 10_000, Conversations: 100, ValueBytes: 10, BatchRecords: 7}
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
	count := map[uint64]int{}
	first := map[uint64]uint64{}
	last := map[uint64]uint64{}
	for off := range w.Records {
		c := w.Conversation(off)
		if count[c] == 0 {
			first[c] = off
		}
		count[c]++
		last[c] = off
	}
	for c := range w.Conversations {
		if count[c] != 100 {
			t.Fatalf("conversation %d has %d records", c, count[c])
		}
		// Spread over the range, not bunched at one end.
		if first[c] > w.Records/10 || last[c] < w.Records*9/10 {
			t.Fatalf("conversation %d spans [%d, %d]", c, first[c], last[c])
		}
	}
	if (Workload{Records: 3_000, Conversations: 30, BatchRecords: 1}).Check() == nil {
		t.Fatal("3000 records accepted")
	}
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	if got := Percentiles(ds, 50, 99, 100); got[0] != 50 || got[1] != 99 || got[2] != 100 {
		t.Fatalf("percentiles %v", got)
	}
}
