package wan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// control calls the control API and decodes a LinksResponse; it returns
// the status code and, on error, the ErrorResponse message.
func control(t *testing.T, base, method, path string) (int, LinksResponse, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var lr LinksResponse
	var er ErrorResponse
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &lr); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, body)
		}
	} else if err := json.Unmarshal(body, &er); err != nil {
		t.Fatalf("%s %s: status %d, body %s", method, path, resp.StatusCode, body)
	}
	return resp.StatusCode, lr, er.Error
}

func startServer(t *testing.T, fileJSON string) *Server {
	t.Helper()
	sc, err := ParseFileConfig([]byte(fileJSON))
	if err != nil {
		t.Fatal(err)
	}
	sc.Logger = testLogger(t)
	s, err := StartServer(sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestControlAPI(t *testing.T) {
	up := startUpstream(t, stampServer)
	s := startServer(t, fmt.Sprintf(`{
		"seed": 5,
		"links": [
			{"name": "us->eu", "upstream": %q, "latency": "20ms"},
			{"name": "eu->us", "upstream": %q, "latency": 20},
			{"name": "eu->pg", "upstream": %q}
		]}`, up.addr(), up.addr(), up.addr()))
	base := s.ControlAddr()

	code, lr, _ := control(t, base, "GET", "/links")
	if code != 200 || len(lr.Links) != 3 || lr.Links[2].Name != "us->eu" || lr.Links[2].LatencyMs != 20 || lr.Links[2].State != "up" {
		t.Fatalf("GET /links: %d %+v", code, lr)
	}
	// The default latency is the per-pair one in [30, 80] ms.
	if ms := lr.Links[0].LatencyMs; lr.Links[0].Name != "eu->pg" || ms < 30 || ms > 80 {
		t.Fatalf("default latency %+v", lr.Links[0])
	}

	usEU, err := s.Net().Link("us->eu")
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, usEU.Addr())
	// Never early; how late a byte may be on a busy machine is not under
	// test here (BenchmarkRTT measures it).
	if there, _ := oneWay(t, c); there < 20*time.Millisecond {
		t.Fatalf("one way %s with latency 20ms", there)
	}

	// Latency on the fly, through the API, with a measurable effect.
	// A fractional latency well above the first one shows the change
	// applies at once through the API without an upper bound on delay.
	code, lr, _ = control(t, base, "POST", "/links/us-%3Eeu/latency?ms=250.5&jitter_ms=0")
	if code != 200 || len(lr.Links) != 1 || lr.Links[0].LatencyMs != 250.5 {
		t.Fatalf("latency: %d %+v", code, lr)
	}
	if there, _ := oneWay(t, c); there < 250500*time.Microsecond {
		t.Fatalf("one way %s after setting 250.5ms", there)
	}

	// Cut (blackhole), then heal, through the API; an unescaped '>' works
	// too (as curl sends it).
	code, lr, _ = control(t, base, "POST", "/links/us->eu/cut?mode=blackhole")
	if code != 200 || lr.Links[0].State != "blackhole" {
		t.Fatalf("cut: %d %+v", code, lr)
	}
	if _, err := c.Write(make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	expectSilence(t, c, 50*time.Millisecond)
	if code, lr, _ = control(t, base, "POST", "/links/us->eu/heal"); code != 200 || lr.Links[0].State != "up" {
		t.Fatalf("heal: %d %+v", code, lr)
	}
	resp := make([]byte, 16)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, resp); err != nil {
		t.Fatalf("held request after heal: %v", err)
	}

	// Region and partition helpers.
	if code, lr, _ = control(t, base, "POST", "/regions/eu/cut?mode=reset"); code != 200 || len(lr.Links) != 3 {
		t.Fatalf("cut region: %d %+v", code, lr)
	}
	expectBroken(t, c)
	if code, lr, _ = control(t, base, "POST", "/heal"); code != 200 || len(lr.Links) != 3 {
		t.Fatalf("heal all: %d %+v", code, lr)
	}
	for _, l := range lr.Links {
		if l.State != "up" {
			t.Fatalf("after /heal: %+v", l)
		}
	}
	if code, lr, _ = control(t, base, "POST", "/partition?a=us&b=eu"); code != 200 || len(lr.Links) != 2 || lr.Links[0].State != "blackhole" {
		t.Fatalf("partition: %d %+v", code, lr)
	}
	if code, lr, _ = control(t, base, "POST", "/partition/heal?a=eu&b=us"); code != 200 || lr.Links[1].State != "up" {
		t.Fatalf("partition heal: %d %+v", code, lr)
	}
	if code, lr, _ = control(t, base, "POST", "/links/eu->pg/bandwidth?bytes_per_second=1000000"); code != 200 || lr.Links[0].BandwidthBytesPerSecond != 1000000 {
		t.Fatalf("bandwidth: %d %+v", code, lr)
	}
	if code, lr, _ = control(t, base, "GET", "/links/us->eu"); code != 200 || lr.Links[0].ConnsAccepted != 1 || lr.Links[0].Cuts != 3 {
		t.Fatalf("GET one: %d %+v", code, lr)
	}

	// Errors are typed by status code, with a JSON message.
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"POST", "/links/nope/cut", 404},
		{"GET", "/links/nope", 404},
		{"POST", "/links/us->eu/cut?mode=sideways", 400},
		{"POST", "/links/us->eu/latency", 400},
		{"POST", "/links/us->eu/latency?ms=-3", 400},
		{"POST", "/links/us->eu/latency?ms=NaN", 400},
		{"POST", "/links/us->eu/latency?ms=5&jitter_ms=x", 400},
		{"POST", "/links/us->eu/latency?ms=20000", 400},
		{"POST", "/links/us->eu/bandwidth?bytes_per_second=-1", 400},
		{"POST", "/links/us->eu/bandwidth", 400},
		{"POST", "/regions/mars/cut", 404},
		{"POST", "/regions/eu/cut?mode=x", 400},
		{"POST", "/partition?a=us", 400},
		{"POST", "/partition/heal?b=us", 400},
	} {
		code, _, msg := control(t, base, tc.method, tc.path)
		if code != tc.code || msg == "" {
			t.Errorf("%s %s: %d %q, want %d with a message", tc.method, tc.path, code, msg, tc.code)
		}
	}
	// Wrong method.
	if code, _, _ := controlRaw(t, base, "GET", "/links/us->eu/cut"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET on a POST route: %d", code)
	}
	if code, _, body := controlRaw(t, base, "GET", "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("healthz: %d %q", code, body)
	}
}

