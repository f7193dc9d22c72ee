package chaos

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/geolog/geolog/wan"
)

func TestScenariosAreValidData(t *testing.T) {
	for _, list := range [][]Scenario{Scenarios(), Slice()} {
		for _, s := range list {
			if err := s.Validate(); err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			b, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back Scenario
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s, back) {
				t.Fatalf("%s: JSON round trip changed it:\n%+v\n%+v", s.Name, s, back)
			}
		}
	}
}

func TestFaultFromJSON(t *testing.T) {
	var f Fault
	err := json.Unmarshal([]byte(`{"kind":"latency","target":{"a":"us","b":"eu","one_way":true},
		"params":{"latency":"150ms","jitter":"10ms"},"start":"2s","duration":"5s","every":"10s"}`), &f)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := f.String(), "latency us->eu at 2s for 5s every 10s"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestFaultValidateRefuses(t *testing.T) {
	bad := []Fault{
		{Kind: "flood", Target: Target{Node: "us:n1"}},
		{Kind: KindKill},
		{Kind: KindKill, Target: Target{Node: "us:leaderr"}},
		{Kind: KindKill, Target: Target{Node: "us:n0"}},
		{Kind: KindKill, Target: Target{Node: ":n1"}},
		{Kind: KindPartition, Target: Target{A: "us"}},
		{Kind: KindPartition, Target: Target{A: "us", B: "eu"}, Params: Params{CutMode: "drop"}},
		{Kind: KindLatency, Target: Target{A: "us", B: "eu"}},
		{Kind: KindDisk, Target: Target{Node: "us:n1"}},
		{Kind: KindClockSkew, Target: Target{Node: "us:n1"}},
		{Kind: KindLeaseStoreOutage, Params: Params{StoreMode: "unplug"}},
		{Kind: KindPause, Target: Target{Node: "us:n1"}, Duration: D(5e9), Every: D(5e9)},
		{Kind: KindPause, Target: Target{Node: "us:n1"}, Start: -1},
		{Kind: KindRehome},
		{Kind: KindRehome, Target: Target{A: "us:n1"}},
	}
	for _, f := range bad {
		if err := f.Validate(); err == nil {
			t.Errorf("%+v: Validate accepted it", f)
		}
	}
}

func TestLinkSelection(t *testing.T) {
	var links []wan.LinkStatus
	for _, name := range []string{
		"us->eu.n1", "us->eu.n2", "eu->us.n1", "eu->us.n2", "us->ap.n1", "ap->us.n1",
		"us:n1->us:n2", "us:n2->us:n1", "us:n1->us:n3", "us:n3->us:n1", "us:n2->us:n3", "us:n3->us:n2",
		"client->us:n1", "client->us:n2", "us->pg", "eu->pg",
	} {
		from, to, _ := wan.RegionsFromName(name)
		links = append(links, wan.LinkStatus{Name: name, From: from, To: to})
	}
	names := func(ls []wan.LinkStatus) string {
		var out []string
		for _, l := range ls {
			out = append(out, l.Name)
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	}
	cases := []struct {
		a, b   []string
		oneWay bool
		want   string
	}{
		{[]string{"us"}, []string{"eu"}, false, "eu->us.n1 eu->us.n2 us->eu.n1 us->eu.n2"},
		{[]string{"us"}, []string{"eu"}, true, "us->eu.n1 us->eu.n2"},
		{[]string{"us:n1"}, []string{"us:n2", "us:n3"}, false, "us:n1->us:n2 us:n1->us:n3 us:n2->us:n1 us:n3->us:n1"},
		{[]string{"client"}, []string{"us:n2"}, true, "client->us:n2"},
		{[]string{"eu"}, []string{"us:n2"}, false, "eu->us.n2"},
		{[]string{"us"}, []string{"pg"}, false, "us->pg"},
		{[]string{"us", "eu"}, []string{"pg"}, false, "eu->pg us->pg"},
	}
	for _, tc := range cases {
		if got := names(linksBetween(links, tc.a, tc.b, tc.oneWay)); got != tc.want {
			t.Errorf("linksBetween(%v, %v, %v) = %q, want %q", tc.a, tc.b, tc.oneWay, got, tc.want)
		}
	}
}
