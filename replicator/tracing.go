package replicator

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// shipSpansMax bounds the shipment spans a task keeps open: past it the
// oldest is ended as "untracked" (the window allows at most
// WindowRequestsMax in flight, so this is a guard, not a limit reached).
const shipSpansMax = 1024

// shipSpans follows a task's shipments in spans, one
// geolog.replicator.ship per batch, from its read to the mirror's answer
// that its applied end covers it. Owned by Run's goroutine. A nil
// *shipSpans is tracing off: every method does nothing.
type shipSpans struct {
	tracer   trace.Tracer
	attrs    []attribute.KeyValue
	inflight []shipSpan
}

type shipSpan struct {
	end  uint64
	span trace.Span
}

func newShipSpans(cfg TaskConfig) *shipSpans {
	if cfg.TracerProvider == nil {
		return nil
	}
	return &shipSpans{tracer: cfg.TracerProvider.Tracer("github.com/geolog/geolog/replicator"),
		attrs: []attribute.KeyValue{attribute.String("geolog.stream", cfg.Stream), attribute.Int("geolog.range", int(cfg.Range)),
			attribute.String("geolog.region", cfg.DestinationRegion), attribute.Int64("geolog.epoch", int64(cfg.Epoch))}}
}

// sent opens the span of a batch of [first, end) of frameBytes.
func (s *shipSpans) sent(first, end uint64, frameBytes int) {
	if s == nil {
		return
	}
	if len(s.inflight) >= shipSpansMax {
		s.inflight[0].span.SetStatus(codes.Error, "untracked: too many shipments in flight")
		s.inflight[0].span.End()
		s.inflight = s.inflight[1:]
	}
	_, span := s.tracer.Start(context.Background(), "geolog.replicator.ship", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(s.attrs...), trace.WithAttributes(attribute.Int64("geolog.from_offset", int64(first)),
			attribute.Int64("geolog.end_offset", int64(end)), attribute.Int("geolog.bytes", frameBytes)))
	s.inflight = append(s.inflight, shipSpan{end: end, span: span})
}

// applied ends the spans of the batches the mirror's applied end covers.
func (s *shipSpans) applied(appliedEnd uint64) {
	if s == nil {
		return
	}
	i := 0
	for ; i < len(s.inflight) && s.inflight[i].end <= appliedEnd; i++ {
		s.inflight[i].span.End()
	}
	s.inflight = s.inflight[i:]
}

// failed ends every open span with err: the mirror refused, or the stream
// ended, and the cursor resends what it still needs.
func (s *shipSpans) failed(err error) {
	if s == nil {
		return
	}
	for _, sp := range s.inflight {
		msg := "stream ended"
		if err != nil {
			msg = err.Error()
		}
		sp.span.SetStatus(codes.Error, msg)
		sp.span.End()
	}
	s.inflight = nil
}
