package vfs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
)

// TestMemSpaceBytes: a write past the space bound lands in part and fails
// with ENOSPC, rewriting bytes in place needs no space, a create fails once
// nothing is free, and shrinking or removing a file frees space at once.
func TestMemSpaceBytes(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(1, 2)))
	if err := m.MkdirAll("/d", 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := m.OpenFile("/d/a", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	m.SetSpaceBytes(150)
	n, err := f.WriteAt(make([]byte, 80), 100)
	if n != 50 || !errors.Is(err, syscall.ENOSPC) || !IsNoSpace(err) {
		t.Fatalf("write past the bound: %d, %v; want 50, ENOSPC", n, err)
	}
	if size, _ := f.Size(); size != 150 || m.UsedBytes() != 150 {
		t.Fatalf("size %d, used %d; want 150", size, m.UsedBytes())
	}
	if _, err := f.WriteAt([]byte("in place"), 10); err != nil {
		t.Fatalf("rewrite in place on a full device: %v", err)
	}
	if _, err := m.OpenFile("/d/b", os.O_RDWR|os.O_CREATE, 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("create on a full device: %v, want ENOSPC", err)
	}
	if err := f.Truncate(120); err != nil {
		t.Fatalf("shrink on a full device: %v", err)
	}
	if _, err := f.WriteAt(make([]byte, 30), 120); err != nil {
		t.Fatalf("write into freed space: %v", err)
	}
	m.SetSpaceBytes(0)
	if _, err := f.WriteAt(make([]byte, 1000), 150); err != nil {
		t.Fatalf("write without a bound: %v", err)
	}
	if IsNoSpace(fmt.Errorf("wrapped: %w", syscall.EIO)) || !IsNoSpace(fmt.Errorf("w: %w", syscall.EDQUOT)) {
		t.Fatal("IsNoSpace misclassifies EIO or EDQUOT")
	}
}
