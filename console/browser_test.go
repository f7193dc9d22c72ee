package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/geolog/geolog/client"
)

// chromiumPath finds the browser, or skips the test saying how to get it.
// make test installs it (scripts/chromium.sh) and sets
// GEOLOG_REQUIRE_CHROMIUM, so there a missing browser fails instead.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("GEOLOG_REQUIRE_CHROMIUM") != "" {
		t.Fatal("chromium is not installed and GEOLOG_REQUIRE_CHROMIUM is set: scripts/chromium.sh installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed (apt-get install chromium, or run scripts/chromium.sh): the console's browser test needs it")
	return ""
}

// pageStream is what the page shows of a stream (read from its DOM).
type pageStream struct {
	Name   string      `json:"name"`
	Ranges []pageRange `json:"ranges"`
	Groups []string    `json:"groups"`
}

type pageRange struct {
	Range   int               `json:"range"`
	Home    string            `json:"home"`
	Epoch   string            `json:"epoch"`
	Tail    string            `json:"tail"`
	Leader  string            `json:"leader"`
	Regions map[string]string `json:"regions"`
}

const readPageJS = `[...document.querySelectorAll('.stream')].map(s => ({
  name: s.dataset.stream,
  ranges: [...s.querySelectorAll('tr[data-range]')].map(tr => ({
    range: +tr.dataset.range,
    home: tr.querySelector('.c-home').textContent,
    epoch: tr.querySelector('.c-epoch').textContent,
    tail: tr.querySelector('.c-tail').textContent,
    leader: tr.querySelector('.c-leader').textContent,
    regions: Object.fromEntries([...tr.querySelectorAll('td[data-region]')].map(td => [td.dataset.region, td.textContent])),
  })),
  groups: [...s.querySelectorAll('tr[data-group]')].map(tr => tr.dataset.group),
}))`

