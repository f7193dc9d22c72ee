package client

import (
	"github.com/geolog/geolog/internal/commitwire"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// commitCodec is the proto codec, but for the answer of a cursor commit,
// decoded with commitwire (its results and positions in two allocations
// instead of two per position, stream names shared), or with the proto
// codec for what commitwire leaves to it.
type commitCodec struct{ base encoding.CodecV2 }

// commitCodecOption is the call option of CommitCursors calls.
var commitCodecOption = grpc.ForceCodecV2(commitCodec{base: encoding.GetCodecV2("proto")})

func (c commitCodec) Name() string { return c.base.Name() }

func (c commitCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c commitCodec) Unmarshal(data mem.BufferSlice, v any) error {
	resp, ok := v.(*geologv1.CommitCursorsResponse)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if commitwire.UnmarshalResponse(buf.ReadOnlyData(), resp) {
		return nil
	}
	return c.base.Unmarshal(data, resp)
}
