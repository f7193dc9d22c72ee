package wan

import (
	"errors"
	"testing"
	"time"
)

// threeRegions builds a Net with a link from every region to every other
// one's upstream (one echo server per region) and one to the lease store.
func threeRegions(t *testing.T) *Net {
	t.Helper()
	n := NewNet(testLogger(t))
	t.Cleanup(func() { _ = n.Close() })
	regions := []string{"us", "eu", "ap"}
	ups := map[string]*upstream{}
	for _, r := range append(regions, "pg") {
		ups[r] = startUpstream(t, nil)
	}
	for _, from := range regions {
		for _, to := range append(regions, "pg") {
			if from == to {
				continue
			}
			if _, err := n.Add(Config{From: from, To: to, Upstream: ups[to].addr(), Latency: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n
}

func names(links []*Link) []string {
	out := make([]string, len(links))
	for i, l := range links {
		out[i] = l.Name()
	}
	return out
}

func states(n *Net) map[string]string {
	out := map[string]string{}
	for _, s := range n.Stats() {
		out[s.Name] = s.State
	}
	return out
}

func TestNetRegions(t *testing.T) {
	n := threeRegions(t)
	if got := len(n.Links()); got != 9 {
		t.Fatalf("%d links, want 9", got)
	}
	// Isolate eu: every link from or to eu, nothing else.
	cut, err := n.CutRegion("eu", CutBlackhole)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ap->eu", "eu->ap", "eu->pg", "eu->us", "us->eu"}
	if got := names(cut); len(got) != len(want) {
		t.Fatalf("cut %v, want %v", got, want)
	} else {
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("cut %v, want %v", got, want)
			}
		}
	}
	st := states(n)
	for _, name := range want {
		if st[name] != "blackhole" {
			t.Errorf("%s is %s", name, st[name])
		}
	}
	for _, name := range []string{"us->ap", "ap->us", "us->pg", "ap->pg"} {
		if st[name] != "up" {
			t.Errorf("%s is %s, want up", name, st[name])
		}
	}
	// Traffic between the other regions still flows; into eu it stalls.
	usAP, _ := n.Link("us->ap")
	roundTrip(t, dial(t, usAP.Addr()), []byte("ok"))
	usEU, _ := n.Link("us->eu")
	c := dial(t, usEU.Addr())
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	expectSilence(t, c, 50*time.Millisecond)
	if _, err := n.HealRegion("eu"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(buf); err != nil || string(buf) != "held" {
		t.Fatalf("after heal read %q, %v", buf, err)
	}

	// Cut the lease store off from everyone.
	if cut, err := n.CutRegion("pg", CutReset); err != nil || len(cut) != 3 {
		t.Fatalf("cut pg: %v, %v", names(cut), err)
	}
	if err := n.HealAll(); err != nil {
		t.Fatal(err)
	}
	for name, s := range states(n) {
		if s != "up" {
			t.Errorf("%s is %s after HealAll", name, s)
		}
	}

	// A partition between two regions, both ways, and nothing else.
	cut, err = n.Partition("us", "ap", CutBlackhole)
	if err != nil || len(cut) != 2 || cut[0].Name() != "ap->us" || cut[1].Name() != "us->ap" {
		t.Fatalf("partition: %v, %v", names(cut), err)
	}
	if s := states(n)["us->eu"]; s != "up" {
		t.Fatalf("us->eu is %s during a us/ap partition", s)
	}
	if _, err := n.HealBetween("ap", "us"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.SetLatencyBetween("us", "eu", 25*time.Millisecond, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, s := range n.Stats() {
		want := time.Millisecond
		if s.Name == "us->eu" || s.Name == "eu->us" {
			want = 25 * time.Millisecond
		}
		if s.Latency != want || s.State != "up" {
			t.Errorf("%s: latency %s state %s", s.Name, s.Latency, s.State)
		}
	}
}

func TestNetErrors(t *testing.T) {
	n := threeRegions(t)
	if _, err := n.Add(Config{From: "us", To: "eu", Upstream: "127.0.0.1:9"}); !errors.Is(err, ErrLinkExists) {
		t.Errorf("duplicate: %v", err)
	}
	if _, err := n.Add(Config{Upstream: "127.0.0.1:9"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("no name: %v", err)
	}
	if _, err := n.Link("nope"); !errors.Is(err, ErrUnknownLink) {
		t.Errorf("Link: %v", err)
	}
	if _, err := n.CutRegion("mars", CutBlackhole); !errors.Is(err, ErrUnknownLink) {
		t.Errorf("CutRegion of an unknown region: %v", err)
	}
	if _, err := n.Partition("us", "mars", CutBlackhole); !errors.Is(err, ErrUnknownLink) {
		t.Errorf("Partition with an unknown region: %v", err)
	}
	if _, err := n.CutRegion("us", 7); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("CutRegion with a bad mode: %v", err)
	}
	if _, err := n.SetLatencyBetween("us", "eu", -1, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("SetLatencyBetween: %v", err)
	}
	if err := n.Remove("us->eu"); err != nil {
		t.Fatal(err)
	}
	if err := n.Remove("us->eu"); !errors.Is(err, ErrUnknownLink) {
		t.Errorf("second Remove: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Add(Config{Name: "late", Upstream: "127.0.0.1:9"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v", err)
	}
	if err := n.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}
