package console

import (
	"errors"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
)

func desc(ranges ...client.RangeInfo) *client.StreamDescription {
	return &client.StreamDescription{Stream: client.StreamInfo{Name: "s", RangeCount: 1, Regions: []string{"us", "eu"}}, Ranges: ranges}
}

// TestMergeRanges: the merge keeps the home leader's figures, falls back
// to what is known, and never makes up what nobody reported.
func TestMergeRanges(t *testing.T) {
	regions := []string{"us", "eu"}
	homeLeader := client.RangeInfo{Range: 0, HomeRegion: "us", Epoch: 3, TailOffset: 100, Leader: "us1",
		Replication: []client.RegionProgress{{Region: "eu", AppliedEnd: 90, OffsetLag: 4, TimeLag: 20 * time.Millisecond, State: "streaming"}}}
	follower := client.RangeInfo{Range: 0, HomeRegion: "us", Epoch: 3, TailOffset: 98, Leader: "us1"}
	mirrorSelf := client.RangeInfo{Range: 0, HomeRegion: "us", Epoch: 3, TailOffset: 95, Leader: "eu1",
		Replication: []client.RegionProgress{{Region: "eu", AppliedEnd: 95, State: "mirror"}}}
	down := errors.New("unavailable")
	for _, tc := range []struct {
		name    string
		answers []answer
		// want: known, epoch, tail, leader, eu known, eu applied, eu lag
		known           bool
		epoch, tail     uint64
		leader          string
		euKnown         bool
		euApplied, euLg uint64
	}{
		{"home leader and mirror: the home leader's figures, lag at least tail-applied",
			[]answer{{region: "us", desc: desc(follower)}, {region: "us", desc: desc(homeLeader)}, {region: "eu", desc: desc(mirrorSelf)}},
			true, 3, 100, "us1", true, 90, 10},
		{"home leader down: the follower's tail, the mirror's own report",
			[]answer{{region: "us", desc: desc(follower)}, {region: "us", err: down}, {region: "eu", desc: desc(mirrorSelf)}},
			true, 3, 98, "us1", true, 95, 3},
		{"home region silent: nothing known of it, the mirror as it reports itself",
			[]answer{{region: "us", err: down}, {region: "eu", desc: desc(mirrorSelf)}},
			false, 0, 0, "", true, 95, 0},
		{"nobody answered",
			[]answer{{region: "us", err: down}, {region: "eu", err: down}},
			false, 0, 0, "", false, 0, 0},
		{"two home leaders (an election between the calls): the later epoch",
			[]answer{{region: "us", desc: desc(homeLeader)}, {region: "us", desc: desc(client.RangeInfo{Range: 0, HomeRegion: "us", Epoch: 4, TailOffset: 101, Leader: "us2",
				Replication: []client.RegionProgress{{Region: "eu", AppliedEnd: 101, State: "streaming"}}})}},
			true, 4, 101, "us2", true, 101, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeRanges(regions, 1, tc.answers)
			if len(got) != 1 {
				t.Fatalf("%d ranges", len(got))
			}
			r := got[0]
			if r.Known != tc.known || r.Epoch != tc.epoch || r.Tail != tc.tail || r.Leader != tc.leader {
				t.Errorf("range: known %v epoch %d tail %d leader %q; want %v %d %d %q", r.Known, r.Epoch, r.Tail, r.Leader, tc.known, tc.epoch, tc.tail, tc.leader)
			}
			eu := r.Regions["eu"]
			if eu.Known != tc.euKnown || eu.AppliedEnd != tc.euApplied || eu.OffsetLag != tc.euLg {
				t.Errorf("eu: %+v; want known %v applied %d lag %d", eu, tc.euKnown, tc.euApplied, tc.euLg)
			}
			us, ok := r.Regions["us"]
			if !ok || us.Known != tc.known || (tc.known && (!us.Home || us.AppliedEnd != tc.tail)) {
				t.Errorf("us (the home): %+v", us)
			}
		})
	}
}

// TestMergeRangesEveryRange: each range is merged from its own reports,
// whatever order the node lists them in, and a range nobody listed is
// there, unknown.
func TestMergeRangesEveryRange(t *testing.T) {
	d := &client.StreamDescription{Ranges: []client.RangeInfo{
		{Range: 2, HomeRegion: "us", Epoch: 1, TailOffset: 7, Leader: "a"},
		{Range: 0, HomeRegion: "us", Epoch: 1, TailOffset: 5, Leader: "a"},
	}}
	got := mergeRanges([]string{"us"}, 3, []answer{{region: "us", desc: d}})
	if got[0].Tail != 5 || got[2].Tail != 7 || !got[0].Known || !got[2].Known {
		t.Errorf("ranges 0 and 2: %+v %+v", got[0], got[2])
	}
	if got[1].Known || got[1].Range != 1 {
		t.Errorf("range 1, which nobody listed: %+v", got[1])
	}
}
