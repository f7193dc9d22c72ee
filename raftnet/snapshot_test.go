package raftnet

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// bodySource is a snapshot body of size pseudo-random bytes (seeded, so the
// receiver's hash can be checked), failing with failErr after failAt bytes
// when failErr is set. It records Close.
type bodySource struct {
	size    int64
	seed    uint64
	failAt  int64
	failErr error

	off    int64
	rng    *rand.ChaCha8
	closed atomic.Int32
}

func (b *bodySource) Read(p []byte) (int, error) {
	if b.rng == nil {
		var seed [32]byte
		seed[0] = byte(b.seed)
		b.rng = rand.NewChaCha8(seed)
	}
	if b.failErr != nil && b.off >= b.failAt {
		return 0, b.failErr
	}
	if b.off >= b.size {
		return 0, io.EOF
	}
	n := int64(len(p))
	if left := b.size - b.off; n > left {
		n = left
	}
	if b.failErr != nil && b.off+n > b.failAt {
		n = b.failAt - b.off
	}
	_, _ = b.rng.Read(p[:n]) // ChaCha8.Read never fails
	b.off += n
	return int(n), nil
}

func (b *bodySource) Close() error {
	b.closed.Add(1)
	return nil
}

// sum is the SHA-256 of the whole body of a source like b.
func (b *bodySource) sum() [32]byte {
	h := sha256.New()
	if _, err := io.Copy(h, &bodySource{size: b.size, seed: b.seed}); err != nil {
		panic(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

func TestSnapshotMultiMB(t *testing.T) {
	mod := func(c *Config) { c.SnapshotChunkBytes = 256 << 10 }
	a, b := startNode(t, 1, "", mod), startNode(t, 2, "", mod)
	connect(t, a, b)
	const size = 8<<20 + 12345
	body := &bodySource{size: size, seed: 7}
	if err := a.tr.SendSnapshot(42, snapMsg(1, 2, 1000), body); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "snapshot report", func() bool { return len(a.rec.snapshotReports()) == 1 })
	rep := a.rec.snapshotReports()[0]
	if rep.err != nil || rep.to != 2 || rep.group != 42 {
		t.Fatalf("report %+v", rep)
	}
	got := b.rec.snapshotsReceived()
	if len(got) != 1 {
		t.Fatalf("%d snapshots received", len(got))
	}
	s := got[0]
	if s.from != 1 || s.group != 42 || s.index != 1000 || s.bodySize != size || s.sha != body.sum() || s.readErr != nil {
		t.Fatalf("received %+v", s)
	}
	if body.closed.Load() != 1 {
		t.Fatalf("body closed %d times", body.closed.Load())
	}
	as, bs := a.tr.Stats(), b.tr.Stats()
	if as.SnapshotsSent != 1 || as.SnapshotBytesSent != size || bs.SnapshotsReceived != 1 || bs.SnapshotBytesReceived != size {
		t.Fatalf("stats %+v / %+v", as, bs)
	}
	// The message stream was never needed for it.
	if as.StreamsOpened != 0 {
		t.Fatalf("snapshot opened %d message streams", as.StreamsOpened)
	}
}

func TestSnapshotFailures(t *testing.T) {
	a, b := startNode(t, 1, "", nil), startNode(t, 2, "", func(c *Config) { c.SnapshotBytesMax = 1 << 20 })
	connect(t, a, b)
	wait := func(n int) snapReport {
		t.Helper()
		waitFor(t, 10*time.Second, "snapshot report", func() bool { return len(a.rec.snapshotReports()) == n })
		return a.rec.snapshotReports()[n-1]
	}

	// The receiving handler refuses: the sender hears why.
	b.rec.snapshotErr = fmt.Errorf("group 9: %w", ErrUnknownGroup)
	if err := a.tr.SendSnapshot(9, snapMsg(1, 2, 10), &bodySource{size: 1000}); err != nil {
		t.Fatal(err)
	}
	if rep := wait(1); !errors.Is(rep.err, ErrUnknownGroup) {
		t.Fatalf("refused snapshot: %v", rep.err)
	}
	if got := b.tr.Stats().UnknownGroupMessages; got != 1 {
		t.Fatalf("unknown group count %d", got)
	}
	b.rec.snapshotErr = nil

	// The source fails midway: the receiver's body fails too (not a
	// clean EOF), and the sender hears its own error.
	srcErr := errors.New("disk read failed")
	body := &bodySource{size: 3 << 20, failAt: 1<<20 + 17, failErr: srcErr}
	if err := a.tr.SendSnapshot(1, snapMsg(1, 2, 10), body); err != nil {
		t.Fatal(err)
	}
	if rep := wait(2); !errors.Is(rep.err, srcErr) {
		t.Fatalf("failed source: %v", rep.err)
	}
	waitFor(t, 5*time.Second, "receiver side", func() bool { return len(b.rec.snapshotsReceived()) == 2 })
	if rerr := b.rec.snapshotsReceived()[1].readErr; rerr == nil {
		t.Fatal("receiver read a truncated body to a clean EOF")
	}

	// Over the receiver's bound.
	if err := a.tr.SendSnapshot(1, snapMsg(1, 2, 10), &bodySource{size: 2 << 20}); err != nil {
		t.Fatal(err)
	}
	if rep := wait(3); !errors.Is(rep.err, ErrSnapshotTooLarge) {
		t.Fatalf("oversized snapshot: %v", rep.err)
	}

	// Refused up front: wrong type, unknown node. The body is closed.
	for _, c := range []struct {
		group GroupID
		m     *raftpb.Message
		want  error
	}{
		{1, msg(raftpb.MsgApp, 1, 2, 1), ErrInvalidMessage},
		{0, snapMsg(1, 2, 1), ErrInvalidMessage},
		{1, snapMsg(1, 7, 1), ErrUnknownNode},
	} {
		src := &bodySource{size: 10}
		err := a.tr.SendSnapshot(c.group, c.m, src)
		if !errors.Is(err, c.want) || src.closed.Load() != 1 {
			t.Fatalf("SendSnapshot: %v (closed %d), want %v", err, src.closed.Load(), c.want)
		}
	}
	if got := a.tr.Stats(); got.SnapshotsSendFailed != 6 || got.SnapshotsSent != 0 {
		t.Fatalf("sender stats %+v", got)
	}
}

func TestSnapshotsInflightBound(t *testing.T) {
	a, b := startNode(t, 1, "", func(c *Config) { c.SnapshotsInflightMax = 1 }), startNode(t, 2, "", nil)
	connect(t, a, b)
	block := make(chan struct{})
	slow := &blockingBody{bodySource: bodySource{size: 1 << 20}, block: block}
	if err := a.tr.SendSnapshot(1, snapMsg(1, 2, 10), slow); err != nil {
		t.Fatal(err)
	}
	if err := a.tr.SendSnapshot(2, snapMsg(1, 2, 10), &bodySource{size: 10}); !errors.Is(err, ErrSnapshotsBusy) {
		t.Fatalf("second snapshot: %v", err)
	}
	close(block)
	waitFor(t, 10*time.Second, "first snapshot", func() bool { return len(a.rec.snapshotReports()) == 1 })
	if rep := a.rec.snapshotReports()[0]; rep.err != nil {
		t.Fatal(rep.err)
	}
}

// blockingBody waits on block before its first byte.
type blockingBody struct {
	bodySource
	block chan struct{}
}

func (b *blockingBody) Read(p []byte) (int, error) {
	<-b.block
	return b.bodySource.Read(p)
}
