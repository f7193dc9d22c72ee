package raftnet

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// testLogger routes logs to t.Log.
func testLogger(t testing.TB, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   name,
		Level:  hclog.Debug,
		Output: testWriter{t},
	})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// msg builds a network Raft message; index doubles as a sequence number in
// the tests.
func msg(typ raftpb.MessageType, from, to NodeID, index uint64) *raftpb.Message {
	return &raftpb.Message{
		Type:  typ.Enum(),
		From:  proto.Uint64(uint64(from)),
		To:    proto.Uint64(uint64(to)),
		Term:  proto.Uint64(1),
		Index: proto.Uint64(index),
	}
}

// appMsg is a MsgApp carrying one entry of entryBytes bytes.
func appMsg(from, to NodeID, index uint64, entryBytes int) *raftpb.Message {
	m := msg(raftpb.MsgApp, from, to, index)
	m.Entries = []*raftpb.Entry{{
		Term:  proto.Uint64(1),
		Index: proto.Uint64(index + 1),
		Type:  raftpb.EntryNormal.Enum(),
		Data:  make([]byte, entryBytes),
	}}
	return m
}

// snapMsg is a MsgSnap with metadata.
func snapMsg(from, to NodeID, index uint64) *raftpb.Message {
	m := msg(raftpb.MsgSnap, from, to, 0)
	m.Snapshot = &raftpb.Snapshot{
		Data: []byte("segment-manifest"),
		Metadata: &raftpb.SnapshotMetadata{
			ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
			Index:     proto.Uint64(index),
			Term:      proto.Uint64(1),
		},
	}
	return m
}

// received is one message as a recorder saw it.
type received struct {
	from  NodeID
	group GroupID
	typ   raftpb.MessageType
	index uint64
}

// recorder is a Handler that records everything, for assertions.
type recorder struct {
	mu sync.Mutex
	// knownGroups, when set, makes every other group unknown.
	knownGroups map[GroupID]bool
	msgs        []received
	batches     int
	unreachable map[NodeID][]GroupID
	snapReports []snapReport
	snapshots   []snapReceived
	// snapshotErr, when set, is returned by HandleSnapshot after reading
	// the body.
	snapshotErr error
	// block, when set, makes HandleMessages wait on it.
	block chan struct{}
	// onMessages, when set, is called after recording (outside the lock).
	onMessages func(from NodeID, msgs []GroupMessage)
}

type snapReport struct {
	to    NodeID
	group GroupID
	err   error
}

type snapReceived struct {
	from     NodeID
	group    GroupID
	index    uint64
	bodySize int64
	sha      [32]byte
	readErr  error
}

func newRecorder() *recorder {
	return &recorder{unreachable: make(map[NodeID][]GroupID)}
}

func (r *recorder) HandleMessages(from NodeID, msgs []GroupMessage) int {
	if r.block != nil {
		<-r.block
	}
	r.mu.Lock()
	unknown := 0
	r.batches++
	for _, gm := range msgs {
		if r.knownGroups != nil && !r.knownGroups[gm.Group] {
			unknown++
			continue
		}
		r.msgs = append(r.msgs, received{from: from, group: gm.Group, typ: gm.Message.GetType(), index: gm.Message.GetIndex()})
	}
	cb := r.onMessages
	r.mu.Unlock()
	if cb != nil {
		cb(from, msgs)
	}
	return unknown
}

func (r *recorder) HandleSnapshot(from NodeID, group GroupID, m *raftpb.Message, body io.Reader) error {
	h := sha256.New()
	n, err := io.Copy(h, body)
	r.mu.Lock()
	defer r.mu.Unlock()
	s := snapReceived{from: from, group: group, index: m.GetSnapshot().GetMetadata().GetIndex(), bodySize: n, readErr: err}
	copy(s.sha[:], h.Sum(nil))
	r.snapshots = append(r.snapshots, s)
	if err != nil {
		return err
	}
	return r.snapshotErr
}

func (r *recorder) ReportUnreachable(to NodeID, groups []GroupID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unreachable[to] = append(r.unreachable[to], groups...)
}

func (r *recorder) ReportSnapshot(to NodeID, group GroupID, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snapReports = append(r.snapReports, snapReport{to: to, group: group, err: err})
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *recorder) received() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.msgs...)
}

func (r *recorder) unreachableGroups(to NodeID) []GroupID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]GroupID(nil), r.unreachable[to]...)
}

func (r *recorder) snapshotReports() []snapReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]snapReport(nil), r.snapReports...)
}

func (r *recorder) snapshotsReceived() []snapReceived {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]snapReceived(nil), r.snapshots...)
}

// waitFor polls cond every 5 ms until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testNode is one transport serving on loopback.
type testNode struct {
	id   NodeID
	tr   *GRPCTransport
	rec  *recorder
	srv  *grpc.Server
	addr string
}

// fastConfig returns a config with test-friendly timings.
func fastConfig(t testing.TB, id NodeID, h Handler) Config {
	return Config{
		NodeID:  id,
		Handler: h,
		Logger:  testLogger(t, fmt.Sprintf("n%d", id)),
		// HandshakeTimeout: the default (5 s). Messages queued behind a
		// handshake that times out are dropped (Raft resends), and on a
		// busy machine a stream with its hello took over 2 s, the first
		// version's value here: TestThreeNodesManyGroups lost messages.
		ReconnectBackoffMin: 10 * time.Millisecond,
		ReconnectBackoffMax: 100 * time.Millisecond,
	}
}

// startNode starts a transport and a grpc.Server for it on addr ("" for an
// ephemeral loopback port). mod edits the config; serverOpts add to the
// server's options (TLS credentials). Both stop at cleanup.
func startNode(t testing.TB, id NodeID, addr string, mod func(*Config), serverOpts ...grpc.ServerOption) *testNode {
	t.Helper()
	rec := newRecorder()
	cfg := fastConfig(t, id, rec)
	if mod != nil {
		mod(&cfg)
	}
	tr, err := NewGRPCTransport(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	// Re-binding a just-freed port can race the kernel briefly.
	deadline := time.Now().Add(5 * time.Second)
	for {
		lis, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	opts := append(tr.ServerOptions(), grpc.WaitForHandlers(true))
	srv := grpc.NewServer(append(opts, serverOpts...)...)
	tr.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	n := &testNode{id: id, tr: tr, rec: rec, srv: srv, addr: lis.Addr().String()}
	t.Cleanup(n.stop)
	return n
}

// stop closes the transport and the server (idempotent).
func (n *testNode) stop() {
	_ = n.tr.Close()
	n.srv.Stop()
}

// connect puts every node in every other's address book.
func connect(t testing.TB, nodes ...*testNode) {
	t.Helper()
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if err := a.tr.SetPeer(b.id, b.addr); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}