// TestConsoleInChromium starts two regions (us of three nodes, eu of
// one), creates a stream placed in both and one in us only, produces to
// them and consumes one as a group, serves the console of us's first node,
// and loads it in headless Chromium: the page must show every stream, its
// range count, and each range's home, epoch, tail and leader as the home
// leader's DescribeStream reports them, the mirror's applied offset, the
// group, and, once records flow, a non-zero records/s and a lag line per
// mirror region in the chart; the page loads nothing from anywhere else.
// A screenshot is saved under run/console/.
func TestConsoleInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and a browser")
	}
	browser := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tc := startCluster(t, map[string]int{"us": 3, "eu": 1})
	tc.createStream(t, ctx, client.StreamConfig{Name: "orders", RangeCount: 4, Regions: []string{"us", "eu"}, HomeRegion: "spread"})
	tc.createStream(t, ctx, client.StreamConfig{Name: "audit", RangeCount: 2, Regions: []string{"us"}, HomeRegion: "us"})
	produced := map[string]int{"orders": 120, "audit": 40}
	uc := tc.client(t, "us")
	ps := newProducers(t, uc)
	for stream, n := range produced {
		ps.produce(t, ctx, stream, 0, n)
	}
	consumeAsGroup(t, ctx, uc, "audit", "billing", 10)

	con, err := New(Config{Region: "us", Self: tc.addrs["us"][0], Nodes: tc.addrs, Logger: testLogger(t, "console")})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	srv := httptest.NewServer(testMux(con))
	defer srv.Close()

	// The console settles: every range known, the mirror caught up.
	waitFor(t, ctx, "the overview shows every range known and eu caught up", func() bool {
		o := getOverview(t, srv.URL)
		tails := map[string]uint64{}
		for _, s := range o.Streams {
			for _, r := range s.Ranges {
				if !r.Known {
					return false
				}
				tails[s.Name] += r.Tail
				for _, c := range r.Regions {
					if !c.Known || c.OffsetLag != 0 {
						return false
					}
				}
			}
		}
		return len(o.Streams) >= 2 && tails["orders"] == uint64(produced["orders"]) && tails["audit"] == uint64(produced["audit"])
	})

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1100))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	var reqMu sync.Mutex
	var requests []string
	if err := chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			reqMu.Lock()
			requests = append(requests, e.Request.URL)
			reqMu.Unlock()
		}
	}); err != nil {
		t.Fatalf("start the browser: %v", err)
	}
	// The page sets data-polls once it rendered its first overview.
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitReady(`body[data-polls]`)); err != nil {
		t.Fatalf("load the console: %v", err)
	}

	// What the page shows against what the API says; retried while a
	// leadership change or a poll in between makes them differ.
	var mismatch string
	waitFor(t, ctx, "the page shows what the API reports", func() bool {
		page, err := chromedp.Run(bctx, chromedp.Evaluate[[]pageStream](readPageJS))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		m := comparePage(ctx, tc, page, map[string]string{"audit": "billing"})
		if m != mismatch && m != "" {
			t.Logf("page and API differ (retrying): %s", m)
		}
		mismatch = m
		return m == ""
	})

	// Records flowing: the chart shows them, and eu's lag line is drawn.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if err := ps.produceOnce(ctx, "orders", produced["orders"]+i); err != nil && ctx.Err() == nil {
				t.Logf("produce: %v", err)
			}
		}
	}()
	waitFor(t, ctx, "the chart shows records/s above 0 and a lag line for eu", func() bool {
		rate, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('rate-now').textContent`))
		if err != nil {
			t.Fatalf("read the chart: %v", err)
		}
		lagLine, err := chromedp.Run(bctx, chromedp.Evaluate[bool](
			`!!document.querySelector('#chart-lag polyline[data-series="eu"]') && !!document.querySelector('#chart-rate polyline')`))
		if err != nil {
			t.Fatalf("read the chart: %v", err)
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(rate, " now"))
		return n > 0 && lagLine
	})
	// A few more points on the chart before the screenshot.
	polls := func() int {
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.dataset.polls`))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		n, _ := strconv.Atoi(v)
		return n
	}
	shotAt := polls() + 5
	waitFor(t, ctx, "five more polls", func() bool { return polls() >= shotAt })
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	close(stop)
	wg.Wait()
	dir := filepath.Join("..", "run", "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot, _ := filepath.Abs(filepath.Join(dir, "console.png"))
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	reqMu.Lock()
	defer reqMu.Unlock()
	if len(requests) == 0 {
		t.Fatal("saw no request from the page")
	}
	for _, u := range requests {
		if !strings.HasPrefix(u, srv.URL+"/") {
			t.Errorf("the page asked %s: it must load nothing but the console's own files", u)
		}
	}
}

// comparePage checks the page against each range's home leader's own
// DescribeStream; "" when they agree, else the first difference.
func comparePage(ctx context.Context, tc *testCluster, page []pageStream, groups map[string]string) string {
	shown := map[string]pageStream{}
	for _, s := range page {
		shown[s.Name] = s
	}
	for _, name := range []string{"audit", "orders"} {
		ps, ok := shown[name]
		if !ok {
			return fmt.Sprintf("stream %s not shown (page: %d streams)", name, len(page))
		}
		want, err := homeLeaderViews(ctx, tc, name)
		if err != nil {
			return err.Error()
		}
		if len(ps.Ranges) != len(want) {
			return fmt.Sprintf("%s: %d ranges shown, the API has %d", name, len(ps.Ranges), len(want))
		}
		for i, pr := range ps.Ranges {
			w := want[i]
			got := fmt.Sprintf("range %d home %s epoch %s tail %s leader %s", pr.Range, pr.Home, pr.Epoch, pr.Tail, pr.Leader)
			exp := fmt.Sprintf("range %d home %s epoch %d tail %d leader %s", w.ri.Range, w.ri.HomeRegion, w.ri.Epoch, w.ri.TailOffset, w.ri.Leader)
			if got != exp {
				return fmt.Sprintf("%s: shown %q, the home leader says %q", name, got, exp)
			}
			if cell := pr.Regions[w.ri.HomeRegion]; cell != fmt.Sprintf("%d home", w.ri.TailOffset) {
				return fmt.Sprintf("%s range %d: home cell %q", name, pr.Range, cell)
			}
			for _, p := range w.ri.Replication {
				if cell := pr.Regions[p.Region]; !strings.HasPrefix(cell, fmt.Sprintf("%d lag ", p.AppliedEnd)) {
					return fmt.Sprintf("%s range %d: %s cell %q, its applied end is %d", name, pr.Range, p.Region, cell, p.AppliedEnd)
				}
			}
		}
		if g := groups[name]; g != "" && !contains(ps.Groups, g) {
			return fmt.Sprintf("%s: group %s not shown (shown: %v)", name, g, ps.Groups)
		}
	}
	return ""
}

