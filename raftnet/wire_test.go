package raftnet

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// rawClient dials n with the generated stub, to send what a correct
// transport never would.
func rawClient(t *testing.T, n *testNode) geologinternalv1.RaftTransportClient {
	t.Helper()
	conn, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return geologinternalv1.NewRaftTransportClient(conn)
}

func encoded(t testing.TB, m *raftpb.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// streamOutcome sends batches on a fresh stream and returns the status the
// server ended it with (after the hello, when hello is true).
func streamOutcome(t *testing.T, c geologinternalv1.RaftTransportClient, hello *geologinternalv1.RaftBatch, batches ...*geologinternalv1.RaftBatch) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(hello); err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		if err := s.Send(b); err != nil {
			break // the server already ended the stream; Recv tells why
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := s.Recv()
		if err == io.EOF {
			return codes.OK
		}
		if err != nil {
			return status.Code(err)
		}
	}
}

func TestMalformedInputEndsStream(t *testing.T) {
	b := startNode(t, 2, "", nil)
	c := rawClient(t, b)
	hello := &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2}
	batch := func(group uint64, data []byte) *geologinternalv1.RaftBatch {
		return &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2, Messages: []*geologinternalv1.GroupMessage{{GroupId: group, Message: data}}}
	}
	good := encoded(t, msg(raftpb.MsgApp, 1, 2, 1))
	cases := []struct {
		name    string
		hello   *geologinternalv1.RaftBatch
		batches []*geologinternalv1.RaftBatch
		want    codes.Code
	}{
		{"hello to another node", &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 3}, nil, codes.FailedPrecondition},
		{"hello from node 0", &geologinternalv1.RaftBatch{ToNode: 2}, nil, codes.InvalidArgument},
		{"hello with messages", batch(1, good), nil, codes.InvalidArgument},
		{"garbage bytes", hello, []*geologinternalv1.RaftBatch{batch(1, []byte{0xff, 0xff, 0xff, 0x07, 0x01})}, codes.InvalidArgument},
		{"truncated message", hello, []*geologinternalv1.RaftBatch{batch(1, good[:len(good)-1])}, codes.InvalidArgument},
		{"group 0", hello, []*geologinternalv1.RaftBatch{batch(0, good)}, codes.InvalidArgument},
		{"local type", hello, []*geologinternalv1.RaftBatch{batch(1, encoded(t, msg(raftpb.MsgHup, 1, 2, 1)))}, codes.InvalidArgument},
		{"snap in a batch", hello, []*geologinternalv1.RaftBatch{batch(1, encoded(t, snapMsg(1, 2, 1)))}, codes.InvalidArgument},
		{"message from another node", hello, []*geologinternalv1.RaftBatch{batch(1, encoded(t, msg(raftpb.MsgApp, 3, 2, 1)))}, codes.InvalidArgument},
		{"message to another node", hello, []*geologinternalv1.RaftBatch{batch(1, encoded(t, msg(raftpb.MsgApp, 1, 3, 1)))}, codes.InvalidArgument},
		{"batch to another node", hello, []*geologinternalv1.RaftBatch{{FromNode: 1, ToNode: 3, Messages: batch(1, good).Messages}}, codes.FailedPrecondition},
		{"batch from another node", hello, []*geologinternalv1.RaftBatch{{FromNode: 3, ToNode: 2, Messages: batch(1, good).Messages}}, codes.InvalidArgument},
		{"empty batch", hello, []*geologinternalv1.RaftBatch{{FromNode: 1, ToNode: 2}}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := b.tr.Stats().StreamsRejected
			if got := streamOutcome(t, c, tc.hello, tc.batches...); got != tc.want {
				t.Fatalf("status %s, want %s", got, tc.want)
			}
			if b.tr.Stats().StreamsRejected != before+1 {
				t.Fatal("rejection not counted")
			}
		})
	}
	if n := b.rec.count(); n != 0 {
		t.Fatalf("handler got %d messages from rejected streams", n)
	}
	// A good batch after all that is delivered: the server is fine.
	if got := streamOutcome(t, c, hello, batch(5, good)); got != codes.OK {
		t.Fatalf("good stream: %s", got)
	}
	if b.rec.count() != 1 {
		t.Fatal("good batch not delivered")
	}
}

