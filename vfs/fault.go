package vfs

import (
	"errors"
	"io/fs"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrInjected is the error of a Datasync failed on purpose by Faults (chaos
// tests: a failing disk).
var ErrInjected = errors.New("vfs: injected fault")

// SyncDelayMax bounds Faults.SetSyncDelay: a slow disk, not a hung one (a
// hung disk is SIGSTOP's job).
const SyncDelayMax = time.Minute

// Faults is a switchboard of disk faults for chaos tests, read by the FS that
// WithFaults returns on every Datasync. The zero value injects nothing; it is
// safe for concurrent use, and settings apply to the next Datasync.
type Faults struct {
	syncDelayNanos atomic.Int64
	syncFail       atomic.Bool
	noSpace        atomic.Bool
	datasyncs      atomic.Uint64
}

// Datasyncs returns how many Datasync calls files of the FS made (failed
// and delayed ones included): the flushes the code under test asked for.
func (f *Faults) Datasyncs() uint64 { return f.datasyncs.Load() }

// SetNoSpace makes the device full while on: a WriteAt that would grow
// its file fails with ENOSPC (writing nothing), and so does creating a
// file; rewriting bytes in place, reads, syncs, truncations and removes
// work.
func (f *Faults) SetNoSpace(on bool) { f.noSpace.Store(on) }

// NoSpace reports the setting.
func (f *Faults) NoSpace() bool { return f.noSpace.Load() }

// SetSyncDelay makes every Datasync wait d first (a slow disk); 0 removes
// the delay. d is clamped to [0, SyncDelayMax].
func (f *Faults) SetSyncDelay(d time.Duration) {
	f.syncDelayNanos.Store(int64(min(max(d, 0), SyncDelayMax)))
}

// SetSyncFail makes every Datasync fail with ErrInjected (a failing disk)
// while on. The data's fate is then what the FS contract says of a failed
// Datasync: unknown, and final for the file (callers must not retry).
func (f *Faults) SetSyncFail(on bool) { f.syncFail.Store(on) }

// SyncDelay and SyncFail report the current settings.
func (f *Faults) SyncDelay() time.Duration { return time.Duration(f.syncDelayNanos.Load()) }
func (f *Faults) SyncFail() bool           { return f.syncFail.Load() }

// WithFaults wraps fsys so that its files' Datasync obeys faults (delay
// first, then failure), and writes and creates obey SetNoSpace.
// Everything else passes through unchanged.
func WithFaults(fsys FS, faults *Faults) FS { return faultFS{FS: fsys, faults: faults} }

type faultFS struct {
	FS
	faults *Faults
}

func (f faultFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if flag&os.O_CREATE != 0 && f.faults.NoSpace() {
		if _, err := f.FS.Stat(name); errors.Is(err, fs.ErrNotExist) {
			return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.ENOSPC}
		}
	}
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return faultFile{File: file, faults: f.faults}, nil
}

type faultFile struct {
	File
	faults *Faults
}

func (f faultFile) WriteAt(p []byte, off int64) (int, error) {
	if f.faults.NoSpace() {
		if size, err := f.File.Size(); err != nil || off+int64(len(p)) > size {
			return 0, &fs.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
		}
	}
	return f.File.WriteAt(p, off)
}

func (f faultFile) Datasync() error {
	f.faults.datasyncs.Add(1)
	if d := f.faults.SyncDelay(); d > 0 {
		time.Sleep(d)
	}
	if f.faults.SyncFail() {
		return &fs.PathError{Op: "fdatasync", Path: f.Name(), Err: ErrInjected}
	}
	return f.File.Datasync()
}
