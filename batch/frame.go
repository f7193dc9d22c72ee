package batch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

const (
	// HeaderSize is the size in bytes of the fixed frame header.
	HeaderSize = 88
	// FrameBytesMax bounds the size of one frame, header included. A length
	// field announcing a larger frame marks the frame as corrupt, and Encode
	// panics rather than produce one.
	FrameBytesMax = 64 << 20

	// version is the only frame version this package reads and writes.
	version = 1

	// Byte positions of the header fields.
	posLength       = 0
	posCRC          = 4
	posVersion      = 8
	posType         = 9
	posFlags        = 10
	posRecordCount  = 12
	posBaseOffset   = 16
	posEpoch        = 24
	posTerm         = 32
	posIndex        = 40
	posAppendTime   = 48
	posHLC          = 56
	posProducerID   = 64
	posBaseSequence = 72
	posReserved     = 80

	// crcStart is the first byte covered by the CRC.
	crcStart = posVersion

	// recordBytesMin is the smallest encoded record: bodyLen, producer time,
	// keyLen, valueLen and headerCount, one byte each.
	recordBytesMin = 5
	// recordHeaderBytesMin is the smallest encoded record header: kLen, vLen.
	recordHeaderBytesMin = 2
)

// Type says what a batch carries.
type Type uint8

const (
	// TypeData is a batch of producer records.
	TypeData Type = 0
	// TypeNoop is a leader no-op or marker batch.
	TypeNoop Type = 1
	// TypeConfig is a configuration batch.
	TypeConfig Type = 2
	// TypeFork is a fork marker: a control frame (never with records) that
	// ends a divergent tail. Its payload starts with the Raft index of the
	// frame before it (see ForkPrevIndex), which lets its own Raft index
	// follow a gap: the entries of the divergent tail in between were moved
	// out of the log.
	TypeFork Type = 3
	// TypeCompact is a compaction marker: a home leader's decision to
	// compact its range by key below a point (see Compaction). It holds
	// exactly one record, which takes one offset like any record and is
	// shipped to mirrors like any frame, but belongs to no producer and is
	// never shown to readers: its offset reads as a hole. EncodeCompaction
	// builds one and DecodeCompaction returns its decision.
	TypeCompact Type = 4
	// TypeMark is a commit mark: a control frame (never with records, never
	// with a Raft index) that a replica appends to its own log to record
	// durably, with the log writer's fsync, how far the log is committed
	// (see EncodeMark). It is the log's own bookkeeping: segment readers
	// skip it, and it is never replicated, shipped or shown.
	TypeMark Type = 5
	// TypeSplit is a split marker: a range's home leader's decision to
	// split the range in two at a hash boundary (see Split). Like a
	// compaction marker it holds exactly one record, takes one offset
	// (the range's split offset: nothing follows it in the range's log)
	// and is shipped to mirrors, and readers never see it.
	// EncodeSplit builds one and DecodeSplit returns its decision.
	TypeSplit Type = 6

	typeMax = TypeSplit
)

// isMarker reports whether frames of type t are markers: one record of
// no producer, without key or headers, whose value is a decision.
func (t Type) isMarker() bool { return t == TypeCompact || t == TypeSplit }

// Frame flags (the Flags header field). Encode derives them from the
// header and records; decoders reject unknown bits and flags that do not
// match the frame. The low byte stays free for compression codecs.
const (
	// FlagCompacted marks a frame that compaction by key rewrote: its
	// records are a subset of the OffsetSpan offsets from BaseOffset, each
	// record carries its offset delta, and the header's reserved field
	// holds OffsetSpan. Only data frames carry it.
	FlagCompacted uint16 = 1 << 8
	// FlagTombstones marks a data frame holding at least one tombstone:
	// every record of it carries an attributes byte.
	FlagTombstones uint16 = 1 << 9

	flagsKnown = FlagCompacted | FlagTombstones
)