func TestMalformedSnapshot(t *testing.T) {
	b := startNode(t, 2, "", nil)
	c := rawClient(t, b)
	header := func(to uint64, m []byte) *geologinternalv1.SnapshotChunk {
		return &geologinternalv1.SnapshotChunk{Kind: &geologinternalv1.SnapshotChunk_Header{Header: &geologinternalv1.SnapshotHeader{
			FromNode: 1, ToNode: to, GroupId: 1, Message: m}}}
	}
	data := func(b []byte) *geologinternalv1.SnapshotChunk {
		return &geologinternalv1.SnapshotChunk{Kind: &geologinternalv1.SnapshotChunk_Data{Data: b}}
	}
	trailer := func(n uint64, crc uint32) *geologinternalv1.SnapshotChunk {
		return &geologinternalv1.SnapshotChunk{Kind: &geologinternalv1.SnapshotChunk_Trailer{Trailer: &geologinternalv1.SnapshotTrailer{BodyBytes: n, BodyCrc32C: crc}}}
	}
	good := encoded(t, snapMsg(1, 2, 9))
	cases := []struct {
		name   string
		chunks []*geologinternalv1.SnapshotChunk
		want   codes.Code
	}{
		{"no header", []*geologinternalv1.SnapshotChunk{data([]byte("x"))}, codes.InvalidArgument},
		{"wrong node", []*geologinternalv1.SnapshotChunk{header(3, good)}, codes.FailedPrecondition},
		{"not MsgSnap", []*geologinternalv1.SnapshotChunk{header(2, encoded(t, msg(raftpb.MsgApp, 1, 2, 1)))}, codes.InvalidArgument},
		{"garbage header", []*geologinternalv1.SnapshotChunk{header(2, []byte{0x0a, 0xff})}, codes.InvalidArgument},
		{"no trailer", []*geologinternalv1.SnapshotChunk{header(2, good), data([]byte("abc"))}, codes.DataLoss},
		{"wrong length", []*geologinternalv1.SnapshotChunk{header(2, good), data([]byte("abc")), trailer(4, 0)}, codes.DataLoss},
		{"wrong crc", []*geologinternalv1.SnapshotChunk{header(2, good), data([]byte("abc")), trailer(3, 1)}, codes.DataLoss},
		{"second header", []*geologinternalv1.SnapshotChunk{header(2, good), header(2, good)}, codes.DataLoss},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s, err := c.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range tc.chunks {
				if s.Send(ch) != nil {
					break
				}
			}
			_, err = s.CloseAndRecv()
			if got := status.Code(err); got != tc.want {
				t.Fatalf("status %s (%v), want %s", got, err, tc.want)
			}
		})
	}
	if got := b.tr.Stats(); got.SnapshotsReceived != 0 || got.SnapshotsReceiveFailed != uint64(len(cases)) {
		t.Fatalf("stats %+v", got)
	}
}

// TestNewerStreamSupersedes checks the ordering guard across reconnects: once
// a newer stream from a node is accepted, the older one delivers nothing.
func TestNewerStreamSupersedes(t *testing.T) {
	b := startNode(t, 2, "", nil)
	c := rawClient(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hello := &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2}
	batch := &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2, Messages: []*geologinternalv1.GroupMessage{
		{GroupId: 1, Message: encoded(t, msg(raftpb.MsgApp, 1, 2, 1))}}}
	open := func() grpc.BidiStreamingClient[geologinternalv1.RaftBatch, geologinternalv1.RaftBatchAck] {
		s, err := c.Stream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(hello); err != nil {
			t.Fatal(err)
		}
		if ack, err := s.Recv(); err != nil || ack.GetNodeId() != 2 {
			t.Fatalf("hello: %v %v", ack, err)
		}
		return s
	}
	old := open()
	newer := open()
	if err := old.Send(batch); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Recv(); status.Code(err) != codes.Aborted {
		t.Fatalf("old stream: %v", err)
	}
	if err := newer.Send(batch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "delivery on the newer stream", func() bool { return b.rec.count() == 1 })
	if err := newer.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := newer.Recv(); err != io.EOF {
		t.Fatalf("newer stream: %v", err)
	}
}

func TestStatusMapping(t *testing.T) {
	for _, sc := range statusCodes {
		st := toStatus(sc.err)
		if status.Code(st) != sc.code {
			t.Fatalf("%v → %s, want %s", sc.err, status.Code(st), sc.code)
		}
		back := fromStatus(st)
		want := sc.err
		if sc.code == codes.Unavailable {
			want = ErrPeerUnreachable
		}
		if !errors.Is(back, want) {
			t.Fatalf("%s → %v, want %v", sc.code, back, want)
		}
	}
}

