package raftnet

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SendSnapshot implements Transport. The transfer runs on a connection of
// its own, so a multi-megabyte body never queues ahead of heartbeats on the
// peer's message stream.
func (t *GRPCTransport) SendSnapshot(group GroupID, msg *raftpb.Message, body io.ReadCloser) error {
	err := t.startSnapshot(group, msg, body)
	if err != nil {
		t.stats.snapshotsSendFailed.Add(1)
		if cerr := body.Close(); cerr != nil {
			t.logger.Debug("close snapshot body", "error", cerr)
		}
	}
	return err
}

func (t *GRPCTransport) startSnapshot(group GroupID, msg *raftpb.Message, body io.ReadCloser) error {
	if t.closed.Load() {
		return ErrClosed
	}
	header, err := encodeMessage(t.self, group, msg, true, t.cfg.MessageBytesMax)
	if err != nil {
		return err
	}
	to := NodeID(msg.GetTo())
	select {
	case t.snapshotSendSlots <- struct{}{}:
	default:
		return fmt.Errorf("%w: %d being sent", ErrSnapshotsBusy, cap(t.snapshotSendSlots))
	}
	t.mu.Lock()
	addr, ok := t.addrs[to]
	closed := t.closed.Load()
	if ok && !closed {
		t.snapshotsWG.Add(1)
	}
	t.mu.Unlock()
	if closed || !ok {
		<-t.snapshotSendSlots
		if closed {
			return ErrClosed
		}
		return fmt.Errorf("%w: node %d has no address", ErrUnknownNode, to)
	}
	go func() {
		defer t.snapshotsWG.Done()
		defer func() { <-t.snapshotSendSlots }()
		n, err := t.sendSnapshot(addr, to, group, header, body)
		if cerr := body.Close(); cerr != nil {
			t.logger.Debug("close snapshot body", "error", cerr)
		}
		if err != nil {
			t.stats.snapshotsSendFailed.Add(1)
			t.logger.Warn("snapshot send failed", "peer", uint64(to), "group", uint64(group), "error", err)
		} else {
			t.stats.snapshotsSent.Add(1)
			t.stats.snapshotBytesSent.Add(n)
			t.logger.Debug("snapshot sent", "peer", uint64(to), "group", uint64(group), "bytes", n)
		}
		t.h.ReportSnapshot(to, group, err)
	}()
	return nil
}

// sendSnapshot streams header, body chunks and trailer, and waits for the
// receiver's acknowledgement. It returns the body length.
func (t *GRPCTransport) sendSnapshot(addr string, to NodeID, group GroupID, header []byte, body io.Reader) (uint64, error) {
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.SnapshotTimeout)
	defer cancel()
	conn, err := t.dial(addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	stream, err := geologinternalv1.NewRaftTransportClient(conn).Snapshot(ctx)
	if err != nil {
		return 0, fromStatus(err)
	}
	send := func(c *geologinternalv1.SnapshotChunk) error {
		if err := stream.Send(c); err != nil {
			if errors.Is(err, io.EOF) { // the receiver ended the call: its status says why
				_, err = stream.CloseAndRecv()
			}
			return fmt.Errorf("raftnet: snapshot to node %d: %w", to, fromStatus(err))
		}
		return nil
	}
	err = send(&geologinternalv1.SnapshotChunk{Kind: &geologinternalv1.SnapshotChunk_Header{Header: &geologinternalv1.SnapshotHeader{
		FromNode: uint64(t.self), ToNode: uint64(to), GroupId: uint64(group), Message: header,
	}}})
	if err != nil {
		return 0, err
	}
	buf := make([]byte, t.cfg.SnapshotChunkBytes)
	data := &geologinternalv1.SnapshotChunk_Data{}
	chunk := &geologinternalv1.SnapshotChunk{Kind: data}
	var total uint64
	var crc uint32
	for {
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			total += uint64(n)
			if total > uint64(t.cfg.SnapshotBytesMax) {
				return 0, fmt.Errorf("%w: over %d bytes", ErrSnapshotTooLarge, t.cfg.SnapshotBytesMax)
			}
			crc = crc32.Update(crc, castagnoli, buf[:n])
			data.Data = buf[:n] // Send encodes before it returns, so buf is reused
			if err := send(chunk); err != nil {
				return 0, err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			// Returning cancels the call, so the receiver's body fails too.
			return 0, fmt.Errorf("raftnet: read snapshot body: %w", rerr)
		}
	}
	err = send(&geologinternalv1.SnapshotChunk{Kind: &geologinternalv1.SnapshotChunk_Trailer{Trailer: &geologinternalv1.SnapshotTrailer{
		BodyBytes: total, BodyCrc32C: crc,
	}}})
	if err != nil {
		return 0, err
	}
	ack, err := stream.CloseAndRecv()
	if err != nil {
		return 0, fmt.Errorf("raftnet: snapshot to node %d: %w", to, fromStatus(err))
	}
	if ack.GetBodyBytes() != total {
		return 0, fmt.Errorf("%w: receiver acknowledged %d of %d bytes", ErrSnapshotCorrupt, ack.GetBodyBytes(), total)
	}
	return total, nil
}

