package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// forEachFS runs fn against the real file system (in a temporary
// directory) and against Mem (in /data).
func forEachFS(t *testing.T, fn func(t *testing.T, fsys FS, dir string)) {
	t.Run("os", func(t *testing.T) { fn(t, OS(), t.TempDir()) })
	t.Run("mem", func(t *testing.T) {
		m := NewMem(rand.New(rand.NewPCG(1, 2)))
		if err := m.MkdirAll("/data", 0o755); err != nil {
			t.Fatal(err)
		}
		fn(t, m, "/data")
	})
}

func mustWrite(t *testing.T, f File, p []byte, off int64) {
	t.Helper()
	if n, err := f.WriteAt(p, off); err != nil || n != len(p) {
		t.Fatalf("WriteAt(%d bytes at %d) = %d, %v", len(p), off, n, err)
	}
}

func readAll(t *testing.T, fsys FS, name string) []byte {
	t.Helper()
	b, err := ReadFile(fsys, name, 1<<30)
	if err != nil {
		t.Fatalf("ReadFile(%s): %v", name, err)
	}
	return b
}

func names(t *testing.T, fsys FS, dir string) []string {
	t.Helper()
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestFileOperations(t *testing.T) {
	forEachFS(t, func(t *testing.T, fsys FS, dir string) {
		name := filepath.Join(dir, "a")
		if _, err := fsys.OpenFile(name, os.O_RDWR, 0); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("open of a missing file: %v", err)
		}
		f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name() != name {
			t.Fatalf("Name %q", f.Name())
		}
		if _, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("O_EXCL on an existing file: %v", err)
		}
		mustWrite(t, f, []byte("hello"), 0)
		mustWrite(t, f, []byte("world"), 10) // leaves a zero gap
		if size, err := f.Size(); err != nil || size != 15 {
			t.Fatalf("Size = %d, %v", size, err)
		}
		buf := make([]byte, 20)
		n, err := f.ReadAt(buf, 0)
		if n != 15 || err != io.EOF || !bytes.Equal(buf[:n], []byte("hello\x00\x00\x00\x00\x00world")) {
			t.Fatalf("ReadAt = %d, %v, %q", n, err, buf[:n])
		}
		if n, err := f.ReadAt(buf[:3], 1); n != 3 || err != nil || string(buf[:3]) != "ell" {
			t.Fatalf("ReadAt inside = %d, %v", n, err)
		}
		if n, err := f.ReadAt(buf, 100); n != 0 || err != io.EOF {
			t.Fatalf("ReadAt past the end = %d, %v", n, err)
		}
		// Shrinking then growing exposes zeros, not the old bytes.
		if err := f.Truncate(2); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(6); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, fsys, name); !bytes.Equal(got, []byte("he\x00\x00\x00\x00")) {
			t.Fatalf("after truncations: %q", got)
		}
		if err := f.Datasync(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); !errors.Is(err, fs.ErrClosed) {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, fs.ErrClosed) {
			t.Fatalf("WriteAt after Close: %v", err)
		}

		// O_TRUNC empties; O_RDONLY refuses writes.
		f, err = fsys.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if size, _ := f.Size(); size != 0 {
			t.Fatalf("size after O_TRUNC %d", size)
		}
		f.Close()
		f, err = fsys.OpenFile(name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("x"), 0); err == nil {
			t.Fatal("write to a read-only file succeeded")
		}
		f.Close()
	})
}

