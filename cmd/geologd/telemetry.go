package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"github.com/geolog/geolog/internal/version"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The node's resource attributes (docs/operations.md "Metrics"): who
// is speaking, on every series and span.
const (
	attrRegion = "geolog.region"
	attrNodeID = "geolog.node_id"
)

// nodeResource is the OpenTelemetry resource of a node: service.name
// geologd, service.version the build's, service.instance.id
// "<region>/<node id>", and geolog.region and geolog.node_id, over
// OTEL_RESOURCE_ATTRIBUTES (which cannot override these).
func nodeResource(region string, nodeID uint64) (*resource.Resource, error) {
	return resource.New(context.Background(),
		resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", "geologd"),
			attribute.String("service.version", version.Get().Version),
			attribute.String("service.instance.id", fmt.Sprintf("%s/%d", region, nodeID)),
			attribute.String(attrRegion, region),
			attribute.String(attrNodeID, strconv.FormatUint(nodeID, 10)),
		))
}

// newMetrics makes the node's meter provider and the /metrics handler
// over a registry of its own (the Go runtime's and the process's
// collectors, and the node's instruments through the OpenTelemetry
// exporter).
//
// Prometheus conventions: no otel_scope_* labels (every instrument is
// geolog's own; the scope adds nothing to select by); geolog_region and
// geolog_node_id as labels on every series, because they are what alerts
// and dashboards group by, and a join for each would make every rule
// longer; and the whole resource (service_name, service_version, ...) on
// target_info, which the OpenTelemetry specification has the exporter
// give and Prometheus users join on instance when they need it.
func newMetrics(res *resource.Resource) (*sdkmetric.MeterProvider, *prometheus.Registry, http.Handler, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, nil, nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, nil, err
	}
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(),
		otelprom.WithResourceAsConstantLabels(attribute.NewAllowKeysFilter(attrRegion, attrNodeID)))
	if err != nil {
		return nil, nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	return mp, reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// otlpEnv are the variables that name an OTLP trace endpoint when
// --otlp-endpoint does not.
var otlpEnv = []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"}

// errTracingOff says no endpoint is configured.
var errTracingOff = errors.New("tracing off")

// newTracing makes the tracer provider exporting spans over OTLP/gRPC to
// endpoint (a URL: http:// for plaintext, https:// for TLS), or, when it
// is empty, to what the standard OTEL_EXPORTER_OTLP_* variables say; with
// neither it returns errTracingOff (the node then records no span at all).
// Sampling follows OTEL_TRACES_SAMPLER (default: parent-based, always on).
func newTracing(endpoint string, res *resource.Resource) (*sdktrace.TracerProvider, error) {
	var opts []otlptracegrpc.Option
	if endpoint != "" {
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--otlp-endpoint %q: want a URL such as http://127.0.0.1:4317 (plaintext) or https://collector:4317", endpoint)
		}
		opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
	} else {
		set := false
		for _, k := range otlpEnv {
			set = set || os.Getenv(k) != ""
		}
		if !set {
			return nil, errTracingOff
		}
	}
	// New does not connect: an unreachable collector costs dropped spans
	// (and the exporter's log lines), never the node's start.
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
