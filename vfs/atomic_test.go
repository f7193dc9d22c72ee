package vfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFileAtomic: a write replaces the file whole, with exactly the
// mode asked for (the umask does not apply on the real file system),
// leaves no temporary file, and a failure leaves the old content and no
// temporary file.
func TestWriteFileAtomic(t *testing.T) {
	forEachFS(t, func(t *testing.T, fsys FS, dir string) {
		name := filepath.Join(dir, "f")
		if err := WriteFileAtomic(fsys, name, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := WriteFileAtomic(fsys, name, []byte("new"), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := ReadFile(fsys, name, 1<<10)
		if err != nil || string(b) != "new" {
			t.Fatalf("read %q, %v; want new", b, err)
		}
		ents, err := fsys.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 1 || ents[0].Name() != "f" {
			t.Fatalf("directory holds %v, want only f (no temporary file)", ents)
		}
		if err := WriteFileAtomic(fsys, filepath.Join(dir, "missing", "f"), []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("write into a missing directory: %v, want fs.ErrNotExist", err)
		}
	})
	t.Run("mode", func(t *testing.T) {
		dir := t.TempDir()
		name := filepath.Join(dir, "f")
		if err := WriteFileAtomic(OS(), name, []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := WriteFileAtomic(OS(), name, []byte("y"), 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(name)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v, %v; want 0600", st.Mode().Perm(), err)
		}
	})
}

// TestWriteFileAtomicFailureRemovesTemp: a rename that fails (the target
// is a directory) leaves the directory as it was and no temporary file.
func TestWriteFileAtomicFailureRemovesTemp(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "d")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(OS(), target, []byte("x"), 0o600); err == nil {
		t.Fatal("rename over a non-empty directory succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want 1 (the temporary file removed)", len(ents))
	}
}