func TestDirectoryOperations(t *testing.T) {
	forEachFS(t, func(t *testing.T, fsys FS, dir string) {
		sub := filepath.Join(dir, "x", "y")
		if err := fsys.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fsys.MkdirAll(sub, 0o755); err != nil {
			t.Fatalf("MkdirAll of an existing directory: %v", err)
		}
		st, err := fsys.Stat(sub)
		if err != nil || !st.IsDir() || st.Name() != "y" {
			t.Fatalf("Stat = %v, %v", st, err)
		}
		for _, n := range []string{"c", "a", "b"} {
			f, err := fsys.OpenFile(filepath.Join(sub, n), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			mustWrite(t, f, []byte(n+n), 0)
			f.Close()
		}
		if got := names(t, fsys, sub); strings.Join(got, ",") != "a,b,c" {
			t.Fatalf("ReadDir = %v", got)
		}
		ents, _ := fsys.ReadDir(dir)
		if len(ents) != 1 || !ents[0].IsDir() || ents[0].Name() != "x" {
			t.Fatalf("ReadDir(dir) = %v", ents)
		}
		if st, err := fsys.Stat(filepath.Join(sub, "a")); err != nil || st.IsDir() || st.Size() != 2 || !st.Mode().IsRegular() {
			t.Fatalf("Stat(a) = %v, %v", st, err)
		}
		if err := fsys.Rename(filepath.Join(sub, "a"), filepath.Join(sub, "b")); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, fsys, filepath.Join(sub, "b")); string(got) != "aa" {
			t.Fatalf("renamed file holds %q", got)
		}
		if err := fsys.Remove(filepath.Join(sub, "b")); err != nil {
			t.Fatal(err)
		}
		if err := fsys.Remove(filepath.Join(sub, "b")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("second Remove: %v", err)
		}
		if err := fsys.Remove(sub); err == nil {
			t.Fatal("Remove of a non-empty directory succeeded")
		}
		if err := fsys.SyncDir(sub); err != nil {
			t.Fatal(err)
		}
		if got := names(t, fsys, sub); strings.Join(got, ",") != "c" {
			t.Fatalf("ReadDir = %v", got)
		}
		if err := fsys.MkdirAll(filepath.Join(sub, "c"), 0o755); err == nil {
			t.Fatal("MkdirAll through a file succeeded")
		}
		// An unlinked open file stays usable.
		f, err := fsys.OpenFile(filepath.Join(sub, "c"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := fsys.Remove(filepath.Join(sub, "c")); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, f, []byte("zz"), 2)
		buf := make([]byte, 4)
		if n, _ := f.ReadAt(buf, 0); n != 4 || string(buf) != "cczz" {
			t.Fatalf("unlinked file reads %q", buf[:n])
		}
		f.Close()
	})
}

func TestLock(t *testing.T) {
	forEachFS(t, func(t *testing.T, fsys FS, dir string) {
		l, err := fsys.Lock(dir)
		if err != nil {
			t.Fatal(err)
		}
		_, err = fsys.Lock(dir)
		if !errors.Is(err, ErrLocked) {
			t.Fatalf("second Lock: %v", err)
		}
		t.Logf("second Lock: %v", err)
		other := filepath.Join(dir, "other")
		if err := fsys.MkdirAll(other, 0o755); err != nil {
			t.Fatal(err)
		}
		l2, err := fsys.Lock(other)
		if err != nil {
			t.Fatalf("Lock of another directory: %v", err)
		}
		l2.Close()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); !errors.Is(err, fs.ErrClosed) {
			t.Fatalf("second Close: %v", err)
		}
		l, err = fsys.Lock(dir)
		if err != nil {
			t.Fatalf("Lock after Close: %v", err)
		}
		l.Close()
		if _, err := fsys.Lock(filepath.Join(dir, "missing")); err == nil {
			t.Fatal("Lock of a missing directory succeeded")
		}
	})
}

