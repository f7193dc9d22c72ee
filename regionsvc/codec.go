package regionsvc

import (
	"fmt"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The server's codec counts an append's records and their headers on the
// wire, before decoding it: a request within the receive limit (BatchBytes
// Max and a little) could otherwise hold millions of empty records (two
// bytes each), and decoding them allocates a struct each, hundreds of
// megabytes for one request. An append over the bounds is decoded without
// its records, and marked so that prepareAppend refuses it (a codec error
// would reach the client as INTERNAL; the refusal is INVALID_ARGUMENT).
// Every other message is the proto codec's.

// Bounds on an append, checked on the wire.
const (
	// recordsPerBatchMax bounds the records of one append.
	recordsPerBatchMax = 1 << 17
	// headersPerRecordMax bounds the headers of one record.
	headersPerRecordMax = 256
	// headersPerBatchMax bounds the headers of all records of one append.
	headersPerBatchMax = 1 << 17
)

// Field numbers of AppendRequest and Record on the wire.
const (
	appendRecordsField = 3
	recordHeadersField = 3
	// appendOverField is where the codec marks an append over the bounds,
	// in the decoded message's unknown fields (the largest field number,
	// which the API never uses; a client that sends it only gets its own
	// request refused).
	appendOverField protowire.Number = protowire.MaxValidNumber
)

// apiCodec is the proto codec with the append check.
type apiCodec struct{ base encoding.CodecV2 }

func newAPICodec() apiCodec { return apiCodec{base: encoding.GetCodecV2("proto")} }

func (c apiCodec) Name() string { return c.base.Name() }

func (c apiCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c apiCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*geologv1.AppendRequest)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return unmarshalAppend(buf.ReadOnlyData(), req)
}

// appendCounts counts an encoded AppendRequest's records and their
// headers; ok is false if the bytes are not a valid message (the proto
// decoder then says why).
func appendCounts(b []byte) (records, headers, headersMaxPerRecord int, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, 0, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return 0, 0, 0, false
		}
		if num == appendRecordsField && typ == protowire.BytesType {
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
		if num == recordHeadersField && typ == protowire.BytesType {
			count++
		}
		b = b[n+m:]
	}
	return count, true
}

// unmarshalAppend decodes an append, or, over the bounds, everything but
// its records, marked with how it is over them.
func unmarshalAppend(b []byte, req *geologv1.AppendRequest) error {
	records, headers, perRecord, ok := appendCounts(b)
	over := ""
	switch {
	case !ok:
	case records > recordsPerBatchMax:
		over = fmt.Sprintf("%d records in one batch, over the maximum of %d", records, recordsPerBatchMax)
	case perRecord > headersPerRecordMax:
		over = fmt.Sprintf("a record has %d headers, over the maximum of %d", perRecord, headersPerRecordMax)
	case headers > headersPerBatchMax:
		over = fmt.Sprintf("%d record headers in one batch, over the maximum of %d", headers, headersPerBatchMax)
	}
	if over == "" {
		return proto.Unmarshal(b, req)
	}
	var rest []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if num != appendRecordsField {
			rest = append(rest, b[:n+m]...)
		}
		b = b[n+m:]
	}
	if err := proto.Unmarshal(rest, req); err != nil {
		return err
	}
	mark := protowire.AppendTag(nil, appendOverField, protowire.BytesType)
	req.ProtoReflect().SetUnknown(protowire.AppendString(mark, over))
	return nil
}

// appendOver returns the codec's refusal of req, or nil: an append whose
// records the codec did not decode because it is over the bounds.
func appendOver(req *geologv1.AppendRequest) error {
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
		if num == appendOverField && typ == protowire.BytesType {
			why, _ := protowire.ConsumeString(u[n:])
			return apierr.New(apierr.BatchTooLarge, "%s", why)
		}
		u = u[n+m:]
	}
	return nil
}
