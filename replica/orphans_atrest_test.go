package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// testKeyring opens a keyring of its own on an in-memory file system.
func testKeyring(t *testing.T, seed uint64) *atrest.Keyring {
	t.Helper()
	secret := bytes.Repeat([]byte{byte(seed)}, 32)
	kek, err := atrest.NewMemKEK("test-kek", secret)
	if err != nil {
		t.Fatal(err)
	}
	k, err := atrest.Open(context.Background(), atrest.Config{Dir: "/keys", FS: vfs.NewMem(rand.New(rand.NewPCG(seed, 1))), KEK: kek, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// TestOrphanStoreSealed: with a keyring, a fork's frames lie on disk only
// sealed (the marker in every record is nowhere in the directory), read
// back identical after a reopen, go out to a snapshot in the clear (the
// bytes a store without a keyring holds for the same fork) and are sealed
// again by a receiver with another keyring. A flipped bit in a unit is
// corruption on read; a store without the keyring, or with another one,
// refuses to open with atrest.ErrKeyUnavailable.
func TestOrphanStoreSealed(t *testing.T) {
	marker := []byte("orphan-marker-7f3a9c")
	var frames [][]byte
	for i := uint64(0); i < 30; i++ {
		recs := []batch.Record{{Key: []byte("k"), Value: append(bytes.Repeat([]byte{byte(i)}, 2500), marker...)}, {Value: marker}}
		frames = append(frames, batch.Encode(nil, batch.Header{BaseOffset: 10 + 2*i, Epoch: 1, ProducerID: 5, Term: 2, Index: 20 + i}, recs))
	}
	src := func(emit func([]byte) error) error {
		for _, f := range frames {
			if err := emit(f); err != nil {
				return err
			}
		}
		return nil
	}
	rec := ForkRecord{Index: 70, Term: 3, PrevIndex: 19, At: 10, Epoch: 2, FirstOffset: 10, NextOffset: 70}
	fs := vfs.NewMem(rand.New(rand.NewPCG(3, 4)))
	dir := "/r/" + OrphanDirName
	k := testKeyring(t, 1)
	o, err := OpenOrphans(fs, dir, nil, WithKeyring(k))
	if err != nil {
		t.Fatal(err)
	}
	got, wrote, err := o.writeFork(rec, src, nil)
	if err != nil || !wrote || got.Frames != 30 || got.Bytes != uint64(len(bytes.Join(frames, nil))) {
		t.Fatalf("write: %+v %v %v", got, wrote, err)
	}
	file, err := vfs.ReadFile(fs, dir+"/"+forkFileName(70), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(file, marker) {
		t.Fatal("the sealed fork's file holds the marker in the clear")
	}
	if int64(len(file)) != got.fileBytes(true) {
		t.Fatalf("file of %d bytes, want %d", len(file), got.fileBytes(true))
	}
	if keys, err := ForkFileKeys(fs, dir+"/"+forkFileName(70)); err != nil || len(keys) != 1 || keys[k.Active()] != 30 {
		t.Fatalf("ForkFileKeys: %v %v, want 30 frames under %v", keys, err, k.Active())
	}
	// A plain store of the same fork: what a snapshot must carry.
	plainFS := vfs.NewMem(rand.New(rand.NewPCG(5, 6)))
	plain, err := OpenOrphans(plainFS, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.writeFork(rec, src, nil); err != nil {
		t.Fatal(err)
	}
	plainFile, err := vfs.ReadFile(plainFS, dir+"/"+forkFileName(70), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := ForkFileKeys(plainFS, dir+"/"+forkFileName(70)); err != nil || len(keys) != 1 || keys[0] != 30 {
		t.Fatalf("ForkFileKeys of a clear fork: %v %v", keys, err)
	}

	if o, err = OpenOrphans(fs, dir, nil, WithKeyring(k)); err != nil || len(o.Forks()) != 1 || o.Forks()[0] != got {
		t.Fatalf("reopen: %+v %v", o.Forks(), err)
	}
	if b, err := o.ReadFrames(70, 10, 1<<30); err != nil || !bytes.Equal(b, bytes.Join(frames, nil)) {
		t.Fatalf("read all: %d bytes, %v", len(b), err)
	}
	for _, from := range []uint64{11, 40, 69} {
		b, err := o.ReadFrames(70, from, 1)
		if err != nil || !bytes.Equal(b, frames[(from-10)/2]) {
			t.Fatalf("read from %d: %d bytes, %v", from, len(b), err)
		}
	}
	// The clear view, read in order as a snapshot does, and once out of
	// order.
	f, rec2, err := o.openFork(70)
	if err != nil {
		t.Fatal(err)
	}
	clear, err := io.ReadAll(io.NewSectionReader(f, 0, int64(forkRecordBytes)+int64(rec2.Bytes)))
	if err != nil || !bytes.Equal(clear, plainFile) {
		t.Fatalf("clear view: %d bytes (%v), want the plain store's %d", len(clear), err, len(plainFile))
	}
	part := make([]byte, 100)
	if _, err := f.ReadAt(part, int64(forkRecordBytes)+5); err != nil || !bytes.Equal(part, plainFile[forkRecordBytes+5:forkRecordBytes+105]) {
		t.Fatalf("clear view read behind: %v", err)
	}
	f.Close()
	// A receiver with its own keyring seals what it stores under its key.
	rfs := vfs.NewMem(rand.New(rand.NewPCG(7, 8)))
	k2 := testKeyring(t, 2)
	recv, err := OpenOrphans(rfs, dir, nil, WithKeyring(k2))
	if err != nil {
		t.Fatal(err)
	}
	p, n, err := recv.receiveFork(bytes.NewReader(clear))
	if err != nil || p == nil || n != uint64(len(clear)) {
		t.Fatalf("receive: %v %d %v", p, n, err)
	}
	if err := recv.commit([]*pendingFork{p}); err != nil {
		t.Fatal(err)
	}
	if b, err := recv.ReadFrames(70, 10, 1<<30); err != nil || !bytes.Equal(b, bytes.Join(frames, nil)) {
		t.Fatalf("receiver reads %d bytes, %v", len(b), err)
	}
	rfile, _ := vfs.ReadFile(rfs, dir+"/"+forkFileName(70), 1<<30)
	if bytes.Contains(rfile, marker) {
		t.Fatal("the receiver stored the fork in the clear")
	}
	if _, err := OpenOrphans(rfs, dir, nil, WithKeyring(k)); !errors.Is(err, atrest.ErrKeyUnavailable) {
		t.Fatalf("the receiver's fork opened with the sender's keyring: %v", err)
	}
	if _, err := OpenOrphans(fs, dir, nil); !errors.Is(err, atrest.ErrKeyUnavailable) {
		t.Fatalf("a sealed fork opened without a keyring: %v", err)
	}
	// A flipped bit inside a unit: corruption, on read.
	fs2 := fs.Crash()
	df, err := fs2.OpenFile(dir+"/"+forkFileName(70), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	at := int64(forkRecordBytes) + int64(len(frames[0])) + atrest.Overhead + 300
	b := []byte{0}
	df.ReadAt(b, at)
	df.WriteAt([]byte{b[0] ^ 0x10}, at)
	df.Close()
	o2, err := OpenOrphans(fs2, dir, nil, WithKeyring(k))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o2.ReadFrames(70, 10, 1<<30); !errors.Is(err, ErrOrphansCorrupt) || !errors.Is(err, atrest.ErrAuth) {
		t.Fatalf("read of a damaged unit: %v, want ErrOrphansCorrupt carrying atrest.ErrAuth", err)
	}
	f3, rec3, err := o2.openFork(70)
	if err != nil {
		t.Fatal(err)
	}
	defer f3.Close()
	if _, err := io.ReadAll(io.NewSectionReader(f3, 0, int64(forkRecordBytes)+int64(rec3.Bytes))); !errors.Is(err, ErrOrphansCorrupt) {
		t.Fatalf("snapshot read of a damaged unit: %v, want ErrOrphansCorrupt", err)
	}
	// A sealed record on the wire is refused: snapshots carry clear forks.
	if _, _, err := recv.receiveFork(bytes.NewReader(file)); !errors.Is(err, ErrOrphansCorrupt) {
		t.Fatalf("a sealed fork received: %v", err)
	}
}

// TestOrphanReseal: a fork written in the clear, and then one under a
// rotated-out key, is pending re-encryption; Reseal rewrites it under the
// active key while readers read it (they always get the same frames), an
// ended context replaces nothing, and the store reopens and reads it.
func TestOrphanReseal(t *testing.T) {
	var frames [][]byte
	for i := uint64(0); i < 40; i++ {
		recs := []batch.Record{{Key: []byte("k"), Value: bytes.Repeat([]byte{byte(i)}, 3000)}}
		frames = append(frames, batch.Encode(nil, batch.Header{BaseOffset: 10 + i, Epoch: 1, Term: 2, Index: 20 + i}, recs))
	}
	all := bytes.Join(frames, nil)
	src := func(emit func([]byte) error) error {
		for _, f := range frames {
			if err := emit(f); err != nil {
				return err
			}
		}
		return nil
	}
	fs := vfs.NewMem(rand.New(rand.NewPCG(9, 10)))
	dir := "/r/" + OrphanDirName
	path := dir + "/" + forkFileName(70)
	plain, err := OpenOrphans(fs, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.writeFork(ForkRecord{Index: 70, Term: 3, PrevIndex: 19, At: 10, Epoch: 2, FirstOffset: 10, NextOffset: 50}, src, nil); err != nil {
		t.Fatal(err)
	}
	k := testKeyring(t, 3)
	o, err := OpenOrphans(fs, dir, nil, WithKeyring(k))
	if err != nil {
		t.Fatal(err)
	}
	reseal := func(ctx context.Context) error {
		var stop atomic.Bool
		var wg sync.WaitGroup
		var bad atomic.Pointer[string]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if b, err := o.ReadFrames(70, 10+uint64(len(frames))/2, 1<<30); err != nil || !bytes.Equal(b, bytes.Join(frames[len(frames)/2:], nil)) {
					msg := fmt.Sprintf("%d bytes, %v", len(b), err)
					bad.Store(&msg)
					return
				}
			}
		}()
		err := o.Reseal(ctx, 70, nil)
		stop.Store(true)
		wg.Wait()
		if p := bad.Load(); p != nil {
			t.Fatalf("read during the reseal: %s", *p)
		}
		return err
	}
	for round := range 2 {
		if p := o.ResealPending(); len(p) != 1 || p[0] != 70 {
			t.Fatalf("round %d: pending %v", round, p)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := reseal(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("reseal with an ended context: %v", err)
		}
		if p := o.ResealPending(); len(p) != 1 {
			t.Fatalf("an abandoned reseal changed what is pending: %v", p)
		}
		if err := reseal(context.Background()); err != nil {
			t.Fatal(err)
		}
		if p := o.ResealPending(); len(p) != 0 {
			t.Fatalf("pending after the reseal: %v", p)
		}
		if keys, err := ForkFileKeys(fs, path); err != nil || len(keys) != 1 || keys[k.Active()] != 40 {
			t.Fatalf("round %d: frames by key %v %v, want 40 under %v", round, keys, err, k.Active())
		}
		if b, err := o.ReadFrames(70, 10, 1<<30); err != nil || !bytes.Equal(b, all) {
			t.Fatalf("round %d: read %d bytes, %v", round, len(b), err)
		}
		if _, err := k.Rotate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if o, err = OpenOrphans(fs, dir, nil, WithKeyring(k)); err != nil {
		t.Fatal(err)
	}
	if b, err := o.ReadFrames(70, 10, 1<<30); err != nil || !bytes.Equal(b, all) {
		t.Fatalf("reopened: read %d bytes, %v", len(b), err)
	}
	if ents, _ := fs.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("orphan store holds %d files, want the fork only", len(ents))
	}
}