// TestLockAcrossProcesses holds the lock here and checks that a child
// process cannot take it, and can once it is released.
func TestLockAcrossProcesses(t *testing.T) {
	if dir := os.Getenv("GEOLOG_VFS_LOCK_CHILD"); dir != "" {
		l, err := OS().Lock(dir)
		if err != nil {
			fmt.Printf("lock error: locked=%v: %v\n", errors.Is(err, ErrLocked), err)
			return
		}
		l.Close()
		fmt.Println("lock taken")
		return
	}
	dir := t.TempDir()
	child := func() string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLockAcrossProcesses$")
		cmd.Env = append(os.Environ(), "GEOLOG_VFS_LOCK_CHILD="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v: %s", err, out)
		}
		return string(out)
	}
	l, err := OS().Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if out := child(); !strings.Contains(out, "lock error: locked=true") {
		t.Fatalf("child while locked: %s", out)
	}
	l.Close()
	if out := child(); !strings.Contains(out, "lock taken") {
		t.Fatalf("child after release: %s", out)
	}
}

func TestHookAndWriteFaults(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(3, 4)))
	var seen []string
	boom := errors.New("boom")
	m.SetHook(func(op Op, name string) error {
		seen = append(seen, op.String()+" "+name)
		if op == OpRemove {
			return boom
		}
		return nil
	})
	f, err := m.OpenFile("/f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, []byte("abc"), 0)
	if err := m.Remove("/f"); !errors.Is(err, boom) {
		t.Fatalf("Remove with a failing hook: %v", err)
	}
	m.SetHook(nil)
	if _, err := m.Stat("/f"); err != nil {
		t.Fatalf("a failed Remove removed the file: %v", err)
	}
	if want := "open /f,write /f,remove /f"; strings.Join(seen, ",") != want {
		t.Fatalf("hook saw %q, want %q", strings.Join(seen, ","), want)
	}

	m.FailWrites(2)
	payload := bytes.Repeat([]byte("x"), 1000)
	n, err := f.WriteAt(payload, 3)
	if !errors.Is(err, syscall.EIO) || n >= len(payload) {
		t.Fatalf("failed WriteAt = %d, %v", n, err)
	}
	if size, _ := f.Size(); size != 3+int64(n) {
		t.Fatalf("a failed write of which %d bytes landed left size %d", n, size)
	}
	if err := f.Truncate(0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("failed Truncate: %v", err)
	}
	if size, _ := f.Size(); size != 3+int64(n) {
		t.Fatal("a failed Truncate changed the file")
	}
	mustWrite(t, f, []byte("ok"), 0) // faults used up
}

// crashOnce builds a small history on a Mem seeded with seed and returns
// the crashed result. The history: /d/synced written and synced, entry
// synced; then more written to it unsynced; /d/unsynced created and
// written but neither synced nor its entry; /d/fsynced written and synced
// but its entry not synced.
func crashOnce(t *testing.T, seed uint64) (*Mem, []byte, []byte) {
	t.Helper()
	m := NewMem(rand.New(rand.NewPCG(seed, 99)))
	if err := m.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	syncedData := bytes.Repeat([]byte{1}, 3*PageBytes+100)
	more := make([]byte, 4*PageBytes)
	for i := range more {
		more[i] = byte(2 + i/PageBytes)
	}
	f, _ := m.OpenFile("/d/synced", os.O_RDWR|os.O_CREATE, 0o644)
	mustWrite(t, f, syncedData, 0)
	if err := f.Datasync(); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/d"); err != nil {
		t.Fatal(err)
	}
	// Unsynced: append page-sized writes one by one.
	for p := 0; p < 4; p++ {
		mustWrite(t, f, more[p*PageBytes:(p+1)*PageBytes], int64(len(syncedData)+p*PageBytes))
	}
	g, _ := m.OpenFile("/d/unsynced", os.O_RDWR|os.O_CREATE, 0o644)
	mustWrite(t, g, []byte("lost?"), 0)
	h, _ := m.OpenFile("/d/fsynced", os.O_RDWR|os.O_CREATE, 0o644)
	mustWrite(t, h, []byte("data"), 0)
	if err := h.Datasync(); err != nil {
		t.Fatal(err)
	}
	return m.Crash(), syncedData, append(bytes.Clone(syncedData), more...)
}

