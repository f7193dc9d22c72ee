package pki

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// expiryGauge collects ExpiryMetric from r: seconds left by "certificate".
func expiryGauge(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != ExpiryMetric {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
				which, _ := dp.Attributes.Value("certificate")
				id, _ := dp.Attributes.Value("identity")
				if id.AsString() != "node:us/1" {
					t.Errorf("identity %q, want node:us/1", id.AsString())
				}
				got[which.AsString()] = dp.Value
			}
		}
	}
	return got
}

// TestExpiryMetric: the gauge says how long the node's certificate and
// its CA have left, and follows a reload to the new certificate.
func TestExpiryMetric(t *testing.T) {
	issued := time.Now().Truncate(time.Second)
	caPair, err := CreateCA("test CA", Options{Lifetime: 96 * time.Hour, Now: issued})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseAuthority(caPair.CertPEM, caPair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(lifetime time.Duration) {
		p, err := CreateNode(ca, "us", 1, []string{"127.0.0.1"}, Options{Lifetime: lifetime, Now: issued})
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteCACopy(filepath.Join(dir, CACertFile), ca.CertPEM, true); err != nil {
			t.Fatal(err)
		}
		if err := WritePair(filepath.Join(dir, NodeCertFile), filepath.Join(dir, NodeKeyFile), p, true); err != nil {
			t.Fatal(err)
		}
	}
	write(48 * time.Hour)
	now := issued.Add(time.Hour) // the clock the files are judged by
	f, err := OpenFiles(FilesConfig{CAFile: filepath.Join(dir, CACertFile), CertFile: filepath.Join(dir, NodeCertFile),
		KeyFile: filepath.Join(dir, NodeKeyFile), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	r := sdkmetric.NewManualReader()
	if err := f.RegisterMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))); err != nil {
		t.Fatal(err)
	}
	check := func(leaf, caLeft time.Duration) {
		t.Helper()
		got := expiryGauge(t, r)
		for which, want := range map[string]time.Duration{"leaf": leaf, "ca": caLeft} {
			if v, ok := got[which]; !ok || math.Abs(v-want.Seconds()) > 1 {
				t.Errorf("%s: %v s left (reported: %v), want %v s", which, v, ok, want.Seconds())
			}
		}
	}
	check(47*time.Hour, 95*time.Hour)
	write(12 * time.Hour)
	if changed, err := f.Reload(); err != nil || !changed {
		t.Fatalf("reload: changed %v, %v", changed, err)
	}
	now = issued.Add(2 * time.Hour)
	check(10*time.Hour, 94*time.Hour)
}
