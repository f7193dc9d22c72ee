package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/geolog/geolog/client"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// appendStreamCodes returns the gRPC status codes the node's metrics hold
// for AppendStream calls, with their counts.
func appendStreamCodes(t *testing.T, reader *sdkmetric.ManualReader) map[string]uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	codes := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			for _, p := range h.DataPoints {
				method, _ := p.Attributes.Value("rpc.method")
				if method.AsString() != "AppendStream" && method.AsString() != "geolog.v1.Log/AppendStream" {
					continue
				}
				for _, name := range []string{"rpc.grpc.status_code", "rpc.response.status_code"} {
					if v, ok := p.Attributes.Value(attribute.Key(name)); ok {
						codes[m.Name+" "+v.Emit()] += p.Count
					}
				}
			}
		}
	}
	return codes
}

// codeIs reports whether the metric key k ("name code") ends in one of the
// spellings of a status code.
func codeIs(k string, spellings ...string) bool {
	i := strings.LastIndexByte(k, ' ')
	for _, sp := range spellings {
		if strings.EqualFold(k[i+1:], sp) {
			return true
		}
	}
	return false
}

// TestAppendStreamStatusInMetrics: a producer that closes cleanly ends its
// append streams as successes, and a client that cancels one is counted as
// CANCELED, never INTERNAL (every successful AppendStream used to be counted
// INTERNAL, so an error-rate alert fired on healthy traffic).
func TestAppendStreamStatusInMetrics(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	n, raw := testNode(t, t.TempDir(), func(cfg *Config) { cfg.MeterProvider = mp })
	createStream(t, raw, "m", 2)
	ctx := ctxT(t)

	c, err := client.New(n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.NewProducer("m")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		p.Produce(ctx, &client.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close()
	codes := appendStreamCodes(t, reader)
	var ok, other uint64
	for k, v := range codes {
		if codeIs(k, "0", "OK") {
			ok += v
		} else {
			other += v
		}
	}
	if ok == 0 || other != 0 {
		t.Fatalf("AppendStream codes after a clean close %v: want every stream OK", codes)
	}

	// A stream the client cancels: CANCELED (1), not INTERNAL (13).
	sctx, cancel := context.WithCancel(ctx)
	s, err := raw.AppendStream(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&geologv1.AppendRequest{Stream: "m", Range: 0, Records: recs("a", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := ctxT(t)
	for {
		codes = appendStreamCodes(t, reader)
		var cancelled, internal uint64
		for k, v := range codes {
			switch {
			case codeIs(k, "1", "CANCELED", "CANCELLED"):
				cancelled += v
			case codeIs(k, "13", "INTERNAL"):
				internal += v
			}
		}
		if internal != 0 {
			t.Fatalf("a cancelled AppendStream was counted INTERNAL: %v", codes)
		}
		if cancelled > 0 {
			return
		}
		if deadline.Err() != nil {
			t.Fatalf("the cancelled stream was never counted: %v", codes)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSecondNodeOnDataDirRefused: a second node on a data directory in use
// fails in New with an error that says so (it used to log "directory is
// locked" for each range and serve anyway), and the directory is free again
// once the first node closes.
func TestSecondNodeOnDataDirRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, raw := testNode(t, dir, nil)
	createStream(t, raw, "s", 2)
	_, err := New(Config{DataDir: dir, ListenAddr: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "in use by another geologd") {
		t.Fatalf("second node on %s: %v; want a refusal naming the directory in use", dir, err)
	}
	first.Close()
	again, err := New(Config{DataDir: dir, ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("after the first node closed: %v", err)
	}
	again.Close()
}