func TestCrashSemantics(t *testing.T) {
	var keptAll, keptNone, hole, unsyncedEntryLost, unsyncedEntryKept, fsyncedLost int
	for seed := range uint64(400) {
		c, syncedData, full := crashOnce(t, seed)
		got := readAll(t, c, "/d/synced")
		// Synced data always survives.
		if len(got) < len(syncedData) || !bytes.Equal(got[:len(syncedData)], syncedData) {
			t.Fatalf("seed %d: synced data lost: %d bytes", seed, len(got))
		}
		if len(got) > len(full) {
			t.Fatalf("seed %d: %d bytes, more than ever written", seed, len(got))
		}
		// Every byte past it is either what was written there or zero,
		// page by page.
		var gotZero, gotData bool
		for p := len(syncedData); p < len(got); p++ {
			if got[p] != 0 && got[p] != full[p] {
				t.Fatalf("seed %d: byte %d is %d, never written", seed, p, got[p])
			}
			if got[p] == 0 {
				gotZero = true
			} else if gotZero {
				gotData = true // written data after a hole
			}
		}
		switch {
		case bytes.Equal(got, full):
			keptAll++
		case len(got) == len(syncedData):
			keptNone++
		}
		if gotData {
			hole++
		}
		if _, err := c.Stat("/d/unsynced"); err != nil {
			unsyncedEntryLost++
		} else {
			unsyncedEntryKept++
			// Empty, written, or sized but never written (zeros).
			if b := readAll(t, c, "/d/unsynced"); len(b) != 0 && string(b) != "lost?" && string(b) != "\x00\x00\x00\x00\x00" {
				t.Fatalf("seed %d: unsynced file holds %q", seed, b)
			}
		}
		if _, err := c.Stat("/d/fsynced"); err != nil {
			fsyncedLost++
		} else if b := readAll(t, c, "/d/fsynced"); string(b) != "data" {
			t.Fatalf("seed %d: synced file without a synced entry holds %q", seed, b)
		}
	}
	t.Logf("of 400 crashes: unsynced appends kept all %d, none %d, with a hole %d; unsynced entry lost %d, kept %d; synced file with unsynced entry lost %d",
		keptAll, keptNone, hole, unsyncedEntryLost, unsyncedEntryKept, fsyncedLost)
	for name, n := range map[string]int{"kept all": keptAll, "kept none": keptNone, "hole": hole,
		"entry lost": unsyncedEntryLost, "entry kept": unsyncedEntryKept, "synced file lost": fsyncedLost} {
		if n == 0 {
			t.Errorf("no crash in 400 had outcome %q", name)
		}
	}
}

func TestCrashIsDeterministic(t *testing.T) {
	a, _, _ := crashOnce(t, 7)
	b, _, _ := crashOnce(t, 7)
	for _, name := range []string{"/d/synced", "/d/unsynced", "/d/fsynced"} {
		_, errA := a.Stat(name)
		_, errB := b.Stat(name)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("%s: exists %v and %v", name, errA == nil, errB == nil)
		}
		if errA == nil && !bytes.Equal(readAll(t, a, name), readAll(t, b, name)) {
			t.Fatalf("%s differs between two crashes of the same seed", name)
		}
	}
}

