package regionsvc

import (
	"github.com/geolog/geolog/internal/appendwire"
	"github.com/geolog/geolog/internal/commitwire"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// The server's codec is the proto codec, but for cursor commits (decoded
// with commitwire: fewer allocations per position) and for appends, which
// it decodes with appendwire.Unmarshal: their records and headers are
// counted on the wire first, and one over the bounds is not decoded into millions of
// structs (prepareAppend refuses it: appendwire.Over).

// Bounds on an append (appendwire's, checked on the wire and again here).
const (
	recordsPerBatchMax  = appendwire.RecordsPerBatchMax
	headersPerRecordMax = appendwire.HeadersPerRecordMax
	headersPerBatchMax  = appendwire.HeadersPerBatchMax
)

// apiCodec is the proto codec with the append check.
type apiCodec struct{ base encoding.CodecV2 }

func newAPICodec() apiCodec { return apiCodec{base: encoding.GetCodecV2("proto")} }

func (c apiCodec) Name() string { return c.base.Name() }

func (c apiCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c apiCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if commit, ok := v.(*geologv1.CommitCursorsRequest); ok {
		return c.unmarshalCommit(data, commit)
	}
	req, ok := v.(*geologv1.AppendRequest)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return appendwire.Unmarshal(buf.ReadOnlyData(), req)
}

// unmarshalCommit decodes a cursor commit with commitwire (its positions
// in one allocation, one stream name string for a run of positions on the
// same stream), or with the proto codec for what commitwire leaves to it.
func (c apiCodec) unmarshalCommit(data mem.BufferSlice, req *geologv1.CommitCursorsRequest) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if commitwire.Unmarshal(buf.ReadOnlyData(), req) {
		return nil
	}
	return c.base.Unmarshal(data, req)
}
