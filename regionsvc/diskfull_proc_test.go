package regionsvc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// mountTmpfs mounts a tmpfs of sizeMiB at a new directory for the rest of
// the test, or skips the test where mounting is not permitted.
func mountTmpfs(t *testing.T, sizeMiB int) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm,mode=0700", sizeMiB), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v: %s", err, bytes.TrimSpace(out))
	}
	// Registered before the node starts, so it runs after the node is killed.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes a ballast file in dir until the device is full.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ballast")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill: %v", err)
			}
			break
		}
	}
	// Smaller writes fill the last partial chunk's worth too.
	for _, n := range []int{4096, 512, 1} {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
	return path
}

// TestDiskFullProc: geologd with its data directory on a small tmpfs, as a
// region of one and as a replicated region of one. The disk is filled
// behind the node's back: appends get a retriable UNAVAILABLE (never a
// stopped range), every acknowledged record stays readable, and once the
// ballast is removed appends succeed again without a restart; no
// acknowledged record is lost.
func TestDiskFullProc(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	for _, mode := range []string{"single", "raft"} {
		t.Run(mode, func(t *testing.T) { testDiskFullProc(t, mode) })
	}
}

func testDiskFullProc(t *testing.T, mode string) {
	mnt := mountTmpfs(t, 8)
	addr := nodeproc.FreeAddr(t)
	args := []string{"--segment-bytes-max", "262144"}
	if mode == "raft" {
		args = append(args, "--node-id", "1", "--peers", "1="+addr)
	}
	nodeproc.Start(t, filepath.Join(mnt, "data"), addr, args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := geologv1.NewLogClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitFor(t, ctx, "the stream to be created", func() bool {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "full", RangeCount: 1})
		return err == nil || rpcerr.CodeOf(err) == apierr.StreamExists
	})

	acked := map[uint64]string{} // offset → value
	seq := uint64(0)
	appendOne := func(timeout time.Duration) error {
		actx, acancel := context.WithTimeout(ctx, timeout)
		defer acancel()
		v := fmt.Sprintf("v%06d-%s", seq, bytes.Repeat([]byte("x"), 2000))
		res, err := c.Append(actx, &geologv1.AppendRequest{Stream: "full", ProducerId: 5, BaseSequence: seq,
			Records: []*geologv1.Record{{Key: []byte("k"), Value: []byte(v)}}})
		if err == nil {
			acked[res.GetBaseOffset()] = v
			seq++
		}
		return err
	}
	waitFor(t, ctx, "a first append", func() bool { return appendOne(5*time.Second) == nil })
	for range 50 {
		if err := appendOne(10 * time.Second); err != nil {
			t.Fatalf("append before the disk filled: %v", err)
		}
	}

	ballast := fillDisk(t, mnt)
	var refused error
	waitFor(t, ctx, "an append refused as UNAVAILABLE", func() bool {
		err := appendOne(2 * time.Second)
		if err == nil {
			return false // it still fitted (a page the node had)
		}
		if e := rpcerr.FromError(err); e.Code == apierr.Unavailable {
			refused = e
			return true
		}
		// A raft leader holds the append it could not write (no ack,
		// no answer yet): the client's deadline ends it.
		if e := rpcerr.FromError(err); e.Code != apierr.Timeout {
			t.Fatalf("append on a full disk: %v, want UNAVAILABLE or a timeout", err)
		}
		return false
	})
	if e := rpcerr.FromError(refused); !e.Retriable {
		t.Fatalf("refusal %v is not retriable", refused)
	}
	t.Logf("full disk: %v", refused)
	checkAcked(t, ctx, c, acked)

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "appends to resume once space is freed", func() bool {
		err := appendOne(2 * time.Second)
		if err != nil && rpcerr.FromError(err).Code == apierr.Corruption {
			t.Fatalf("append after space returned: %v", err)
		}
		return err == nil
	})
	for range 10 {
		if err := appendOne(10 * time.Second); err != nil {
			t.Fatalf("append after space returned: %v", err)
		}
	}
	checkAcked(t, ctx, c, acked)
}

// checkAcked reads the range from its start and checks that every
// acknowledged record is there with its value, offsets dense.
func checkAcked(t *testing.T, ctx context.Context, c geologv1.LogClient, acked map[uint64]string) {
	t.Helper()
	seen := map[uint64]string{}
	next := uint64(0)
	for {
		res, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "full", FromOffset: next, MaxRecords: 500})
		if err != nil {
			t.Fatalf("read from %d: %v", next, err)
		}
		for _, r := range res.GetRecords() {
			if r.GetOffset() != next {
				t.Fatalf("read offset %d, want %d", r.GetOffset(), next)
			}
			seen[r.GetOffset()] = string(r.GetValue())
			next++
		}
		if len(res.GetRecords()) == 0 || next >= res.GetTailOffset() {
			break
		}
	}
	for off, v := range acked {
		if seen[off] != v {
			t.Fatalf("acknowledged record at offset %d: read %.12q, want %.12q", off, seen[off], v)
		}
	}
}