// String returns the lowercase name of t.
func (t Type) String() string {
	switch t {
	case TypeData:
		return "data"
	case TypeNoop:
		return "noop"
	case TypeConfig:
		return "config"
	case TypeFork:
		return "fork"
	case TypeCompact:
		return "compact"
	case TypeMark:
		return "mark"
	case TypeSplit:
		return "split"
	default:
		return fmt.Sprintf("type(%d)", uint8(t))
	}
}

// Header is the decoded fixed header of a frame. Length, CRC, Version and the
// reserved field are not part of it: the codec owns them. Flags is as
// decoded; Encode derives it (see FlagCompacted, FlagTombstones).
type Header struct {
	Type  Type
	Flags uint16
	// RecordCount is the number of records the frame holds.
	RecordCount         uint32
	BaseOffset          uint64
	Epoch               uint64
	Term                uint64
	Index               uint64
	AppendTimeUnixNanos int64
	HLC                 uint64
	ProducerID          uint64
	BaseSequence        uint64
	// OffsetSpan is, for a frame compaction rewrote (FlagCompacted), how
	// many offsets the frame spans: those of the batch as appended, of
	// which RecordCount remain. 0 for every other frame, which spans
	// RecordCount offsets.
	OffsetSpan uint32
}

// NextOffset returns the offset just past the batch's offsets: BaseOffset
// + OffsetSpan for a compacted frame, else BaseOffset + RecordCount.
func (h Header) NextOffset() uint64 { return h.BaseOffset + uint64(h.Span()) }

// Span returns how many offsets the frame spans (see OffsetSpan).
func (h Header) Span() uint32 {
	if h.OffsetSpan != 0 {
		return h.OffsetSpan
	}
	return h.RecordCount
}

// Compacted reports whether compaction by key rewrote the frame: its
// records may leave holes among its offsets, and in a log it may start
// past the previous frame's NextOffset (the frames in between were
// compacted away).
func (h Header) Compacted() bool { return h.OffsetSpan != 0 }

// Offset returns the offset of record r of this frame, as Decode returned
// it: BaseOffset + r.OffsetDelta.
func (h Header) Offset(r *Record) uint64 { return h.BaseOffset + uint64(r.OffsetDelta) }

// IsControl reports whether h is the header of a control frame: a TypeNoop
// or TypeConfig frame without records, whose body is an opaque payload (see
// EncodeControl).
func (h Header) IsControl() bool { return h.RecordCount == 0 && h.Type != TypeData }

// ErrShort reports that a buffer holds fewer bytes than the frame in it needs:
// the frame is torn or was truncated.
var ErrShort = errors.New("batch: frame is short")

// ErrCorrupt reports a frame that can never become valid: bad CRC, unknown
// version, type or flags, impossible lengths or malformed records.
var ErrCorrupt = errors.New("batch: frame is corrupt")

// ErrNotControl reports a frame given to DecodeControl that holds records
// or is a data frame.
var ErrNotControl = errors.New("batch: not a control frame")

