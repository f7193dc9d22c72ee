package client

import (
	"fmt"
	"time"

	"github.com/geolog/geolog/client/e2e"
)

// SealWith turns on end-to-end encryption for a producer, overriding the
// default of records sent as given: every record's value, and its headers
// named in sealedHeaders, are sealed (package e2e) under the current key
// keys gives the record's conversation (its stream and key) before the
// record counts against any bound, so servers store and replicate only
// ciphertext. The key and the other headers stay in clear, authenticated.
// A record that cannot be sealed (no current key, a header named
// e2e.HeaderName) fails at once with an *e2e.Error. Results and callbacks
// carry the record as given, not its sealed form.
func SealWith(keys e2e.KeyProvider, sealedHeaders ...string) ProducerOpt {
	return func(c *producerConfig) {
		c.sealKeys, c.sealHeaders, c.seal = keys, sealedHeaders, true
	}
}

// ConsumerOpt configures how Read and Subscribe return records.
type ConsumerOpt func(*consumerConfig)

type consumerConfig struct {
	open     bool
	openKeys e2e.KeyProvider
	report   func(StoredRecord, error)
}

// OpenWith opens records sealed by SealWith with keys from keys,
// overriding the default of records returned as stored. A record that
// does not open (unsealed, unknown key id, wrong key, tampered or moved,
// malformed) is never returned as it is: by default Read fails with, and
// Subscribe ends after yielding, an *OpenError; SkipUnopenable makes them
// skip it instead.
func OpenWith(keys e2e.KeyProvider) ConsumerOpt {
	return func(c *consumerConfig) { c.open, c.openKeys = true, keys }
}

// SkipUnopenable makes a consumer with OpenWith skip records that do not
// open and call report with each (as stored) and its *OpenError, on the
// reading goroutine, before going on; report must not block. The default
// fails the read instead.
func SkipUnopenable(report func(rec StoredRecord, err error)) ConsumerOpt {
	return func(c *consumerConfig) { c.report = report }
}

// OpenError is why a consumer could not open a record (see OpenWith).
// errors.Is(err, e2e.ErrTampered) and the other e2e sentinels tell why.
type OpenError struct {
	Stream string
	Range  uint32
	Offset uint64
	Err    error
}

func (e *OpenError) Error() string {
	return fmt.Sprintf("open %s/%d offset %d: %v", e.Stream, e.Range, e.Offset, e.Err)
}

func (e *OpenError) Unwrap() error { return e.Err }

// opener opens records for one Read or Subscribe; nil when OpenWith is
// off.
type opener struct {
	o      *e2e.Opener
	stream string
	report func(StoredRecord, error)
}

// newOpener validates opts. It returns a nil opener without OpenWith.
func newOpener(stream string, opts []ConsumerOpt) (*opener, error) {
	var cfg consumerConfig
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case !cfg.open && cfg.report != nil:
		return nil, fmt.Errorf("client: SkipUnopenable without OpenWith")
	case !cfg.open:
		return nil, nil
	}
	o, err := e2e.NewOpener(cfg.openKeys)
	if err != nil {
		return nil, fmt.Errorf("client: OpenWith: %w", err)
	}
	return &opener{o: o, stream: stream, report: cfg.report}, nil
}

// open returns rec opened. ok is false when rec is to be skipped (it was
// reported); err is set when the read must fail.
func (op *opener) open(rec StoredRecord) (opened StoredRecord, ok bool, err error) {
	if op == nil || rec.Tombstone {
		return rec, true, nil
	}
	out, oerr := op.o.Open(&e2e.Record{Stream: op.stream, Key: rec.Key, Headers: toE2EHeaders(rec.Headers),
		Value: rec.Value, ProducerTimeUnixNanos: unixNanos(rec.ProducerTime)})
	if oerr != nil {
		oe := &OpenError{Stream: op.stream, Range: rec.Range, Offset: rec.Offset, Err: oerr}
		if op.report == nil {
			return StoredRecord{}, false, oe
		}
		op.report(rec, oe)
		return StoredRecord{}, false, nil
	}
	rec.Value, rec.Headers = out.Value, fromE2EHeaders(out.Headers)
	return rec, true, nil
}

// seal returns the record to send for rec.
func (p *Producer) seal(rec *Record) (*Record, error) {
	out, err := p.sealer.Seal(&e2e.Record{Stream: p.stream, Key: rec.Key, Headers: toE2EHeaders(rec.Headers),
		Value: rec.Value, ProducerTimeUnixNanos: unixNanos(rec.ProducerTime)})
	if err != nil {
		return nil, err
	}
	return &Record{Key: rec.Key, Value: out.Value, Headers: fromE2EHeaders(out.Headers), ProducerTime: rec.ProducerTime}, nil
}

// unixNanos is t as the wire carries it: 0 for the zero time.
func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func toE2EHeaders(hs []Header) []e2e.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]e2e.Header, len(hs))
	for i, h := range hs {
		out[i] = e2e.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

func fromE2EHeaders(hs []e2e.Header) []Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]Header, len(hs))
	for i, h := range hs {
		out[i] = Header{Key: h.Key, Value: h.Value}
	}
	return out
}