// FuzzDecodeBatch feeds arbitrary bytes to the receive path: decoding a
// RaftBatch and then its messages must never panic, and whatever passes
// must re-encode to messages that pass again.
func FuzzDecodeBatch(f *testing.F) {
	add := func(b *geologinternalv1.RaftBatch) {
		data, err := proto.Marshal(b)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	good := encoded(f, appMsg(1, 2, 7, 16))
	add(&geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2, Messages: []*geologinternalv1.GroupMessage{{GroupId: 3, Message: good}}})
	add(&geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2, Messages: []*geologinternalv1.GroupMessage{
		{GroupId: 3, Message: encoded(f, msg(raftpb.MsgHeartbeat, 1, 2, 0))}, {GroupId: 4, Message: good[:5]}}})
	f.Add([]byte{})
	f.Add([]byte{0x1a, 0x03, 0x08, 0x01, 0x12})
	lim := batchLimits{messagesMax: 64, messageBytesMax: 1 << 16}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := new(geologinternalv1.RaftBatch)
		if proto.Unmarshal(data, b) != nil {
			return
		}
		msgs, size, err := decodeBatch(b, 1, 2, lim)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrWrongNode) {
				t.Fatalf("error of no sentinel: %v", err)
			}
			return
		}
		if size > len(data) {
			t.Fatalf("size %d over input %d", size, len(data))
		}
		for _, gm := range msgs {
			re, err := encodeMessage(1, gm.Group, gm.Message, false, lim.messageBytesMax)
			if err != nil {
				t.Fatalf("accepted message does not re-encode: %v", err)
			}
			if _, err := decodeMessage(re, gm.Group, 1, 2, false, lim.messageBytesMax); err != nil {
				t.Fatalf("round trip: %v", err)
			}
		}
	})
}

// TestCheckMessageEndsStream: a message that Config.CheckMessage refuses
// (a Raft member's judgement of its payload) ends the stream as malformed,
// and the handler sees nothing of its batch.
func TestCheckMessageEndsStream(t *testing.T) {
	var checked []uint64
	b := startNode(t, 2, "", func(c *Config) {
		c.CheckMessage = func(group GroupID, m *raftpb.Message) error {
			checked = append(checked, m.GetIndex())
			if m.GetIndex() == 13 {
				return errors.New("unlucky")
			}
			return nil
		}
	})
	c := rawClient(t, b)
	hello := &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2}
	batch := func(indexes ...uint64) *geologinternalv1.RaftBatch {
		out := &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2}
		for _, i := range indexes {
			out.Messages = append(out.Messages, &geologinternalv1.GroupMessage{GroupId: 7, Message: encoded(t, msg(raftpb.MsgApp, 1, 2, i))})
		}
		return out
	}
	before := b.tr.Stats().StreamsRejected
	if got := streamOutcome(t, c, hello, batch(1, 2), batch(3, 13, 4), batch(5)); got != codes.InvalidArgument {
		t.Fatalf("status %s, want InvalidArgument", got)
	}
	if b.tr.Stats().StreamsRejected != before+1 {
		t.Fatal("rejection not counted")
	}
	got := b.rec.received()
	if len(got) != 2 || got[0].index != 1 || got[1].index != 2 {
		t.Fatalf("handler got %+v, want the first batch only", got)
	}
	if len(checked) != 4 {
		t.Fatalf("checked %v", checked)
	}
}

// TestEndInbound: a stream its receiver's member refused ends at its next
// batch, as malformed, and delivers nothing more; the sender's next stream
// is taken as usual.
func TestEndInbound(t *testing.T) {
	b := startNode(t, 2, "", nil)
	c := rawClient(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	batch := func(i uint64) *geologinternalv1.RaftBatch {
		return &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2, Messages: []*geologinternalv1.GroupMessage{{GroupId: 7, Message: encoded(t, msg(raftpb.MsgApp, 1, 2, i))}}}
	}
	if err := s.Send(&geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(batch(1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the first batch delivered", func() bool { return b.rec.count() == 1 })
	b.tr.EndInbound(1)
	_ = s.Send(batch(2))
	if _, err := s.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("stream ended with %v, want InvalidArgument", err)
	}
	if b.rec.count() != 1 {
		t.Fatalf("%d messages delivered, want 1", b.rec.count())
	}
	if got := streamOutcome(t, c, &geologinternalv1.RaftBatch{FromNode: 1, ToNode: 2}, batch(3)); got != codes.OK || b.rec.count() != 2 {
		t.Fatalf("next stream: %s, %d delivered", got, b.rec.count())
	}
}