// The decoders' failures are static values so that scanning garbage byte by
// byte (as segment recovery does) costs no allocation per position.
var (
	errShortLength  = fmt.Errorf("%w: fewer than 4 bytes for the length field", ErrShort)
	errShortHeader  = fmt.Errorf("%w: fewer bytes than the header", ErrShort)
	errShortFrame   = fmt.Errorf("%w: fewer bytes than the length field announces", ErrShort)
	errLengthSmall  = fmt.Errorf("%w: length field smaller than the header", ErrCorrupt)
	errLengthLarge  = fmt.Errorf("%w: length field larger than FrameBytesMax", ErrCorrupt)
	errVersion      = fmt.Errorf("%w: unknown version", ErrCorrupt)
	errType         = fmt.Errorf("%w: unknown type", ErrCorrupt)
	errForkRecords  = fmt.Errorf("%w: fork frame holds records", ErrCorrupt)
	errMarkFields   = fmt.Errorf("%w: commit mark frame holds records, a raft term or index, or a producer field", ErrCorrupt)
	errFlags        = fmt.Errorf("%w: unknown flags", ErrCorrupt)
	errFlagsType    = fmt.Errorf("%w: flags on a frame that is not a data frame", ErrCorrupt)
	errReserved     = fmt.Errorf("%w: reserved field is not zero", ErrCorrupt)
	errSpan         = fmt.Errorf("%w: compacted frame spans fewer offsets than it holds records", ErrCorrupt)
	errCompact      = fmt.Errorf("%w: marker is not one record of no producer", ErrCorrupt)
	errDelta        = fmt.Errorf("%w: record offset delta out of order or past the span", ErrCorrupt)
	errAttributes   = fmt.Errorf("%w: unknown record attributes", ErrCorrupt)
	errTombstone    = fmt.Errorf("%w: tombstone with a value", ErrCorrupt)
	errNoTombstone  = fmt.Errorf("%w: tombstones flag without a tombstone", ErrCorrupt)
	errMarker       = fmt.Errorf("%w: malformed marker record", ErrCorrupt)
	errRecordCount  = fmt.Errorf("%w: record count exceeds what the frame can hold", ErrCorrupt)
	errOffsetWrap   = fmt.Errorf("%w: base offset plus record count overflows", ErrCorrupt)
	errCRC          = fmt.Errorf("%w: crc mismatch", ErrCorrupt)
	errVarint       = fmt.Errorf("%w: malformed or non-minimal varint", ErrCorrupt)
	errFieldLength  = fmt.Errorf("%w: field length exceeds the record", ErrCorrupt)
	errHeaderCount  = fmt.Errorf("%w: header count exceeds the record", ErrCorrupt)
	errRecordTrail  = fmt.Errorf("%w: bytes left over inside a record", ErrCorrupt)
	errFrameTrail   = fmt.Errorf("%w: bytes left over after the last record", ErrCorrupt)
	errRecordLength = fmt.Errorf("%w: record length exceeds the frame", ErrCorrupt)
)

// castagnoli is the CRC32C table; it is read-only after initialisation.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// FrameSize returns the total size of the frame starting at b[0], read from
// its length field. It returns ErrShort if b holds fewer than 4 bytes and
// ErrCorrupt if the size is below HeaderSize or above FrameBytesMax. Only
// the length field is examined.
func FrameSize(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, errShortLength
	}
	length := binary.LittleEndian.Uint32(b[posLength:])
	if length < HeaderSize-4 {
		return 0, errLengthSmall
	}
	if length > FrameBytesMax-4 {
		return 0, errLengthLarge
	}
	return int(length) + 4, nil
}

// DecodeHeader parses the header of the frame at the start of frame and
// verifies the CRC of the whole frame. Bytes after the frame are ignored.
//
// Checks run cheapest first, and everything that can be judged from the
// header alone is judged before the frame's length is demanded: a header
// that is invalid in itself yields ErrCorrupt even when the frame is
// incomplete, and ErrShort means the header is plausible but the buffer ends
// before the frame does. The records are not parsed; Decode and Validate do
// that.
func DecodeHeader(frame []byte) (Header, error) {
	h, err := PeekHeader(frame)
	if err != nil {
		return Header{}, err
	}
	size := int(binary.LittleEndian.Uint32(frame[posLength:])) + 4
	if binary.LittleEndian.Uint32(frame[posCRC:]) != crc32.Checksum(frame[crcStart:size], castagnoli) {
		return Header{}, errCRC
	}
	return h, nil
}

