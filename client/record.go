package client

import (
	"time"

	logbatch "github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Header is one record header; keys need not be unique.
type Header struct {
	Key   string
	Value []byte
}

// Record is what a producer appends. The producer owns a Record passed to
// Produce until its callback runs; the caller must not modify it before.
type Record struct {
	// Key selects the range (keyspace.RangeForKey); nil or empty means a
	// sticky range chosen by the producer.
	Key []byte
	// Value is opaque bytes.
	Value   []byte
	Headers []Header
	// ProducerTime is the producer's timestamp; Produce sets it to the
	// current time when it is zero.
	ProducerTime time.Time
	// Tombstone marks a deletion of Key (Value must be empty): in a
	// compacted stream, compaction removes the key's older records and,
	// after the stream's delete retention, the tombstone itself.
	Tombstone bool
}

// recordOverheadBytes approximates the per-record framing (tags, lengths,
// timestamp) of the wire and batch formats, so that batch and buffer sizes
// count what the record really costs.
const recordOverheadBytes = 24

// sizeBytes is the number of bytes r counts for against batch and buffer
// bounds.
func (r *Record) sizeBytes() int {
	n := len(r.Key) + len(r.Value) + recordOverheadBytes
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 4
	}
	return n
}

func (r *Record) toProto() *geologv1.Record {
	pr := &geologv1.Record{Key: r.Key, Value: r.Value, Tombstone: r.Tombstone}
	if !r.ProducerTime.IsZero() {
		pr.ProducerTimeUnixNanos = r.ProducerTime.UnixNano()
	}
	if len(r.Headers) > 0 {
		pr.Headers = make([]*geologv1.Header, len(r.Headers))
		for i, h := range r.Headers {
			pr.Headers[i] = &geologv1.Header{Key: h.Key, Value: h.Value}
		}
	}
	return pr
}

// toBatch returns r as a record of a produced frame (AppendRequest.batch);
// its key, value and header values alias r's.
func (r *Record) toBatch() logbatch.Record {
	br := logbatch.Record{Key: r.Key, Value: r.Value, Tombstone: r.Tombstone}
	if !r.ProducerTime.IsZero() {
		br.ProducerTimeUnixNanos = r.ProducerTime.UnixNano()
	}
	if len(r.Headers) > 0 {
		br.Headers = make([]logbatch.RecordHeader, len(r.Headers))
		for i, h := range r.Headers {
			br.Headers[i] = logbatch.RecordHeader{Key: h.Key, Value: h.Value}
		}
	}
	return br
}

// ProduceResult is where an acknowledged record landed.
type ProduceResult struct {
	Record *Record
	Range  uint32
	Offset uint64
	// Epoch is the homing epoch the record was appended under.
	Epoch      uint64
	AppendTime time.Time
	// Duplicate is true when the server had already appended the record's
	// batch (a retry after a lost ack); the offset is the original one.
	Duplicate bool
	// Timing is where the record's time went, with WithTiming; nil
	// otherwise.
	Timing *Timing
}

// Timing is where a produced record's time went (WithTiming). The
// producer's side: Waited, from Produce to its batch's last send (the
// producer's queue, and the attempts before that send if any), and
// RoundTrip, from that send to the reply. The range leader's side, each
// stage from the end of the one before (zero for a duplicate, which the
// leader answered from its table): Admission (validated, admitted,
// encoded), Queue (the range's queue), LeaderWrite (the proposal to the
// leader's log write and fdatasync), Quorum (what the followers' writes
// and the network to them added beyond it), Ack (the commit to the reply).
type Timing struct {
	Waited, RoundTrip                          time.Duration
	Attempts                                   int
	Admission, Queue, LeaderWrite, Quorum, Ack time.Duration
}

// Leader is the leader's stages in all.
func (t *Timing) Leader() time.Duration {
	return t.Admission + t.Queue + t.LeaderWrite + t.Quorum + t.Ack
}

// Network is the round trip less the leader's stages: the network and
// gRPC both ways (never below 0).
func (t *Timing) Network() time.Duration { return max(t.RoundTrip-t.Leader(), 0) }

// StoredRecord is a record as read back.
type StoredRecord struct {
	Range        uint32
	Offset       uint64
	Key          []byte
	Value        []byte
	Headers      []Header
	ProducerTime time.Time // zero when the producer set none
	AppendTime   time.Time
	Epoch        uint64
	// Tombstone: a deletion of Key, without a value.
	Tombstone bool
}

func storedFromProto(rng uint32, r *geologv1.StoredRecord) StoredRecord {
	s := StoredRecord{
		Range:     rng,
		Offset:    r.GetOffset(),
		Key:       r.GetKey(),
		Value:     r.GetValue(),
		Epoch:     r.GetEpoch(),
		Tombstone: r.GetTombstone(),
	}
	if ns := r.GetProducerTimeUnixNanos(); ns != 0 {
		s.ProducerTime = time.Unix(0, ns)
	}
	if ns := r.GetAppendTimeUnixNanos(); ns != 0 {
		s.AppendTime = time.Unix(0, ns)
	}
	if hs := r.GetHeaders(); len(hs) > 0 {
		s.Headers = make([]Header, len(hs))
		for i, h := range hs {
			s.Headers[i] = Header{Key: h.GetKey(), Value: h.GetValue()}
		}
	}
	return s
}