type leaderView struct {
	ri client.RangeInfo
}

// homeLeaderViews asks every node of each range's home region and keeps
// the answer of the node that names itself the leader.
func homeLeaderViews(ctx context.Context, tc *testCluster, stream string) ([]leaderView, error) {
	descs := map[string]*client.StreamDescription{}
	var count uint32
	var homes []string
	for _, r := range tc.regions {
		for _, a := range tc.addrs[r] {
			d, err := describeAt(ctx, a, stream)
			if err != nil {
				continue
			}
			descs[a] = d
			count = d.Stream.RangeCount
			homes = make([]string, count)
			for _, ri := range d.Ranges {
				homes[ri.Range] = ri.HomeRegion
			}
		}
	}
	out := make([]leaderView, count)
	for i := range out {
		found := false
		for _, a := range tc.addrs[homes[i]] {
			d := descs[a]
			if d == nil {
				continue
			}
			for _, ri := range d.Ranges {
				if ri.Range == uint32(i) && ri.Leader == a {
					out[i], found = leaderView{ri}, true
				}
			}
		}
		if !found {
			return nil, fmt.Errorf("%s range %d: no node of %s names itself leader", stream, i, homes[i])
		}
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// testMux mounts the console as geologd does.
func testMux(con *Console) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/console/", con)
	mux.Handle("/{$}", http.RedirectHandler("/console/", http.StatusFound))
	return mux
}

func getOverview(t *testing.T, base string) *Overview {
	t.Helper()
	resp, err := http.Get(base + "/console/api/overview")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var o Overview
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		t.Fatalf("decode the overview: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("overview: %s", resp.Status)
	}
	return &o
}

// producerSet produces to streams through one producer each.
type producerSet struct {
	c  *client.Client
	mu sync.Mutex
	m  map[string]*client.Producer
}

func newProducers(t *testing.T, c *client.Client) *producerSet {
	ps := &producerSet{c: c, m: map[string]*client.Producer{}}
	t.Cleanup(func() {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, p := range ps.m {
			p.Close()
		}
	})
	return ps
}

// produce appends records [from, from+n) to stream, keyed so that they
// spread over the ranges.
func (ps *producerSet) produce(t *testing.T, ctx context.Context, stream string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if err := ps.produceOnce(ctx, stream, i); err != nil {
			t.Fatalf("produce to %s: %v", stream, err)
		}
	}
}

func (ps *producerSet) produceOnce(ctx context.Context, stream string, i int) error {
	ps.mu.Lock()
	p := ps.m[stream]
	if p == nil {
		var err error
		if p, err = ps.c.NewProducer(stream); err != nil {
			ps.mu.Unlock()
			return err
		}
		ps.m[stream] = p
	}
	ps.mu.Unlock()
	_, err := p.ProduceSync(ctx, &client.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))})
	return err
}

// consumeAsGroup consumes n records of stream as a member of group, then
// leaves (committing what it consumed).
func consumeAsGroup(t *testing.T, ctx context.Context, c *client.Client, stream, group string, n int) {
	t.Helper()
	gc, err := c.NewGroupConsumer(stream, group)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	got := 0
	for rec, err := range gc.Records(cctx) {
		if err != nil {
			t.Fatalf("group %s: %v", group, err)
		}
		gc.Mark(rec)
		if got++; got == n {
			break
		}
	}
	if err := gc.Close(); err != nil {
		t.Fatalf("group %s close: %v", group, err)
	}
}