// PeekHeader is DecodeHeader without the CRC: it parses and checks the
// header alone (and that frame holds the whole frame), so it costs nothing
// per byte of the body. For a caller that needs a frame's offsets before
// the frame is verified in full elsewhere (as a Raft follower does before
// it steps a leader's entries); the frame must still pass DecodeHeader or
// Validate before it is trusted.
func PeekHeader(frame []byte) (Header, error) {
	size, err := FrameSize(frame)
	if err != nil {
		return Header{}, err
	}
	if len(frame) < HeaderSize {
		return Header{}, errShortHeader
	}
	if frame[posVersion] != version {
		return Header{}, errVersion
	}
	h := Header{
		Type:                Type(frame[posType]),
		Flags:               binary.LittleEndian.Uint16(frame[posFlags:]),
		RecordCount:         binary.LittleEndian.Uint32(frame[posRecordCount:]),
		BaseOffset:          binary.LittleEndian.Uint64(frame[posBaseOffset:]),
		Epoch:               binary.LittleEndian.Uint64(frame[posEpoch:]),
		Term:                binary.LittleEndian.Uint64(frame[posTerm:]),
		Index:               binary.LittleEndian.Uint64(frame[posIndex:]),
		AppendTimeUnixNanos: int64(binary.LittleEndian.Uint64(frame[posAppendTime:])),
		HLC:                 binary.LittleEndian.Uint64(frame[posHLC:]),
		ProducerID:          binary.LittleEndian.Uint64(frame[posProducerID:]),
		BaseSequence:        binary.LittleEndian.Uint64(frame[posBaseSequence:]),
	}
	if h.Type > typeMax {
		return Header{}, errType
	}
	if h.Type == TypeFork && h.RecordCount != 0 {
		return Header{}, errForkRecords
	}
	if h.Type == TypeMark && (h.RecordCount != 0 || h.Index != 0 || h.Term != 0 || h.Epoch != 0 || h.HLC != 0 ||
		h.ProducerID != 0 || h.BaseSequence != 0) {
		return Header{}, errMarkFields
	}
	if err := checkFlags(&h, frame); err != nil {
		return Header{}, err
	}
	if uint64(h.RecordCount) > uint64(size-HeaderSize)/recordBytesMin {
		return Header{}, errRecordCount
	}
	if h.BaseOffset > math.MaxUint64-uint64(h.Span()) {
		return Header{}, errOffsetWrap
	}
	if len(frame) < size {
		return Header{}, errShortFrame
	}
	return h, nil
}

// checkFlags judges the flags and the reserved field of the header h read
// from frame, and sets h.OffsetSpan for a compacted frame.
func checkFlags(h *Header, frame []byte) error {
	le := binary.LittleEndian
	switch {
	case h.Flags&^flagsKnown != 0:
		return errFlags
	case h.Flags != 0 && h.Type != TypeData:
		return errFlagsType
	case h.Type.isMarker() && (h.RecordCount != 1 || h.ProducerID != 0 || h.BaseSequence != 0):
		return errCompact
	case h.Flags&FlagTombstones != 0 && h.RecordCount == 0:
		return errNoTombstone
	}
	if h.Flags&FlagCompacted == 0 {
		if le.Uint64(frame[posReserved:]) != 0 {
			return errReserved
		}
		return nil
	}
	if le.Uint32(frame[posReserved+4:]) != 0 {
		return errReserved
	}
	h.OffsetSpan = le.Uint32(frame[posReserved:])
	if h.OffsetSpan == 0 || h.OffsetSpan < h.RecordCount {
		return errSpan
	}
	return nil
}

// Validate does what DecodeHeader does and also checks the structure of
// every record, without allocating. A frame that passes Validate decodes
// without error. A control frame's payload is opaque: any bytes pass.
func Validate(frame []byte) (Header, error) {
	h, err := DecodeHeader(frame)
	if err != nil {
		return Header{}, err
	}
	if h.IsControl() {
		return h, nil
	}
	size := int(binary.LittleEndian.Uint32(frame[posLength:])) + 4
	if _, err := walkRecords(frame[HeaderSize:size], h, nil); err != nil {
		return Header{}, err
	}
	return h, nil
}

// Decode parses and verifies the whole frame at the start of frame. Bytes
// after the frame are ignored. Record keys, values and header values alias
// frame (with their capacity capped, so appending to them never writes into
// frame); header keys are copied into strings. Decode makes two
// allocations plus one per record header key, whatever RecordCount says.
//
// A control frame (Header.IsControl) decodes to no records; its payload is
// returned by DecodeControl.
func Decode(frame []byte) (Header, []Record, error) {
	h, recs, err := DecodeAppend(nil, frame)
	if len(recs) == 0 {
		recs = nil
	}
	return h, recs, err
}