func controlRaw(t *testing.T, base, method, path string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+base+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

func TestRunStopsOnCancel(t *testing.T) {
	up := startUpstream(t, nil)
	sc, err := ParseFileConfig([]byte(fmt.Sprintf(`{"links": [{"name": "a->b", "upstream": %q, "latency": "1ms"}]}`, up.addr())))
	if err != nil {
		t.Fatal(err)
	}
	sc.Logger = testLogger(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *Server, 1)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, sc, func(s *Server) { ready <- s }) }()
	var s *Server
	select {
	case s = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	l, _ := s.Net().Link("a->b")
	c := dial(t, l.Addr())
	roundTrip(t, c, []byte("x"))
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	expectBroken(t, c)
	if _, err := http.Get("http://" + s.ControlAddr() + "/healthz"); err == nil {
		t.Fatal("control API still serving after Run returned")
	}
}

func TestFileConfig(t *testing.T) {
	sc, err := ParseFileConfig([]byte(`{
		"control": "127.0.0.1:0", "seed": 3, "jitter": "2ms",
		"links": [
			{"name": "us->eu.n1", "upstream": "127.0.0.1:7001", "latency": "40ms"},
			{"name": "us->eu.n2", "upstream": "127.0.0.1:7002", "jitter": 0},
			{"name": "eu->us.n2", "upstream": "127.0.0.1:7003", "bandwidth_bytes_per_second": 1000},
			{"name": "custom", "from": "x", "to": "y", "listen": "127.0.0.1:0", "upstream": "localhost:7004", "latency": 12.5}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	l := sc.Links
	if len(l) != 4 || l[0].Latency != 40*time.Millisecond || l[0].Jitter != 2*time.Millisecond || l[0].From != "us" || l[0].To != "eu" || l[0].Seed != 3 {
		t.Fatalf("link 0: %+v", l[0])
	}
	// Pairs without a latency get the same one both ways, in [30, 80] ms.
	if l[1].Latency != l[2].Latency || l[1].Latency < 30*time.Millisecond || l[1].Latency > 80*time.Millisecond || l[1].Jitter != 0 {
		t.Fatalf("default latencies %s %s, jitter %s", l[1].Latency, l[2].Latency, l[1].Jitter)
	}
	if l[2].BandwidthBytesPerSecond != 1000 || l[3].Latency != 12500*time.Microsecond || l[3].From != "x" {
		t.Fatalf("links 2, 3: %+v %+v", l[2], l[3])
	}

	for _, tc := range []struct{ name, json, field string }{
		{"not json", `{`, "file"},
		{"unknown field", `{"links": [], "latncy": "4ms"}`, "file"},
		{"unknown link field", `{"links": [{"name": "a", "upstream": "h:1", "lag": 3}]}`, "file"},
		{"trailing data", `{"links": []} {}`, "file"},
		{"bad duration", `{"links": [{"name": "a", "upstream": "h:1", "latency": "forty"}]}`, "file"},
		{"bad duration type", `{"links": [{"name": "a", "upstream": "h:1", "latency": true}]}`, "file"},
		{"negative latency", `{"links": [{"name": "a", "upstream": "h:1", "latency": "-1ms"}]}`, "links[0].Latency"},
		{"no upstream", `{"links": [{"name": "a"}]}`, "links[0].Upstream"},
		{"bad name", `{"links": [{"name": "a b", "upstream": "h:1"}]}`, "links[0].Name"},
		{"duplicate name", `{"links": [{"name": "a", "upstream": "h:1"}, {"name": "a", "upstream": "h:2"}]}`, "links[1].name"},
		{"duplicate listen", `{"links": [{"name": "a", "listen": "127.0.0.1:7100", "upstream": "h:1"}, {"name": "b", "listen": "127.0.0.1:7100", "upstream": "h:2"}]}`, "links[1].listen"},
		{"bad control", `{"control": "nowhere", "links": []}`, "control"},
		{"huge", `{"links": [], "control": "` + strings.Repeat("x", configBytesMax) + `"}`, "file"},
	} {
		_, err := ParseFileConfig([]byte(tc.json))
		var ce *ConfigError
		if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: %v, want a ConfigError on %s", tc.name, err, tc.field)
		}
	}
	// A StartServer that fails leaves nothing running.
	up := startUpstream(t, nil)
	taken := startLink(t, Config{Name: "t", Upstream: up.addr()})
	_, err = StartServer(ServerConfig{Links: []Config{
		{Name: "first", Listen: "127.0.0.1:0", Upstream: up.addr()},
		{Name: "second", Listen: taken.Addr(), Upstream: up.addr()},
	}})
	if err == nil {
		t.Fatal("StartServer on a taken address succeeded")
	}
}
