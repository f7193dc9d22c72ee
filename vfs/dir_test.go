package vfs

import (
	"math/rand/v2"
	"os"
	"testing"
)

// TestEnsureDirSurvivesCrash: every directory EnsureDir created is there
// after any crash; a plain MkdirAll is not, for some seed.
func TestEnsureDirSurvivesCrash(t *testing.T) {
	plainLost := false
	for seed := range uint64(64) {
		m := NewMem(rand.New(rand.NewPCG(seed, 1)))
		if err := m.MkdirAll("/data", 0o700); err != nil {
			t.Fatal(err)
		}
		if err := m.SyncDir("/"); err != nil {
			t.Fatal(err)
		}
		if err := EnsureDir(m, "/data/streams/s/r1"); err != nil {
			t.Fatal(err)
		}
		if err := EnsureDir(m, "/data/streams/s/r1"); err != nil {
			t.Fatalf("again: %v", err)
		}
		if err := m.MkdirAll("/data/plain/a/b", 0o700); err != nil {
			t.Fatal(err)
		}
		c := m.Crash()
		if st, err := c.Stat("/data/streams/s/r1"); err != nil || !st.IsDir() {
			t.Fatalf("seed %d: after a crash: %v", seed, err)
		}
		if _, err := c.Stat("/data/plain/a/b"); err != nil {
			plainLost = true
		}
	}
	if !plainLost {
		t.Fatal("no crash lost an unsynced MkdirAll: the test cannot tell EnsureDir from it")
	}
}

func TestEnsureDirNotADirectory(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(1, 1)))
	f, err := m.OpenFile("/file", os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := EnsureDir(m, "/file/sub"); err == nil {
		t.Fatal("a file in the path was taken for a directory")
	}
}