// DecodeAppend is Decode appending the frame's records to dst (whose
// length it keeps): a reader that decodes frame after frame reuses one
// slice, dst[:0], instead of allocating one per frame. On an error dst is
// returned unchanged.
func DecodeAppend(dst []Record, frame []byte) (Header, []Record, error) {
	h, err := DecodeHeader(frame)
	if err != nil {
		return Header{}, dst, err
	}
	if h.IsControl() {
		return h, dst, nil
	}
	size := int(binary.LittleEndian.Uint32(frame[posLength:])) + 4
	body := frame[HeaderSize:size]
	// The first pass validates everything and counts record headers, so
	// both allocations below are bounded by bytes actually present.
	headerCount, err := walkRecords(body, h, nil)
	if err != nil {
		return Header{}, dst, err
	}
	if h.RecordCount == 0 {
		return h, dst, nil
	}
	n0, n := len(dst), int(h.RecordCount)
	if cap(dst)-n0 < n {
		grown := make([]Record, n0, n0+n) // one allocation (slices.Grow makes two under -race)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n0+n]
	recs := dst[n0:]
	clear(recs)
	var hdrs []RecordHeader
	if headerCount > 0 {
		hdrs = make([]RecordHeader, headerCount)
	}
	p, f := 0, newRecordFormat(h)
	for i := range recs {
		n, used, err := readRecord(body[p:], &f, &recs[i], hdrs)
		if err != nil {
			panic(fmt.Sprintf("batch: record %d failed the second pass after passing the first: %v", i, err))
		}
		p += n
		hdrs = hdrs[used:]
	}
	return h, dst, nil
}

// DecodeControl parses and verifies the control frame at the start of frame
// and returns its header and payload. The payload aliases frame with its
// capacity capped; an empty payload is nil. Bytes after the frame are
// ignored. A valid frame that is not a control frame returns ErrNotControl.
func DecodeControl(frame []byte) (Header, []byte, error) {
	h, err := DecodeHeader(frame)
	if err != nil {
		return Header{}, nil, err
	}
	if !h.IsControl() {
		return Header{}, nil, fmt.Errorf("%w: %v frame with %d records", ErrNotControl, h.Type, h.RecordCount)
	}
	size := int(binary.LittleEndian.Uint32(frame[posLength:])) + 4
	if size == HeaderSize {
		return h, nil, nil
	}
	return h, frame[HeaderSize:size:size], nil
}

// walkRecords checks that body holds exactly the h.RecordCount well-formed
// records h describes (offset deltas, attributes and a compaction marker's
// record included) and returns their total number of record headers. With
// visit set it shows visit each record once it is checked and stops at
// the first error visit returns.
func walkRecords(body []byte, h Header, visit func(i int, r RecordView) error) (int, error) {
	p, headers, f := 0, 0, newRecordFormat(h)
	for i := range h.RecordCount {
		n, used, err := readRecord(body[p:], &f, nil, nil)
		if err != nil {
			return 0, err
		}
		if visit != nil {
			v := RecordView{Key: f.key, HeaderCount: used, PayloadBytes: f.payloadBytes, Tombstone: f.tombstone}
			if err := visit(int(i), v); err != nil {
				return 0, err
			}
		}
		p += n
		headers += used
	}
	if p != len(body) {
		return 0, errFrameTrail
	}
	if f.attributes && f.tombstones == 0 {
		return 0, errNoTombstone
	}
	if h.Type.isMarker() && (headers != 0 || !validMarker(h.Type, body)) {
		return 0, errMarker
	}
	return headers, nil
}

// Encode appends one frame holding recs to dst and returns the extended
// slice. h.RecordCount is ignored and set from len(recs); Length, CRC,
// Version, the reserved field and the flags are computed (h.Flags is
// ignored but for unknown bits): a frame with h.OffsetSpan set is a
// compacted frame whose records carry their OffsetDelta, and a frame
// holding a tombstone carries attributes. Record.OffsetDelta is ignored in
// a frame that is not compacted. Encode grows dst at most once. With no
// records, no span and a type other than TypeData the frame is a control
// frame with an empty payload, the same as EncodeControl(dst, h, nil).
//
// Encode panics if h.Type is unknown, h.Type is TypeFork with records,
// h.Flags has an unknown bit, the frame would exceed FrameBytesMax,
// BaseOffset plus the span overflows, a compacted frame is not a data
// frame or its offset deltas do not increase within its span, a tombstone
// has a value, or a compaction marker is not one record of no producer:
// callers build their frames, so each is a broken invariant.
func Encode(dst []byte, h Header, recs []Record) []byte {
	h = encodeHeader(h, recs)
	f := newRecordFormat(h)
	size := HeaderSize
	for i := range recs {
		size += f.recordSize(&recs[i])
		if size > FrameBytesMax {
			panic(fmt.Sprintf("batch: encode of a frame larger than FrameBytesMax (%d bytes by record %d)", size, i))
		}
	}

	dst, out := grow(dst, size)
	putHeader(out, h)
	p := HeaderSize
	for i := range recs {
		p = f.putRecord(out, p, &recs[i])
	}
	if p != size {
		panic(fmt.Sprintf("batch: encoded %d bytes, sized %d", p, size))
	}
	binary.LittleEndian.PutUint32(out[posCRC:], crc32.Checksum(out[crcStart:], castagnoli))
	return dst
}

// encodeHeader checks h and recs for Encode (see its panics) and returns h
// with the record count and flags set.
func encodeHeader(h Header, recs []Record) Header {
	switch {
	case h.Type > typeMax:
		panic(fmt.Sprintf("batch: encode of unknown type %d", h.Type))
	case h.Type == TypeFork && len(recs) > 0:
		panic("batch: encode of a fork frame with records")
	case h.Flags&^flagsKnown != 0:
		panic(fmt.Sprintf("batch: encode with undefined flags %#x", h.Flags))
	case h.OffsetSpan != 0 && h.Type != TypeData:
		panic(fmt.Sprintf("batch: encode of a compacted %v frame", h.Type))
	case h.Type.isMarker() && (len(recs) != 1 || h.ProducerID != 0 || h.BaseSequence != 0):
		panic("batch: encode of a marker that is not one record of no producer")
	case uint64(len(recs)) > math.MaxUint32:
		panic(fmt.Sprintf("batch: encode of %d records", len(recs)))
	}
	h.RecordCount = uint32(len(recs))
	span := uint64(h.Span())
	if h.OffsetSpan != 0 && uint64(h.OffsetSpan) < uint64(len(recs)) || h.BaseOffset > math.MaxUint64-span {
		panic(fmt.Sprintf("batch: encode of %d records spanning %d offsets at base offset %d", len(recs), span, h.BaseOffset))
	}
	h.Flags = 0
	if h.OffsetSpan != 0 {
		h.Flags |= FlagCompacted
	}
	next := uint64(0)
	for i := range recs {
		r := &recs[i]
		if h.OffsetSpan != 0 {
			if uint64(r.OffsetDelta) < next || r.OffsetDelta >= h.OffsetSpan {
				panic(fmt.Sprintf("batch: record %d has offset delta %d, want [%d, %d)", i, r.OffsetDelta, next, h.OffsetSpan))
			}
			next = uint64(r.OffsetDelta) + 1
		}
		if r.Tombstone {
			if len(r.Value) > 0 || h.Type != TypeData {
				panic(fmt.Sprintf("batch: record %d is a tombstone with a value or in a %v frame", i, h.Type))
			}
			h.Flags |= FlagTombstones
		}
	}
	return h
}

// EncodeControl appends one control frame to dst and returns the extended
// slice: a frame of type h.Type (TypeNoop or TypeConfig) without records,
// whose body is payload, opaque to this package (a Raft ConfChange, say).
// h.RecordCount is ignored and set to 0. A control frame takes no offset:
// its NextOffset is its BaseOffset. EncodeControl grows dst at most once.
//
// EncodeControl panics if h.Type is TypeData, a marker's or unknown,
// h.Flags or h.OffsetSpan is not zero, or the frame would exceed FrameBytesMax.
func EncodeControl(dst []byte, h Header, payload []byte) []byte {
	if h.Type == TypeData || h.Type.isMarker() || h.Type > typeMax {
		panic(fmt.Sprintf("batch: control frame of type %v", h.Type))
	}
	if h.Flags != 0 || h.OffsetSpan != 0 {
		panic(fmt.Sprintf("batch: control frame with flags %#x or span %d", h.Flags, h.OffsetSpan))
	}
	if len(payload) > FrameBytesMax-HeaderSize {
		panic(fmt.Sprintf("batch: control payload of %d bytes exceeds FrameBytesMax", len(payload)))
	}
	h.RecordCount = 0
	dst, f := grow(dst, HeaderSize+len(payload))
	putHeader(f, h)
	copy(f[HeaderSize:], payload)
	binary.LittleEndian.PutUint32(f[posCRC:], crc32.Checksum(f[crcStart:], castagnoli))
	return dst
}

// grow extends dst by size bytes, reallocating at most once, and returns
// the extended slice and its new part.
func grow(dst []byte, size int) ([]byte, []byte) {
	start := len(dst)
	if cap(dst)-start < size {
		grown := make([]byte, start, start+size)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:start+size]
	return dst, dst[start:]
}

// putHeader writes every header field of the frame f but the CRC.
func putHeader(f []byte, h Header) {
	le := binary.LittleEndian
	le.PutUint32(f[posLength:], uint32(len(f)-4))
	f[posVersion] = version
	f[posType] = byte(h.Type)
	le.PutUint16(f[posFlags:], h.Flags)
	le.PutUint32(f[posRecordCount:], h.RecordCount)
	le.PutUint64(f[posBaseOffset:], h.BaseOffset)
	le.PutUint64(f[posEpoch:], h.Epoch)
	le.PutUint64(f[posTerm:], h.Term)
	le.PutUint64(f[posIndex:], h.Index)
	le.PutUint64(f[posAppendTime:], uint64(h.AppendTimeUnixNanos))
	le.PutUint64(f[posHLC:], h.HLC)
	le.PutUint64(f[posProducerID:], h.ProducerID)
	le.PutUint64(f[posBaseSequence:], h.BaseSequence)
	le.PutUint64(f[posReserved:], uint64(h.OffsetSpan))
}

// Patch rewrites BaseOffset, Epoch and AppendTimeUnixNanos of frame and
// recomputes its CRC. frame must hold one whole frame that the caller has
// already validated; Patch does not re-verify the old CRC. It panics if
// frame is shorter than its length field says or the new base offset
// overflows with the record count.
func Patch(frame []byte, baseOffset uint64, epoch uint64, appendTimeUnixNanos int64) {
	f := patchable(frame)
	span := uint64(binary.LittleEndian.Uint32(f[posRecordCount:]))
	if binary.LittleEndian.Uint16(f[posFlags:])&FlagCompacted != 0 {
		span = uint64(binary.LittleEndian.Uint32(f[posReserved:]))
	}
	if baseOffset > math.MaxUint64-span {
		panic(fmt.Sprintf("batch: patch to base offset %d overflows", baseOffset))
	}
	binary.LittleEndian.PutUint64(f[posBaseOffset:], baseOffset)
	binary.LittleEndian.PutUint64(f[posEpoch:], epoch)
	binary.LittleEndian.PutUint64(f[posAppendTime:], uint64(appendTimeUnixNanos))
	binary.LittleEndian.PutUint32(f[posCRC:], crc32.Checksum(f[crcStart:], castagnoli))
}

// PatchRaft rewrites Term and Index of frame and recomputes its CRC, under
// the same contract as Patch.
func PatchRaft(frame []byte, term, index uint64) {
	f := patchable(frame)
	binary.LittleEndian.PutUint64(f[posTerm:], term)
	binary.LittleEndian.PutUint64(f[posIndex:], index)
	binary.LittleEndian.PutUint32(f[posCRC:], crc32.Checksum(f[crcStart:], castagnoli))
}

// patchable returns the frame at the start of frame, panicking if the
// caller broke Patch's contract.
func patchable(frame []byte) []byte {
	size, err := FrameSize(frame)
	if err != nil || len(frame) < size {
		panic(fmt.Sprintf("batch: patch of an invalid frame (%d bytes): %v", len(frame), err))
	}
	return frame[:size]
}
