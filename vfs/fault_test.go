package vfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFaultsDatasync(t *testing.T) {
	var faults Faults
	fsys := WithFaults(OS(), &faults)
	f, err := fsys.OpenFile(filepath.Join(t.TempDir(), "x"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustWrite(t, f, []byte("abc"), 0)
	if err := f.Datasync(); err != nil {
		t.Fatalf("no fault set: %v", err)
	}

	faults.SetSyncDelay(30 * time.Millisecond)
	start := time.Now()
	if err := f.Datasync(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Fatalf("Datasync took %v with a 30ms delay", took)
	}
	faults.SetSyncDelay(time.Hour)
	if got := faults.SyncDelay(); got != SyncDelayMax {
		t.Fatalf("delay %v, want the clamp %v", got, SyncDelayMax)
	}
	faults.SetSyncDelay(0)

	faults.SetSyncFail(true)
	if err := f.Datasync(); !errors.Is(err, ErrInjected) {
		t.Fatalf("failing disk: Datasync = %v, want ErrInjected", err)
	}
	faults.SetSyncFail(false)
	if err := f.Datasync(); err != nil {
		t.Fatalf("after the fault: %v", err)
	}
}
