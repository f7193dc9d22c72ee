package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// usersNow returns the calls in progress on cf.
func (cf *cachedFile) usersNow() int {
	cf.c.mu.Lock()
	defer cf.c.mu.Unlock()
	return cf.users
}

// countFS counts the base descriptors a Cache holds and fails the test if
// one is closed during a call on it.
type countFS struct {
	FS
	t    *testing.T
	live atomic.Int64
	// block, if set, is waited on by every ReadAt (to hold a call open).
	block chan struct{}
}

func (c *countFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	c.live.Add(1)
	return &countFile{File: f, fs: c}, nil
}

type countFile struct {
	File
	fs    *countFS
	calls atomic.Int32
}

func (f *countFile) call() func() {
	f.calls.Add(1)
	return func() { f.calls.Add(-1) }
}

func (f *countFile) ReadAt(p []byte, off int64) (int, error) {
	defer f.call()()
	if f.fs.block != nil {
		<-f.fs.block
	}
	return f.File.ReadAt(p, off)
}

func (f *countFile) WriteAt(p []byte, off int64) (int, error) {
	defer f.call()()
	return f.File.WriteAt(p, off)
}

func (f *countFile) Datasync() error {
	defer f.call()()
	return f.File.Datasync()
}

func (f *countFile) Close() error {
	if f.calls.Load() != 0 {
		f.fs.t.Errorf("descriptor of %s closed during a call on it", f.Name())
	}
	f.fs.live.Add(-1)
	return f.File.Close()
}

func newCountFS(t *testing.T) *countFS {
	return &countFS{FS: NewMem(rand.New(rand.NewPCG(1, 2))), t: t}
}

func writeSynced(t *testing.T, f File, b []byte) {
	t.Helper()
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Datasync(); err != nil {
		t.Fatal(err)
	}
}

func cacheRead(t *testing.T, f File, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatalf("read %s: %v", f.Name(), err)
	}
	return b
}

// Many more files than the budget: the descriptors stay within it, and
// every file, reopened after its eviction, reads back what was written.
func TestCacheBoundsDescriptors(t *testing.T) {
	base := newCountFS(t)
	base.MkdirAll("/d", 0o700)
	c := NewCache(base, 8)
	var files []File
	for i := range 100 {
		f, err := c.OpenFile(fmt.Sprintf("/d/%03d", i), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		writeSynced(t, f, []byte(fmt.Sprintf("file %03d", i)))
		files = append(files, f)
		if n := base.live.Load(); n > 8 {
			t.Fatalf("%d descriptors open after %d files, budget 8", n, i+1)
		}
	}
	for round := range 3 {
		for i, f := range files {
			if got, want := cacheRead(t, f, 8), fmt.Sprintf("file %03d", i); string(got) != want {
				t.Fatalf("round %d: %s reads %q, want %q", round, f.Name(), got, want)
			}
		}
	}
	st := c.Stats()
	if base.live.Load() > 8 || st.Descriptors > 8 || st.Reopens == 0 || st.Evictions == 0 || st.Files != 100 {
		t.Fatalf("live %d, stats %+v: want at most 8 descriptors, reopens and evictions", base.live.Load(), st)
	}
	for _, f := range files {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := base.live.Load(); n != 0 || c.Stats().Files != 0 {
		t.Fatalf("%d descriptors open after closing every file", n)
	}
	if err := files[0].Close(); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("second Close: %v, want fs.ErrClosed", err)
	}
	if _, err := files[0].ReadAt(make([]byte, 1), 0); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("read after Close: %v, want fs.ErrClosed", err)
	}
}

