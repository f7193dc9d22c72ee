package regionsvc

import (
	"context"

	"github.com/geolog/geolog/apierr"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
)

// Tracing (docs/operations.md "Traces"). The gRPC boundary makes one span
// per call (otelgrpc, W3C trace context in the request metadata); inside
// the node an append adds
//
//	geolog.append        the node's part: admission to the reply
//	  geolog.raft.commit proposal to the Raft commit (or, in a region of
//	                     one, the write to its fsync)
//	  geolog.append.ack  the lease check at the ack and the reply
//
// and a mirror's apply of a shipment from the home region
// (geolog.replicator.apply), the home's shipment of one from its read to
// the mirror's answer (geolog.replicator.ship, made by the replicator
// task: TaskConfig.TracerProvider), and a rehome the node coordinates
// (geolog.rehome) add theirs. With no
// TracerProvider configured (Config.TracerProvider nil or a no-op) none of
// this runs: appendOp.trace stays nil and every hook returns at once.

const tracerName = "github.com/geolog/geolog/regionsvc"

// tracePropagator is how trace context crosses every gRPC call the node
// serves or makes: W3C traceparent/tracestate.
var tracePropagator = propagation.TraceContext{}

// tracingOn reports whether spans are recorded anywhere.
func (n *Node) tracingOn() bool {
	_, off := n.cfg.TracerProvider.(tracenoop.TracerProvider)
	return !off
}

func (n *Node) tracer() trace.Tracer { return n.cfg.TracerProvider.Tracer(tracerName) }

// appendTrace follows one append through a range driver. A nil
// *appendTrace is tracing off: every method does nothing.
type appendTrace struct {
	tracer trace.Tracer
	ctx    context.Context // the geolog.append span's
	span   trace.Span
	commit trace.Span
	ack    trace.Span
}

// startAppendTrace opens geolog.append for req's stream and range. A
// request on an AppendStream starts a trace of its own, linked to the
// stream's span: the stream may live for hours, and its span ends only
// with it.
func (n *Node) startAppendTrace(ctx context.Context, stream string, rng uint32, records int, streamed bool) *appendTrace {
	if !n.tracingOn() {
		return nil
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.String("geolog.stream", stream),
		attribute.Int("geolog.range", int(rng)), attribute.Int("geolog.records", records))}
	if streamed {
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.LinkFromContext(ctx)))
	}
	t := &appendTrace{tracer: n.tracer()}
	t.ctx, t.span = t.tracer.Start(ctx, "geolog.append", opts...)
	return t
}

// proposed opens geolog.raft.commit (the driver took the append).
func (t *appendTrace) proposed() {
	if t == nil {
		return
	}
	_, t.commit = t.tracer.Start(t.ctx, "geolog.raft.commit")
}

// committed ends geolog.raft.commit with the batch's place, or its error,
// and opens geolog.append.ack.
func (t *appendTrace) committed(baseOffset, epoch uint64, err error) {
	if t == nil || t.commit == nil {
		return
	}
	if err != nil {
		spanError(t.commit, err)
	} else {
		t.commit.SetAttributes(attribute.Int64("geolog.base_offset", int64(baseOffset)), attribute.Int64("geolog.epoch", int64(epoch)))
	}
	t.commit.End()
	if err == nil {
		_, t.ack = t.tracer.Start(t.ctx, "geolog.append.ack")
	}
}

// stages sets the append's time per stage (stages.go) on geolog.append,
// in microseconds.
func (t *appendTrace) stages(s appendStages) {
	if t == nil {
		return
	}
	t.span.SetAttributes(
		attribute.Int64("geolog.stage.admission_us", s.admission.Microseconds()),
		attribute.Int64("geolog.stage.queue_us", s.queue.Microseconds()),
		attribute.Int64("geolog.stage.leader_write_us", s.leaderWrite.Microseconds()),
		attribute.Int64("geolog.stage.quorum_us", s.quorum.Microseconds()),
		attribute.Int64("geolog.stage.ack_us", s.ack.Microseconds()))
}

// answered ends geolog.append.ack (if open) and geolog.append with r.
func (t *appendTrace) answered(r appendResult) {
	if t == nil {
		return
	}
	if t.commit == nil && r.err == nil {
		// Answered without a proposal: a duplicate of a durable batch.
		t.span.AddEvent("duplicate")
	}
	for _, s := range []trace.Span{t.ack, t.span} {
		if s == nil {
			continue
		}
		if r.err != nil {
			spanError(s, r.err)
		} else {
			s.SetAttributes(attribute.Int64("geolog.base_offset", int64(r.baseOffset)), attribute.Int64("geolog.epoch", int64(r.epoch)),
				attribute.Bool("geolog.duplicate", r.duplicate))
		}
		s.End()
	}
}

// spanError marks s failed with err's API code and, for a redirect
// (NOT_LEADER, NOT_HOME), the address the client is sent to.
func spanError(s trace.Span, err error) {
	e := apierr.As(err)
	s.SetStatus(codes.Error, e.Message)
	s.SetAttributes(attribute.String("geolog.error_code", errorCodeName(err)))
	if e.LeaderHint != "" {
		s.SetAttributes(attribute.String("geolog.leader_hint", e.LeaderHint))
	}
}

// startSpan opens a span named name under ctx's, or returns ctx and a
// no-op span when tracing is off.
func (n *Node) startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !n.tracingOn() {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return n.tracer().Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends s, failed with err if it is not nil.
func endSpan(s trace.Span, err error) {
	if err != nil {
		spanError(s, err)
	}
	s.End()
}

// shipmentSpan opens geolog.replicator.read or .apply for one shipment of
// a range: a trace of its own (the replication stream it rides on lives as
// long as the home's leadership), linked to ctx's span if any.
func (n *Node) shipmentSpan(ctx context.Context, name string, d *rangeDriver, from uint64, bytes int) trace.Span {
	if !n.tracingOn() {
		return nil
	}
	_, s := n.tracer().Start(ctx, name, trace.WithNewRoot(), trace.WithLinks(trace.LinkFromContext(ctx)),
		trace.WithAttributes(attribute.String("geolog.stream", d.cfg.stream), attribute.Int("geolog.range", int(d.cfg.rangeID)),
			attribute.Int64("geolog.from_offset", int64(from)), attribute.Int("geolog.bytes", bytes)))
	return s
}

// peerTracing is what the node's connections to other nodes add
// (peerDialConfig): with tracing on, the client side of otelgrpc, so that
// a forwarded call continues its caller's trace; nothing otherwise.
func (n *Node) peerTracing() []grpc.DialOption {
	if !n.tracingOn() {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(n.cfg.TracerProvider),
		otelgrpc.WithMeterProvider(n.cfg.MeterProvider),
		otelgrpc.WithPropagators(tracePropagator)))}
}

// shipTracer is the replicator tasks' TracerProvider: nil with tracing
// off, so that they make no span at all.
func (n *Node) shipTracer() trace.TracerProvider {
	if !n.tracingOn() {
		return nil
	}
	return n.cfg.TracerProvider
}
