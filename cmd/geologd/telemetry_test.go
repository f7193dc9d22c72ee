package main

import (
	"context"
	"io"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/regionsvc"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/otlptranslator"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// instrumentNames records every instrument a meter provider creates, as
// the Prometheus names the exporter gives it (with the suffixes of its
// type), so that series a node exports only in some setups (several
// regions, homing, TLS, groups) are known without building each setup.
type instrumentNames struct {
	mu    sync.Mutex
	names map[string]bool
}

func (in *instrumentNames) view(t *testing.T) sdkmetric.View {
	namer := otlptranslator.NewMetricNamer("", otlptranslator.UnderscoreEscapingWithSuffixes)
	return func(i sdkmetric.Instrument) (sdkmetric.Stream, bool) {
		typ, suffixes := otlptranslator.MetricType(otlptranslator.MetricTypeGauge), []string{""}
		switch i.Kind {
		case sdkmetric.InstrumentKindCounter, sdkmetric.InstrumentKindObservableCounter:
			typ = otlptranslator.MetricTypeMonotonicCounter
		case sdkmetric.InstrumentKindUpDownCounter, sdkmetric.InstrumentKindObservableUpDownCounter:
			typ = otlptranslator.MetricTypeNonMonotonicCounter
		case sdkmetric.InstrumentKindHistogram:
			typ, suffixes = otlptranslator.MetricTypeHistogram, []string{"_bucket", "_sum", "_count"}
		}
		name, err := namer.Build(otlptranslator.Metric{Name: i.Name, Unit: i.Unit, Type: typ})
		if err != nil {
			t.Errorf("instrument %s: %v", i.Name, err)
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		for _, s := range suffixes {
			in.names[name+s] = true
		}
		return sdkmetric.Stream{}, false
	}
}

// testNodeMetrics starts a node whose metrics go through newMetrics (as
// geologd's do), appends to it, and returns the names of every series it
// can export (the Go and process collectors' included) and one scrape.
func testNodeMetrics(t *testing.T) (names map[string]bool, scrape string) {
	t.Helper()
	res, err := nodeResource("eu", 2)
	if err != nil {
		t.Fatal(err)
	}
	mp, reg, handler, err := newMetrics(res)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(context.Background())
	rec := &instrumentNames{names: map[string]bool{}}
	names = rec.names
	recorder := sdkmetric.NewMeterProvider(sdkmetric.WithView(rec.view(t)), sdkmetric.WithReader(sdkmetric.NewManualReader()))
	for _, mp := range []*sdkmetric.MeterProvider{mp, recorder} {
		n, err := regionsvc.New(regionsvc.Config{DataDir: t.TempDir(), ListenAddr: "127.0.0.1:0", Region: "eu", MeterProvider: mp})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if mp != recorder {
			appendSome(t, n.Addr())
		}
	}
	// The certificate gauge exists with TLS only: its instrument is
	// recorded from pki (never collected: its callback needs files).
	if err := new(pki.Files).RegisterMetrics(recorder); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "geolog_") || strings.HasPrefix(mf.GetName(), "rpc_") {
			continue // recorded above
		}
		// The Go runtime's, the process's, target_info.
		names[mf.GetName()] = true
		switch mf.GetType() {
		case dto.MetricType_SUMMARY:
			names[mf.GetName()+"_sum"], names[mf.GetName()+"_count"] = true, true
		case dto.MetricType_HISTOGRAM:
			names[mf.GetName()+"_bucket"], names[mf.GetName()+"_sum"], names[mf.GetName()+"_count"] = true, true, true
		}
	}
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(w.Result().Body)
	return names, string(body)
}

func appendSome(t *testing.T, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := geologv1.NewLogClient(conn)
	if _, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "m", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "m", Range: 1, Records: []*geologv1.Record{{Value: []byte("v")}}}); err != nil {
			t.Fatal(err)
		}
	}
}

var seriesLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? `)

// TestMetricsExposition: the scrape carries no otel_scope_* label; every
// geolog series says its region and node; target_info names the service
// and its version; every series scraped is one the recorded instruments
// name (so the names the dashboard and alert tests check against are the
// exporter's own).
func TestMetricsExposition(t *testing.T) {
	names, scrape := testNodeMetrics(t)
	if strings.Contains(scrape, "otel_scope_") {
		t.Error("the scrape carries otel_scope_* labels")
	}
	if strings.Contains(scrape, "unknown_service") {
		t.Error("the scrape names an unknown service")
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(scrape, "\n") {
		m := seriesLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name, labels := m[1], m[2]
		seen[name] = true
		if !names[name] {
			t.Errorf("scraped %s, which no recorded instrument names", name)
		}
		if strings.HasPrefix(name, "geolog_") && (!strings.Contains(labels, `geolog_region="eu"`) || !strings.Contains(labels, `geolog_node_id="2"`)) {
			t.Errorf("%s lacks the region and node labels: %s", name, line)
		}
		if name == "target_info" && (!strings.Contains(labels, `service_name="geologd"`) || !strings.Contains(labels, `service_version="`)) {
			t.Errorf("target_info: %s", line)
		}
	}
	for _, want := range []string{"geolog_append_acked_records_total", "geolog_node_ready", "geolog_disk_free_bytes",
		"geolog_append_commit_duration_seconds_bucket", "geolog_segment_fsync_duration_seconds_count", "target_info",
		"geolog_raft_dropped_messages_total", "geolog_raft_send_queue_messages"} {
		if !seen[want] {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	if t.Failed() {
		var all []string
		for n := range names {
			all = append(all, n)
		}
		sort.Strings(all)
		t.Logf("recorded names: %v", all)
	}
}
