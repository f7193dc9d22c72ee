// Package appendwire checks an encoded geolog.v1.AppendRequest before it is
// decoded: a request within the receive limit could otherwise hold millions
// of empty records (two bytes each on the wire), and decoding them allocates
// a struct each, hundreds of megabytes for one request. Unmarshal counts the
// records and their headers on the wire; over the bounds it decodes
// everything but the records and marks the message, so that the server
// refuses it with BATCH_TOO_LARGE (INVALID_ARGUMENT) where it validates
// appends (a codec error would reach the client as INTERNAL).
package appendwire

import (
	"fmt"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Bounds on an append, checked on the wire.
const (
	// RecordsPerBatchMax bounds the records of one append.
	RecordsPerBatchMax = 1 << 17
	// HeadersPerRecordMax bounds the headers of one record.
	HeadersPerRecordMax = 256
	// HeadersPerBatchMax bounds the headers of all records of one append.
	HeadersPerBatchMax = 1 << 17
)

// Field numbers of AppendRequest and Record on the wire.
const (
	// RecordsField is AppendRequest.records.
	RecordsField = 3
	// HeadersField is Record.headers.
	HeadersField = 3
	// overField is where Unmarshal marks an append over the bounds, in the
	// decoded message's unknown fields (the largest field number, which
	// the API never uses; a client that sends it only gets its own request
	// refused).
	overField protowire.Number = protowire.MaxValidNumber
)

// Counts counts an encoded AppendRequest's records and their
// headers; ok is false if the bytes are not a valid message (the proto
// decoder then says why).
func Counts(b []byte) (records, headers, headersMaxPerRecord int, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, 0, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return 0, 0, 0, false
		}
		if num == RecordsField && typ == protowire.BytesType {
			rec, _ := protowire.ConsumeBytes(b[n:])
			h, ok := recordHeaders(rec)
			if !ok {
				return 0, 0, 0, false
			}
			records++
			headers += h
			headersMaxPerRecord = max(headersMaxPerRecord, h)
		}
		b = b[n+m:]
	}
	return records, headers, headersMaxPerRecord, true
}

// recordHeaders counts an encoded Record's headers.
func recordHeaders(b []byte) (int, bool) {
	count := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return 0, false
		}
		if num == HeadersField && typ == protowire.BytesType {
			count++
		}
		b = b[n+m:]
	}
	return count, true
}

// Unmarshal decodes an append, or, over the bounds, everything but
// its records, marked with how it is over them.
func Unmarshal(b []byte, req *geologv1.AppendRequest) error {
	records, headers, perRecord, ok := Counts(b)
	over := ""
	switch {
	case !ok:
	case records > RecordsPerBatchMax:
		over = fmt.Sprintf("%d records in one batch, over the maximum of %d", records, RecordsPerBatchMax)
	case perRecord > HeadersPerRecordMax:
		over = fmt.Sprintf("a record has %d headers, over the maximum of %d", perRecord, HeadersPerRecordMax)
	case headers > HeadersPerBatchMax:
		over = fmt.Sprintf("%d record headers in one batch, over the maximum of %d", headers, HeadersPerBatchMax)
	}
	if over == "" {
		return proto.Unmarshal(b, req)
	}
	var rest []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if num != RecordsField {
			rest = append(rest, b[:n+m]...)
		}
		b = b[n+m:]
	}
	if err := proto.Unmarshal(rest, req); err != nil {
		return err
	}
	mark := protowire.AppendTag(nil, overField, protowire.BytesType)
	req.ProtoReflect().SetUnknown(protowire.AppendString(mark, over))
	return nil
}

// Over returns the refusal of an append that Unmarshal marked, or nil: its records
// were not decoded, it is over the bounds.
func Over(req *geologv1.AppendRequest) error {
	u := req.ProtoReflect().GetUnknown()
	for len(u) > 0 {
		num, typ, n := protowire.ConsumeTag(u)
		if n < 0 {
			return nil
		}
		m := protowire.ConsumeFieldValue(num, typ, u[n:])
		if m < 0 {
			return nil
		}
		if num == overField && typ == protowire.BytesType {
			why, _ := protowire.ConsumeString(u[n:])
			return apierr.New(apierr.BatchTooLarge, "%s", why)
		}
		u = u[n+m:]
	}
	return nil
}
