package raftnet

import (
	"fmt"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// One encoding per message on the send path.
//
// A message is encoded once, by Send, straight into the bytes it has in a
// RaftBatch on the wire: a `messages` field (3) holding a GroupMessage
// (group_id, then the raftpb.Message as `message`). A peer's sender then
// sends a batch as the two node fields followed by its queued messages'
// bytes as they are (wireBatch, through wireCodec): no second marshal of
// the batch copying every message again. The receiver decodes a RaftBatch
// as before; the bytes are the same as the proto codec's for the same
// RaftBatch (TestWireBatchMatchesProto).

// Field numbers of RaftBatch and GroupMessage (proto/geolog/internal/v1/raft.proto).
const (
	batchFromField     protowire.Number = 1
	batchToField       protowire.Number = 2
	batchMessagesField protowire.Number = 3
	groupIDField       protowire.Number = 1
	groupMessageField  protowire.Number = 2
)

// encodeFramed is encodeMessage's result as a RaftBatch's messages field
// ready for the wire, and the size of the encoded raftpb.Message alone
// (what the bounds and the byte counters count).
func encodeFramed(self NodeID, group GroupID, m *raftpb.Message, bytesMax int) ([]byte, int, error) {
	if err := checkMessage(group, self, NodeID(m.GetTo()), m, false); err != nil {
		return nil, 0, err
	}
	size := proto.Size(m)
	if size > bytesMax {
		return nil, 0, fmt.Errorf("%w: %d bytes, bound %d", ErrMessageTooLarge, size, bytesMax)
	}
	inner := protowire.SizeTag(groupIDField) + protowire.SizeVarint(uint64(group)) +
		protowire.SizeTag(groupMessageField) + protowire.SizeBytes(size)
	buf := make([]byte, 0, protowire.SizeTag(batchMessagesField)+protowire.SizeBytes(inner))
	buf = protowire.AppendTag(buf, batchMessagesField, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(inner))
	buf = protowire.AppendTag(buf, groupIDField, protowire.VarintType)
	buf = protowire.AppendVarint(buf, uint64(group))
	buf = protowire.AppendTag(buf, groupMessageField, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(size))
	buf, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, m)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: encode: %w", ErrInvalidMessage, err)
	}
	if len(buf) != cap(buf) {
		// The message changed between Size and Marshal: never on the
		// driver's goroutine, which owns it.
		return nil, 0, fmt.Errorf("%w: encoded %d bytes of %d", ErrInvalidMessage, len(buf), cap(buf))
	}
	return buf, size, nil
}

// wireBatch is a RaftBatch already encoded: head holds the node fields,
// msgs each message's framed bytes (encodeFramed). Only wireCodec sends it.
type wireBatch struct {
	head []byte
	msgs [][]byte
}

// reset sets the batch's node fields and empties its messages. The head is
// new each time: gRPC may still be sending the last batch's.
func (b *wireBatch) reset(from, to NodeID) {
	b.head = protowire.AppendTag(make([]byte, 0, 2*(1+protowire.SizeVarint(uint64(max(from, to))))), batchFromField, protowire.VarintType)
	b.head = protowire.AppendVarint(b.head, uint64(from))
	b.head = protowire.AppendTag(b.head, batchToField, protowire.VarintType)
	b.head = protowire.AppendVarint(b.head, uint64(to))
	clear(b.msgs)
	b.msgs = b.msgs[:0]
}

// wireCodec is the proto codec, except that it sends a *wireBatch's bytes
// as they are. The pieces are handed to gRPC without a copy: they are
// never written again once encoded (gRPC may send them after SendMsg
// returns).
type wireCodec struct{ base encoding.CodecV2 }

// wireCodecOption is the call option of a peer's stream.
var wireCodecOption = grpc.ForceCodecV2(wireCodec{base: encoding.GetCodecV2("proto")})

func (c wireCodec) Name() string { return c.base.Name() }

func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*wireBatch)
	if !ok {
		return c.base.Marshal(v)
	}
	out := make(mem.BufferSlice, 0, 1+len(b.msgs))
	out = append(out, mem.SliceBuffer(b.head))
	for _, m := range b.msgs {
		out = append(out, mem.SliceBuffer(m))
	}
	return out, nil
}

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }

// sendWire sends b on a peer's stream.
func sendWire(stream grpc.BidiStreamingClient[geologinternalv1.RaftBatch, geologinternalv1.RaftBatchAck], b *wireBatch) error {
	return stream.SendMsg(b)
}
