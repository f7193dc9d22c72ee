package vfs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// LockFileName is the file that OS().Lock creates in a directory and holds
// an exclusive flock on. Users of a locked directory ignore it.
const LockFileName = "LOCK"

// FS is the file system seam: the few operations a storage component needs,
// with durability spelled out. Paths are slash- or OS-separated; the
// in-memory twin treats every path as absolute.
//
// Durability contract (what both implementations promise, and what the
// in-memory one makes a test pay for ignoring):
//
//  1. File contents written with File.WriteAt or changed with
//     File.Truncate are durable only once File.Datasync returns nil for a
//     call made after the change. A crash before may keep the change, drop
//     it, or keep any page-aligned part of it.
//  2. A directory entry created (OpenFile with os.O_CREATE), removed or
//     renamed is durable only once SyncDir of its directory returns nil
//     for a call made after the change (for a rename across directories,
//     SyncDir of both). A crash before may keep or lose it.
//  3. A failed Datasync is final: the data it covered may or may not be on
//     disk, and a later successful Datasync does not make it durable
//     (fsyncgate). Do not retry; reopen and recover.
type FS interface {
	// OpenFile opens name with flag: one of os.O_RDONLY, os.O_WRONLY or
	// os.O_RDWR, or'ed with any of os.O_CREATE, os.O_EXCL and os.O_TRUNC
	// (other flags are not supported by the in-memory twin). perm applies
	// to a created file. Errors are *fs.PathError values; a missing file is
	// fs.ErrNotExist and O_EXCL on an existing one fs.ErrExist.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// Remove unlinks a file or an empty directory. Open files stay
	// readable and writable until closed.
	Remove(name string) error
	// Rename replaces newname, if it exists and is not a directory, by
	// oldname, atomically.
	Rename(oldname, newname string) error
	// ReadDir returns the entries of dir sorted by name.
	ReadDir(dir string) ([]fs.DirEntry, error)
	// Stat describes a file or directory.
	Stat(name string) (fs.FileInfo, error)
	// MkdirAll creates dir and any missing parents. The new entries are
	// not durable until SyncDir of each parent that received one.
	MkdirAll(dir string, perm os.FileMode) error
	// SyncDir makes the entries of dir durable (fsync of the directory).
	SyncDir(dir string) error
	// Lock takes an exclusive lock on dir for as long as the returned
	// Closer is open, so that two stores (two processes, or two opens in
	// one process) never share a directory. A held lock makes Lock return
	// an error wrapping ErrLocked at once; it never waits. The lock dies
	// with the process.
	Lock(dir string) (io.Closer, error)
	// BootID names the machine's current boot ("" if unknown): writes
	// made without a Datasync survive a process's crash, read back by
	// any later process of the same boot, but not a machine's. A file
	// written unsynced with the boot it was written in tells a later
	// reader whether it may trust what it reads (replica's commit mark).
	// Mem's boot changes with each Crash.
	BootID() string
}

// File is an open file. It is safe for concurrent use; ReadAt and WriteAt
// do not move any file offset (there is none).
type File interface {
	io.ReaderAt
	io.WriterAt
	// Truncate changes the file's size; bytes past the old size read as
	// zero.
	Truncate(size int64) error
	// Datasync flushes the file's data and the metadata needed to read it
	// back (its size): fdatasync. See the durability contract on FS.
	Datasync() error
	// Size returns the file's current size.
	Size() (int64, error)
	// Name returns the name the file was opened with.
	Name() string
	// Close closes the file; a second Close returns an error wrapping
	// fs.ErrClosed, as does any other call after Close.
	Close() error
}

// ErrLocked reports a directory already locked by another holder (another
// process, or another Lock in this one).
var ErrLocked = errors.New("vfs: directory is locked by another holder")

// ReadFile returns the whole content of name, refusing files larger than
// bytesMax with an error (and without reading them).
func ReadFile(fsys FS, name string, bytesMax int64) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	if size > bytesMax {
		return nil, &fs.PathError{Op: "read", Path: name, Err: errTooLarge}
	}
	b := make([]byte, size)
	n, err := f.ReadAt(b, 0)
	if n == len(b) {
		return b, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return nil, &fs.PathError{Op: "read", Path: name, Err: err}
}

// IsNoSpace reports whether err says the device is out of space or the
// writer's quota is spent (ENOSPC, EDQUOT): a condition that passes once
// space is freed, unlike an I/O error. Only a failed write or create is
// recoverable this way; a failed Datasync stays final whatever its errno
// (see the durability contract on FS).
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

var errTooLarge = errors.New("file is larger than the caller allows")