// A file written and not yet synced keeps its descriptor whatever the
// pressure (a write-back error must reach the descriptor that wrote), and
// so does one whose Datasync failed; a synced one is let go.
func TestCacheKeepsDirtyFiles(t *testing.T) {
	base := newCountFS(t)
	mem := base.FS.(*Mem)
	c := NewCache(base, 1)
	dirty, err := c.OpenFile("/dirty", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dirty.WriteAt([]byte("unsynced"), 0); err != nil {
		t.Fatal(err)
	}
	failed, err := c.OpenFile("/failed", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	failed.WriteAt([]byte("x"), 0)
	mem.FailDatasyncs(1)
	if err := failed.Datasync(); err == nil {
		t.Fatal("Datasync did not fail")
	}
	for i := range 10 {
		f, err := c.OpenFile(fmt.Sprintf("/other%d", i), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		writeSynced(t, f, []byte("y"))
		defer f.Close()
	}
	evictionsBefore := c.Stats().Evictions
	// Both dirty files hold their descriptors: 2 over a budget of 1, the
	// synced ones evicted as they went idle.
	if st := c.Stats(); st.Descriptors != 2 || base.live.Load() != 2 {
		t.Fatalf("stats %+v, live %d: want the 2 dirty descriptors alone", st, base.live.Load())
	}
	if err := dirty.Datasync(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Descriptors != 1 || st.Evictions != evictionsBefore+1 {
		t.Fatalf("after syncing: stats %+v, want the synced file evicted", st)
	}
	if got := cacheRead(t, dirty, 8); string(got) != "unsynced" {
		t.Fatalf("reopened file reads %q", got)
	}
	// A failed Datasync is final: a later success does not clean the file.
	if err := failed.Datasync(); err != nil {
		t.Fatal(err)
	}
	cacheRead(t, dirty, 8)
	if st := c.Stats(); st.Descriptors != 1 || base.live.Load() != 1 {
		t.Fatalf("stats %+v: want the failed file's descriptor alone", st)
	}
}

// A descriptor is never closed during a call on it, even over budget.
func TestCacheNeverEvictsDuringCall(t *testing.T) {
	base := newCountFS(t)
	c := NewCache(base, 1)
	a, _ := c.OpenFile("/a", os.O_RDWR|os.O_CREATE, 0o600)
	writeSynced(t, a, []byte("a"))
	base.block = make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := a.ReadAt(make([]byte, 1), 0)
		done <- err
	}()
	// Wait for the read to be inside the base call.
	for c.Stats().Descriptors != 1 || a.(*cachedFile).usersNow() != 1 {
		runtime.Gosched()
	}
	b, err := c.OpenFile("/b", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt([]byte("b"), 0); err != nil {
		t.Fatal(err)
	}
	close(base.block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.Datasync(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Descriptors != 1 {
		t.Fatalf("stats %+v: want one descriptor once both are idle", st)
	}
	a.Close()
	b.Close()
}

// A file removed or renamed over while its descriptor was evicted stays
// readable through its File (the unlinked file), and a File follows a
// rename of its own name.
func TestCacheRemoveAndRename(t *testing.T) {
	base := newCountFS(t)
	c := NewCache(base, 1)
	open := func(name, content string) File {
		f, err := c.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		writeSynced(t, f, []byte(content))
		return f
	}
	removed := open("/removed", "old1")
	replaced := open("/seg", "old2")
	tmp := open("/seg.tmp", "new2")
	other := open("/other", "zzzz") // evicts the others
	if err := c.Remove("/removed"); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename("/seg.tmp", "/seg"); err != nil {
		t.Fatal(err)
	}
	open("/removed", "newer").Close()
	for i := range 3 { // read them in turns, under pressure
		for f, want := range map[File]string{removed: "old1", replaced: "old2", tmp: "new2", other: "zzzz"} {
			if got := cacheRead(t, f, 4); string(got) != want {
				t.Fatalf("turn %d: %s reads %q, want %q", i, f.Name(), got, want)
			}
		}
	}
	// tmp, renamed to /seg, is reopened there after an eviction.
	if err := c.Remove("/seg"); err != nil {
		t.Fatal(err)
	}
	if got := cacheRead(t, tmp, 4); string(got) != "new2" {
		t.Fatalf("renamed file reads %q", got)
	}
	for _, f := range []File{removed, replaced, tmp, other} {
		f.Close()
	}
	if n := base.live.Load(); n != 0 {
		t.Fatalf("%d descriptors left open", n)
	}
}

// Lock is exclusive in the process and needs no descriptor.
func TestCacheLock(t *testing.T) {
	base := newCountFS(t)
	c := NewCache(base, 4)
	l, err := c.Lock("/d")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock("/d/"); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Lock: %v, want ErrLocked", err)
	}
	if base.live.Load() != 0 {
		t.Fatal("Lock holds a descriptor")
	}
	l.Close()
	l2, err := c.Lock("/d")
	if err != nil {
		t.Fatal(err)
	}
	l2.Close()
}

// Many goroutines read, write and sync many files through a small budget
// (run under -race): every read sees the file's last write, no descriptor
// is closed during a call (countFS), and none leaks.
func TestCacheConcurrentUse(t *testing.T) {
	dir := t.TempDir()
	base := &countFS{FS: OS(), t: t}
	c := NewCache(base, 4)
	const filesN, workersN, opsN = 32, 8, 300
	files := make([]File, filesN)
	locks := make([]sync.RWMutex, filesN)
	content := make([][]byte, filesN)
	for i := range files {
		f, err := c.OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = f
	}
	var wg sync.WaitGroup
	for w := range workersN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range opsN {
				i := rng.IntN(filesN)
				op := rng.IntN(3)
				if op == 2 {
					locks[i].RLock() // readers share a file
					b := make([]byte, len(content[i]))
					if n, err := files[i].ReadAt(b, 0); n != len(b) || !bytes.Equal(b, content[i]) {
						t.Errorf("file %d reads %q (%v), want %q", i, b[:n], err, content[i])
					}
					locks[i].RUnlock()
					continue
				}
				locks[i].Lock() // one writer per file, as in a store
				switch op {
				case 0:
					b := []byte(fmt.Sprintf("%d-%d", w, rng.IntN(1000)))
					if _, err := files[i].WriteAt(b, 0); err != nil {
						t.Error(err)
					}
					content[i] = b
				case 1:
					if err := files[i].Datasync(); err != nil {
						t.Error(err)
					}
				}
				locks[i].Unlock()
			}
		}()
	}
	wg.Wait()
	for _, f := range files {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := base.live.Load(); n != 0 {
		t.Fatalf("%d descriptors leaked", n)
	}
	if st := c.Stats(); st.Evictions == 0 {
		t.Fatalf("stats %+v: nothing was evicted, the test tested nothing", st)
	}
}

// A file declared Unsynced is evicted while idle with unsynced writes, as
// a clean one; a write after reopens it and finds what was written.
func TestCacheEvictsUnsyncedFiles(t *testing.T) {
	base := newCountFS(t)
	c := NewCache(base, 1)
	rec, err := c.OpenFile("/rec", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	Unsynced(rec)
	if _, err := rec.WriteAt([]byte("record-1"), 0); err != nil {
		t.Fatal(err)
	}
	other, err := c.OpenFile("/other", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	writeSynced(t, other, []byte("y"))
	if st := c.Stats(); st.Descriptors != 1 || base.live.Load() != 1 {
		t.Fatalf("stats %+v, live %d: want the unsynced file evicted, within the budget of 1", st, base.live.Load())
	}
	if _, err := rec.WriteAt([]byte("record-2"), 0); err != nil {
		t.Fatal(err)
	}
	if got := cacheRead(t, rec, 8); string(got) != "record-2" {
		t.Fatalf("reopened file reads %q", got)
	}
	// Without the declaration it would be kept (TestCacheKeepsDirtyFiles).
	if st := c.Stats(); st.Reopens == 0 {
		t.Fatalf("stats %+v: the unsynced file was never reopened", st)
	}
}
