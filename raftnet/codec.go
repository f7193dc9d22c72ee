package raftnet

import (
	"fmt"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// networkTypes are the message types Raft sends to other nodes, MsgSnap
// aside (it has a path of its own). Everything else is local to a node
// (MsgHup, MsgBeat, MsgStorage*, ...) and never belongs on the wire.
var networkTypes = map[raftpb.MessageType]bool{
	raftpb.MsgProp:           true,
	raftpb.MsgApp:            true,
	raftpb.MsgAppResp:        true,
	raftpb.MsgVote:           true,
	raftpb.MsgVoteResp:       true,
	raftpb.MsgHeartbeat:      true,
	raftpb.MsgHeartbeatResp:  true,
	raftpb.MsgTransferLeader: true,
	raftpb.MsgTimeoutNow:     true,
	raftpb.MsgReadIndex:      true,
	raftpb.MsgReadIndexResp:  true,
	raftpb.MsgPreVote:        true,
	raftpb.MsgPreVoteResp:    true,
}

// checkMessage validates m as a message of group travelling from one node to
// another: the same check on both sides of the wire, so a sender never puts
// on a stream what would make the receiver end it. snap selects the snapshot
// path (only MsgSnap, with metadata) or the message path (no MsgSnap).
func checkMessage(group GroupID, from, to NodeID, m *raftpb.Message, snap bool) error {
	if m == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if group == 0 {
		return fmt.Errorf("%w: group 0", ErrInvalidMessage)
	}
	t := m.GetType()
	switch {
	case snap && t != raftpb.MsgSnap:
		return fmt.Errorf("%w: %s on the snapshot path", ErrInvalidMessage, t)
	case snap && m.GetSnapshot().GetMetadata() == nil:
		return fmt.Errorf("%w: MsgSnap without snapshot metadata", ErrInvalidMessage)
	case !snap && t == raftpb.MsgSnap:
		return fmt.Errorf("%w: MsgSnap goes through SendSnapshot", ErrInvalidMessage)
	case !snap && !networkTypes[t]:
		return fmt.Errorf("%w: type %s is not sent between nodes", ErrInvalidMessage, t)
	}
	if from == 0 || to == 0 || from == to {
		return fmt.Errorf("%w: from node %d to node %d", ErrInvalidMessage, from, to)
	}
	// A follower forwards MsgTransferLeader to the leader with From still
	// naming the transferee (RawNode.TransferLeader sets it so), which need
	// not be the sending node.
	fromOK := NodeID(m.GetFrom()) == from || (t == raftpb.MsgTransferLeader && m.GetFrom() != 0)
	if !fromOK || NodeID(m.GetTo()) != to {
		return fmt.Errorf("%w: message from %d to %d on the path from node %d to node %d",
			ErrInvalidMessage, m.GetFrom(), m.GetTo(), from, to)
	}
	if len(m.GetResponses()) != 0 {
		return fmt.Errorf("%w: message carries local responses", ErrInvalidMessage)
	}
	return nil
}

// encodeMessage checks m for the path from self to m.To and encodes it. The
// result shares nothing with m.
func encodeMessage(self NodeID, group GroupID, m *raftpb.Message, snap bool, bytesMax int) ([]byte, error) {
	if err := checkMessage(group, self, NodeID(m.GetTo()), m, snap); err != nil {
		return nil, err
	}
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %w", ErrInvalidMessage, err)
	}
	if len(data) > bytesMax {
		return nil, fmt.Errorf("%w: %d bytes, bound %d", ErrMessageTooLarge, len(data), bytesMax)
	}
	return data, nil
}

// decodeMessage decodes and checks one received message of group from node
// from to node self. Errors wrap ErrMalformed.
func decodeMessage(data []byte, group GroupID, from, self NodeID, snap bool, bytesMax int) (*raftpb.Message, error) {
	if len(data) > bytesMax {
		return nil, fmt.Errorf("%w: message of %d bytes, bound %d", ErrMalformed, len(data), bytesMax)
	}
	m := new(raftpb.Message)
	if err := proto.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("%w: group %d: %w", ErrMalformed, group, err)
	}
	if err := checkMessage(group, from, self, m, snap); err != nil {
		return nil, fmt.Errorf("%w: group %d: %w", ErrMalformed, group, err)
	}
	return m, nil
}

// batchLimits bound what a receiver accepts in one RaftBatch.
type batchLimits struct {
	messagesMax     int
	messageBytesMax int
	// check is Config.CheckMessage (nil: none).
	check func(GroupID, *raftpb.Message) error
}

// decodeBatch checks a received batch against the stream's sender and this
// node and decodes its messages. It returns the messages (the caller owns
// them) and their encoded size. Any error wraps ErrMalformed or
// ErrWrongNode; the stream carrying b must then end.
func decodeBatch(b *geologinternalv1.RaftBatch, from, self NodeID, lim batchLimits) ([]GroupMessage, int, error) {
	if NodeID(b.GetFromNode()) != from {
		return nil, 0, fmt.Errorf("%w: batch from node %d on a stream from node %d", ErrMalformed, b.GetFromNode(), from)
	}
	if NodeID(b.GetToNode()) != self {
		return nil, 0, fmt.Errorf("%w: batch for node %d reached node %d", ErrWrongNode, b.GetToNode(), self)
	}
	wire := b.GetMessages()
	if len(wire) == 0 {
		return nil, 0, fmt.Errorf("%w: empty batch", ErrMalformed)
	}
	if len(wire) > lim.messagesMax {
		return nil, 0, fmt.Errorf("%w: batch of %d messages, bound %d", ErrMalformed, len(wire), lim.messagesMax)
	}
	msgs := make([]GroupMessage, len(wire))
	size := 0
	for i, gm := range wire {
		group := GroupID(gm.GetGroupId())
		m, err := decodeMessage(gm.GetMessage(), group, from, self, false, lim.messageBytesMax)
		if err != nil {
			return nil, 0, fmt.Errorf("message %d: %w", i, err)
		}
		if lim.check != nil {
			if err := lim.check(group, m); err != nil {
				return nil, 0, fmt.Errorf("%w: message %d of group %d: %w", ErrMalformed, i, group, err)
			}
		}
		msgs[i] = GroupMessage{Group: group, Message: m}
		size += len(gm.GetMessage())
	}
	return msgs, size, nil
}
