// Package commitwire decodes an encoded geolog.v1.CommitCursorsRequest
// with fewer allocations than the generic proto decoder: the positions'
// messages in one slice instead of one allocation each, and a stream name
// repeated from the position before taken as the same string (a commit
// usually names one stream for all its ranges). It decodes only requests
// made of the fields it knows, each with its proto3 wire type and valid
// values; for anything else (an unknown field, which the generic decoder
// keeps and a forwarding node passes on; a bad varint; a string that is
// not UTF-8) it says so and the caller decodes with proto.Unmarshal, so
// the outcome is always the generic decoder's.
package commitwire

import (
	"math"
	"unicode/utf8"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of CommitCursorsRequest (consumer.proto).
const (
	reqCursor      = 1
	reqPositions   = 2
	reqMemberID    = 3
	reqMemberEpoch = 4
	reqMerge       = 5
)

// Field numbers of CursorPosition (consumer.proto).
const (
	posStream     = 1
	posRange      = 2
	posOffset     = 3
	posEpoch      = 4
	posGeneration = 5
	posMetadata   = 6
	posCommitTime = 7
)

// Unmarshal decodes b into req (reset first) and reports true, or reports
// false, with req reset, for bytes it leaves to proto.Unmarshal (see the
// package comment). Strings and bytes are copied: b may be reused.
func Unmarshal(b []byte, req *geologv1.CommitCursorsRequest) bool {
	req.Reset()
	n, ok := countField(b, reqPositions)
	if !ok {
		return false
	}
	if n > 0 {
		msgs := make([]geologv1.CursorPosition, n)
		req.Positions = make([]*geologv1.CursorPosition, n)
		for i := range msgs {
			req.Positions[i] = &msgs[i]
		}
	}
	if !decodeRequest(b, req) {
		req.Reset()
		return false
	}
	return true
}

// decodeRequest fills req, whose Positions Unmarshal sized.
func decodeRequest(b []byte, req *geologv1.CommitCursorsRequest) bool {
	next := 0
	var prevStream string
	for len(b) > 0 {
		num, typ, m := protowire.ConsumeTag(b)
		b = b[m:]
		var k int
		switch {
		case num == reqCursor && typ == protowire.BytesType:
			req.Cursor, k = consumeString(b)
		case num == reqMemberID && typ == protowire.BytesType:
			req.MemberId, k = consumeString(b)
		case num == reqMemberEpoch && typ == protowire.VarintType:
			req.MemberEpoch, k = protowire.ConsumeVarint(b)
		case num == reqMerge && typ == protowire.VarintType:
			var v uint64
			v, k = protowire.ConsumeVarint(b)
			if v > 1 {
				return false
			}
			req.Merge = v == 1
		case num == reqPositions && typ == protowire.BytesType:
			var p []byte
			p, k = protowire.ConsumeBytes(b)
			if k < 0 || !decodePosition(p, req.Positions[next], &prevStream) {
				return false
			}
			next++
		default:
			return false // unknown, or a known field with another wire type
		}
		if k < 0 {
			return false
		}
		b = b[k:]
	}
	return next == len(req.Positions)
}

// decodePosition fills p from its encoding; prev is the stream name of
// the position before, reused when equal.
func decodePosition(b []byte, p *geologv1.CursorPosition, prev *string) bool {
	for len(b) > 0 {
		num, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return false
		}
		b = b[m:]
		var k int
		var v uint64
		switch {
		case num == posStream && typ == protowire.BytesType:
			var s []byte
			s, k = protowire.ConsumeBytes(b)
			if k < 0 || !utf8.Valid(s) {
				return false
			}
			if string(s) != *prev { // no allocation for the comparison
				*prev = string(s)
			}
			p.Stream = *prev
		case num == posMetadata && typ == protowire.BytesType:
			var s []byte
			s, k = protowire.ConsumeBytes(b)
			p.Metadata = append([]byte{}, s...)
		case typ == protowire.VarintType && num >= posRange && num <= posCommitTime && num != posMetadata:
			v, k = protowire.ConsumeVarint(b)
			if !setVarint(p, num, v) {
				return false
			}
		default:
			return false
		}
		if k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}

// setVarint sets a varint field of p; false for a range over 32 bits.
func setVarint(p *geologv1.CursorPosition, num protowire.Number, v uint64) bool {
	switch num {
	case posRange:
		if v > math.MaxUint32 {
			return false
		}
		p.Range = uint32(v)
	case posOffset:
		p.Offset = v
	case posEpoch:
		p.Epoch = v
	case posGeneration:
		p.Generation = v
	case posCommitTime:
		p.CommitTimeUnixNanos = int64(v)
	}
	return true
}

// consumeString is protowire.ConsumeString, refusing invalid UTF-8 (k < 0)
// as the generic decoder does for proto3 strings.
func consumeString(b []byte) (string, int) {
	s, k := protowire.ConsumeBytes(b)
	if k < 0 || !utf8.Valid(s) {
		return "", -1
	}
	return string(s), k
}

// Field numbers of CommitCursorsResponse and CursorCommitResult
// (consumer.proto).
const (
	respResults    = 1
	resultPosition = 1
	resultApplied  = 2
)

// UnmarshalResponse is Unmarshal for a CommitCursorsResponse (the SDK's
// side): its results and their positions in two allocations, stream names
// shared as Unmarshal shares them. It declines a result whose position
// field appears more than once (proto merges them) as it declines
// anything else it does not decode exactly as proto does.
func UnmarshalResponse(b []byte, resp *geologv1.CommitCursorsResponse) bool {
	resp.Reset()
	n, ok := countField(b, respResults)
	if !ok {
		return false
	}
	if n == 0 {
		return len(b) == 0 // else fields it does not know
	}
	results := make([]geologv1.CursorCommitResult, n)
	positions := make([]geologv1.CursorPosition, n)
	resp.Results = make([]*geologv1.CursorCommitResult, n)
	var prevStream string
	for i := 0; len(b) > 0; i++ {
		num, typ, m := protowire.ConsumeTag(b)
		if num != respResults || typ != protowire.BytesType {
			resp.Reset()
			return false
		}
		r, k := protowire.ConsumeBytes(b[m:])
		resp.Results[i] = &results[i]
		if k < 0 || !decodeResult(r, &results[i], &positions[i], &prevStream) {
			resp.Reset()
			return false
		}
		b = b[m+k:]
	}
	return true
}

// countField counts the fields num of an encoding, checking only that the
// fields are well formed.
func countField(b []byte, num protowire.Number) (int, bool) {
	n := 0
	for len(b) > 0 {
		f, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return 0, false
		}
		k := protowire.ConsumeFieldValue(f, typ, b[m:])
		if k < 0 {
			return 0, false
		}
		if f == num {
			n++
		}
		b = b[m+k:]
	}
	return n, true
}

// decodeResult fills r (its position, if any, into p).
func decodeResult(b []byte, r *geologv1.CursorCommitResult, p *geologv1.CursorPosition, prev *string) bool {
	for len(b) > 0 {
		num, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return false
		}
		b = b[m:]
		var k int
		switch {
		case num == resultPosition && typ == protowire.BytesType && r.Position == nil:
			var enc []byte
			if enc, k = protowire.ConsumeBytes(b); k < 0 || !decodePosition(enc, p, prev) {
				return false
			}
			r.Position = p
		case num == resultApplied && typ == protowire.VarintType:
			var v uint64
			if v, k = protowire.ConsumeVarint(b); v > 1 {
				return false
			}
			r.Applied = v == 1
		default:
			return false
		}
		if k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}