func TestCrashDirectoryEntries(t *testing.T) {
	var renameOld, renameNew, removeUndone, removeKept int
	for seed := range uint64(200) {
		m := NewMem(rand.New(rand.NewPCG(seed, 5)))
		for _, n := range []string{"a", "b", "gone"} {
			f, _ := m.OpenFile("/"+n, os.O_RDWR|os.O_CREATE, 0o644)
			mustWrite(t, f, []byte(n), 0)
			if err := f.Datasync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		if err := m.SyncDir("/"); err != nil {
			t.Fatal(err)
		}
		if err := m.Rename("/a", "/a2"); err != nil {
			t.Fatal(err)
		}
		if err := m.Remove("/gone"); err != nil {
			t.Fatal(err)
		}
		// A synced directory change survives whatever follows.
		if err := m.Remove("/b"); err != nil {
			t.Fatal(err)
		}
		d, _ := m.OpenFile("/dir-made", os.O_RDWR|os.O_CREATE, 0o644)
		d.Close()
		c := m.Crash()
		_, errOld := c.Stat("/a")
		_, errNew := c.Stat("/a2")
		if (errOld == nil) == (errNew == nil) {
			t.Fatalf("seed %d: after a crash, rename left old %v new %v", seed, errOld == nil, errNew == nil)
		}
		if errOld == nil {
			renameOld++
		} else {
			renameNew++
			if string(readAll(t, c, "/a2")) != "a" {
				t.Fatal("renamed file lost its content")
			}
		}
		if _, err := c.Stat("/gone"); err == nil {
			removeUndone++
			if string(readAll(t, c, "/gone")) != "gone" {
				t.Fatal("undone remove lost the content")
			}
		} else {
			removeKept++
		}
	}
	if renameOld == 0 || renameNew == 0 || removeUndone == 0 || removeKept == 0 {
		t.Fatalf("outcomes: rename old %d new %d, remove undone %d kept %d", renameOld, renameNew, removeUndone, removeKept)
	}

	// With SyncDir the changes always survive.
	for seed := range uint64(50) {
		m := NewMem(rand.New(rand.NewPCG(seed, 6)))
		if err := m.MkdirAll("/x/y", 0o755); err != nil {
			t.Fatal(err)
		}
		f, _ := m.OpenFile("/x/y/f", os.O_RDWR|os.O_CREATE, 0o644)
		mustWrite(t, f, []byte("f"), 0)
		if err := f.Datasync(); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"/", "/x", "/x/y"} {
			if err := m.SyncDir(d); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Rename("/x/y/f", "/x/y/g"); err != nil {
			t.Fatal(err)
		}
		if err := m.SyncDir("/x/y"); err != nil {
			t.Fatal(err)
		}
		c := m.Crash()
		if got := readAll(t, c, "/x/y/g"); string(got) != "f" {
			t.Fatalf("seed %d: synced rename lost: %q", seed, got)
		}
		if _, err := c.Stat("/x/y/f"); err == nil {
			t.Fatalf("seed %d: synced rename undone", seed)
		}
	}
}

func TestFailedDatasyncIsFinal(t *testing.T) {
	var lost int
	for seed := range uint64(100) {
		m := NewMem(rand.New(rand.NewPCG(seed, 8)))
		f, _ := m.OpenFile("/f", os.O_RDWR|os.O_CREATE, 0o644)
		if err := m.SyncDir("/"); err != nil {
			t.Fatal(err)
		}
		first := bytes.Repeat([]byte{7}, 2*PageBytes)
		mustWrite(t, f, first, 0)
		m.FailDatasyncs(1)
		if err := f.Datasync(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("Datasync = %v, want EIO", err)
		}
		// Reads still see the data (the page cache keeps it).
		if got := readAll(t, m, "/f"); !bytes.Equal(got, first) {
			t.Fatal("a failed Datasync changed what reads see")
		}
		second := bytes.Repeat([]byte{9}, 10)
		mustWrite(t, f, second, int64(len(first)))
		if err := f.Datasync(); err != nil {
			t.Fatal(err)
		}
		got := readAll(t, m.Crash(), "/f")
		if len(got) != len(first)+len(second) || !bytes.Equal(got[len(first):], second) {
			t.Fatalf("seed %d: data synced after the failure is not durable: %d bytes", seed, len(got))
		}
		if !bytes.Equal(got[:len(first)], first) {
			lost++ // what the failed sync covered may be gone for good
		}
	}
	if lost == 0 {
		t.Fatal("a failed Datasync never lost anything: the later sync made it durable")
	}
}

func TestPendingOpsBounded(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(1, 1)))
	f, _ := m.OpenFile("/f", os.O_RDWR|os.O_CREATE, 0o644)
	for i := range 5 * pendingOpsMax {
		mustWrite(t, f, []byte{byte(i)}, int64(i))
		if i%3 == 0 {
			g, _ := m.OpenFile(fmt.Sprintf("/g%d", i), os.O_RDWR|os.O_CREATE, 0o644)
			g.Close()
		}
	}
	n := f.(*memFile).node
	if len(n.ops) > pendingOpsMax || len(m.root.dirOps) > pendingOpsMax {
		t.Fatalf("%d file ops and %d directory ops pending", len(n.ops), len(m.root.dirOps))
	}
	// What was written back is durable: the oldest bytes survive any crash.
	got := readAll(t, m.Crash(), "/f")
	if len(got) < pendingOpsMax || got[0] != 0 || got[100] != 100 {
		t.Fatalf("written-back data lost: %d bytes", len(got))
	}
}