// receiveSnapshot serves one inbound Snapshot call: check the header, take
// a receive slot, hand the body to the handler, then make sure the whole
// body arrived intact before acknowledging.
func (t *GRPCTransport) receiveSnapshot(stream grpc.ClientStreamingServer[geologinternalv1.SnapshotChunk, geologinternalv1.SnapshotAck]) (err error) {
	if t.closed.Load() {
		return ErrClosed
	}
	first := new(geologinternalv1.SnapshotChunk)
	if err := stream.RecvMsg(first); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: empty snapshot call", ErrMalformed)
		}
		return err
	}
	defer func() {
		if err != nil {
			t.stats.snapshotsReceiveFailed.Add(1)
			if errors.Is(err, ErrUnknownGroup) {
				t.stats.unknownGroupMessages.Add(1)
			}
		}
	}()
	hdr := first.GetHeader()
	if hdr == nil {
		return fmt.Errorf("%w: snapshot does not start with a header", ErrMalformed)
	}
	from, group := NodeID(hdr.GetFromNode()), GroupID(hdr.GetGroupId())
	if NodeID(hdr.GetToNode()) != t.self {
		return fmt.Errorf("%w: snapshot for node %d reached node %d", ErrWrongNode, hdr.GetToNode(), t.self)
	}
	if err := t.authorize(stream.Context(), from); err != nil {
		return err
	}
	msg, err := decodeMessage(hdr.GetMessage(), group, from, t.self, true, t.cfg.MessageBytesMax)
	if err != nil {
		return err
	}
	if t.cfg.CheckMessage != nil {
		if err := t.cfg.CheckMessage(group, msg); err != nil {
			return fmt.Errorf("%w: snapshot header: %w", ErrMalformed, err)
		}
	}
	select {
	case t.snapshotRecvSlots <- struct{}{}:
		defer func() { <-t.snapshotRecvSlots }()
	default:
		return fmt.Errorf("%w: %d being received", ErrSnapshotsBusy, cap(t.snapshotRecvSlots))
	}
	body := &snapshotBody{
		recv:     stream.RecvMsg,
		bytesMax: uint64(t.cfg.SnapshotBytesMax),
		closed:   t.closed.Load,
	}
	if err := t.h.HandleSnapshot(from, group, msg, body); err != nil {
		t.logger.Warn("snapshot refused", "from", uint64(from), "group", uint64(group), "error", err)
		return err
	}
	if err := body.finish(); err != nil {
		return err
	}
	t.stats.snapshotsReceived.Add(1)
	t.stats.snapshotBytesRecvd.Add(body.n)
	return stream.SendAndClose(&geologinternalv1.SnapshotAck{BodyBytes: body.n})
}

// snapshotBody is the io.Reader a Handler reads an inbound snapshot from.
// It reads chunks on demand (no goroutine), checks each against the bounds,
// and returns io.EOF only after a trailer whose length and CRC-32C match
// what arrived and the sender's half-close. Errors are sticky.
type snapshotBody struct {
	recv     func(any) error
	bytesMax uint64
	closed   func() bool

	cur []byte // unread rest of the current chunk
	n   uint64 // body bytes received so far
	crc uint32
	err error // sticky; io.EOF once complete
}

func (b *snapshotBody) Read(p []byte) (int, error) {
	for len(b.cur) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		b.err = b.next()
	}
	n := copy(p, b.cur)
	b.cur = b.cur[n:]
	return n, nil
}

// next receives one chunk into cur, or returns why the body ends.
func (b *snapshotBody) next() error {
	if b.closed() {
		return ErrClosed
	}
	c := new(geologinternalv1.SnapshotChunk)
	if err := b.recv(c); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: ended after %d bytes without a trailer", ErrSnapshotCorrupt, b.n)
		}
		return fmt.Errorf("%w: after %d bytes: %w", ErrSnapshotCorrupt, b.n, err)
	}
	switch k := c.GetKind().(type) {
	case *geologinternalv1.SnapshotChunk_Data:
		if len(k.Data) > snapshotChunkBytesLimit {
			return fmt.Errorf("%w: chunk of %d bytes, bound %d", ErrSnapshotCorrupt, len(k.Data), snapshotChunkBytesLimit)
		}
		b.n += uint64(len(k.Data))
		if b.n > b.bytesMax {
			return fmt.Errorf("%w: over %d bytes", ErrSnapshotTooLarge, b.bytesMax)
		}
		b.crc = crc32.Update(b.crc, castagnoli, k.Data)
		b.cur = k.Data
		return nil
	case *geologinternalv1.SnapshotChunk_Trailer:
		if k.Trailer.GetBodyBytes() != b.n || k.Trailer.GetBodyCrc32C() != b.crc {
			return fmt.Errorf("%w: trailer says %d bytes crc %08x, got %d bytes crc %08x",
				ErrSnapshotCorrupt, k.Trailer.GetBodyBytes(), k.Trailer.GetBodyCrc32C(), b.n, b.crc)
		}
		if err := b.recv(new(geologinternalv1.SnapshotChunk)); !errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: more after the trailer (%v)", ErrSnapshotCorrupt, err)
		}
		return io.EOF
	default:
		return fmt.Errorf("%w: unexpected chunk after %d bytes", ErrSnapshotCorrupt, b.n)
	}
}

// finish reads whatever the handler left unread and reports whether the
// body was complete and intact.
func (b *snapshotBody) finish() error {
	b.cur = nil
	for b.err == nil {
		b.err = b.next()
		b.cur = nil
	}
	if errors.Is(b.err, io.EOF) {
		return nil
	}
	return b.err
}
