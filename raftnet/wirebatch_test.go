package raftnet

import (
	"bytes"
	"errors"
	"testing"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"
)

// TestWireBatchMatchesProto: a batch sent as encodeFramed's pieces through
// wireCodec has exactly the bytes the proto codec gives the same
// RaftBatch, and the receiver decodes the messages sent.
func TestWireBatchMatchesProto(t *testing.T) {
	msgs := []GroupMessage{
		{Group: 1, Message: &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: proto.Uint64(3), To: proto.Uint64(200), Term: proto.Uint64(7), Commit: proto.Uint64(9)}},
		{Group: 1 << 40, Message: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(3), To: proto.Uint64(200), Term: proto.Uint64(7),
			Index: proto.Uint64(10), LogTerm: proto.Uint64(7), Commit: proto.Uint64(9), Entries: []*raftpb.Entry{
				{Index: proto.Uint64(11), Term: proto.Uint64(7), Data: bytes.Repeat([]byte("x"), 300)},
				{Index: proto.Uint64(12), Term: proto.Uint64(7), Data: bytes.Repeat([]byte("y"), 70000)},
			}}},
		{Group: 2, Message: &raftpb.Message{Type: raftpb.MsgAppResp.Enum(), From: proto.Uint64(3), To: proto.Uint64(200), Term: proto.Uint64(7), Index: proto.Uint64(12)}},
	}
	var wb wireBatch
	wb.reset(3, 200)
	want := &geologinternalv1.RaftBatch{FromNode: 3, ToNode: 200}
	sizes := 0
	for _, gm := range msgs {
		data, size, err := encodeFramed(3, gm.Group, gm.Message, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := proto.Marshal(gm.Message)
		if err != nil {
			t.Fatal(err)
		}
		if size != len(plain) {
			t.Fatalf("group %d: size %d, the message encodes to %d bytes", gm.Group, size, len(plain))
		}
		sizes += size
		wb.msgs = append(wb.msgs, data)
		want.Messages = append(want.Messages, &geologinternalv1.GroupMessage{GroupId: uint64(gm.Group), Message: plain})
	}
	out, err := wireCodec{base: encoding.GetCodecV2("proto")}.Marshal(&wb)
	if err != nil {
		t.Fatal(err)
	}
	got := out.Materialize()
	wantBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, wantBytes) {
		t.Fatalf("wire batch of %d bytes differs from the proto codec's %d", len(got), len(wantBytes))
	}
	var rb geologinternalv1.RaftBatch
	if err := proto.Unmarshal(got, &rb); err != nil {
		t.Fatal(err)
	}
	dec, size, err := decodeBatch(&rb, 3, 200, batchLimits{messagesMax: 10, messageBytesMax: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if size != sizes || len(dec) != len(msgs) {
		t.Fatalf("decoded %d messages of %d bytes, sent %d of %d", len(dec), size, len(msgs), sizes)
	}
	for i := range dec {
		if dec[i].Group != msgs[i].Group || !proto.Equal(dec[i].Message, msgs[i].Message) {
			t.Fatalf("message %d: got group %d %v, sent group %d %v", i, dec[i].Group, dec[i].Message, msgs[i].Group, msgs[i].Message)
		}
	}
	// The hello and anything else still go through the proto codec.
	hello, err := wireCodec{base: encoding.GetCodecV2("proto")}.Marshal(&geologinternalv1.RaftBatch{FromNode: 3, ToNode: 200})
	if err != nil || !bytes.Equal(hello.Materialize(), wb.head) {
		t.Fatalf("hello %x, %v; want %x", hello.Materialize(), err, wb.head)
	}
}

// TestEncodeFramedRefuses: what encodeMessage refuses, encodeFramed does.
func TestEncodeFramedRefuses(t *testing.T) {
	big := &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1),
		Entries: []*raftpb.Entry{{Index: proto.Uint64(1), Term: proto.Uint64(1), Data: make([]byte, 2000)}}}
	if _, _, err := encodeFramed(1, 5, big, 1000); !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("a message over the bound: %v, want ErrMessageTooLarge", err)
	}
	local := &raftpb.Message{Type: raftpb.MsgHup.Enum(), From: proto.Uint64(1), To: proto.Uint64(2)}
	if _, _, err := encodeFramed(1, 5, local, 1<<20); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("a local message: %v, want ErrInvalidMessage", err)
	}
	if _, _, err := encodeFramed(1, 0, big, 1<<20); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("group 0: %v, want ErrInvalidMessage", err)
	}
}