func TestMemConcurrent(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(2, 2)))
	done := make(chan struct{})
	for w := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			f, err := m.OpenFile(fmt.Sprintf("/w%d", w), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			buf := make([]byte, 8)
			for i := range 300 {
				if _, err := f.WriteAt([]byte(fmt.Sprintf("%08d", i)), int64(i*8)); err != nil {
					t.Error(err)
					return
				}
				if _, err := f.ReadAt(buf, int64(i*8)); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					_ = f.Datasync()
					_ = m.SyncDir("/")
				}
			}
			f.Close()
		}()
	}
	for range 20 {
		_ = m.Crash()
	}
	for range 4 {
		<-done
	}
}

// TestCrashPagesAreVersions drives one file through random writes,
// truncations and Datasyncs and checks every crash against the versions the
// file went through since its last Datasync: the size is one of theirs, and
// every page (zero-extended) is that page of one of them.
func TestCrashPagesAreVersions(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 11))
		m := NewMem(rand.New(rand.NewPCG(seed, 12)))
		f, _ := m.OpenFile("/f", os.O_RDWR|os.O_CREATE, 0o644)
		if err := m.SyncDir("/"); err != nil {
			t.Fatal(err)
		}
		var live []byte
		versions := [][]byte{nil} // since the last Datasync, oldest first
		for range 5 + rng.IntN(20) {
			switch r := rng.IntN(10); {
			case r < 6:
				off := rng.Int64N(int64(len(live)) + 3*PageBytes)
				p := make([]byte, 1+rng.IntN(2*PageBytes))
				for i := range p {
					p[i] = byte(1 + rng.IntN(255))
				}
				mustWrite(t, f, p, off)
				live = fileOp{off: off, data: p}.apply(live)
			case r < 8:
				size := rng.Int64N(int64(len(live)) + PageBytes)
				if err := f.Truncate(size); err != nil {
					t.Fatal(err)
				}
				live = fileOp{truncate: true, size: size}.apply(live)
			default:
				if err := f.Datasync(); err != nil {
					t.Fatal(err)
				}
				versions = versions[:0]
			}
			versions = append(versions, bytes.Clone(live))
		}
		if got := readAll(t, m, "/f"); !bytes.Equal(got, live) {
			t.Fatalf("seed %d: reads see %d bytes, model %d", seed, len(got), len(live))
		}
		for range 5 {
			got := readAll(t, m.Crash(), "/f")
			sizeOK := false
			for _, v := range versions {
				sizeOK = sizeOK || len(v) == len(got)
			}
			if !sizeOK {
				t.Fatalf("seed %d: crash left %d bytes, no version had that size", seed, len(got))
			}
			for start := 0; start < len(got); start += PageBytes {
				page := got[start:min(start+PageBytes, len(got))]
				ok := false
				for _, v := range versions {
					want := make([]byte, len(page))
					if start < len(v) {
						copy(want, v[start:])
					}
					ok = ok || bytes.Equal(page, want)
				}
				if !ok {
					t.Fatalf("seed %d: page at %d matches no version", seed, start)
				}
			}
		}
	}
}
