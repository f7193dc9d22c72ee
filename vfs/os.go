package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// syscallEINTRMax bounds retries of a call interrupted before it started
// (EINTR is not a write-back failure, so retrying it is not the fsyncgate
// mistake).
const syscallEINTRMax = 16

// OS returns the real file system.
func OS() FS { return osFS{} }

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &osFile{f: f}, nil
}

func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) Rename(oldname, newname string) error        { return os.Rename(oldname, newname) }
func (osFS) ReadDir(dir string) ([]fs.DirEntry, error)   { return os.ReadDir(dir) }
func (osFS) Stat(name string) (fs.FileInfo, error)       { return os.Stat(name) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

// BootID is the kernel's boot_id: a random UUID drawn at each boot.
func (osFS) BootID() string {
	bootOnce.Do(func() {
		if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
			bootID = strings.TrimSpace(string(b))
		}
	})
	return bootID
}

var (
	bootOnce sync.Once
	bootID   string
)

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Lock takes an exclusive, non-blocking flock on dir/LOCK, creating the
// file if needed. flock locks belong to the open file description, so a
// second Lock of the same directory fails in the same process too.
func (osFS) Lock(dir string) (io.Closer, error) {
	name := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	err = control(f, func(fd int) error { return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) })
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &fs.PathError{Op: "lock", Path: dir, Err: ErrLocked}
		}
		return nil, &fs.PathError{Op: "flock", Path: name, Err: err}
	}
	return &osLock{f: f}, nil
}

// osLock releases its flock by closing the file.
type osLock struct {
	once sync.Once
	f    *os.File
}

func (l *osLock) Close() error {
	err := fs.ErrClosed
	l.once.Do(func() { err = l.f.Close() })
	return err
}

// osFile is a File over *os.File.
type osFile struct{ f *os.File }

func (o *osFile) ReadAt(p []byte, off int64) (int, error)  { return o.f.ReadAt(p, off) }
func (o *osFile) WriteAt(p []byte, off int64) (int, error) { return o.f.WriteAt(p, off) }
func (o *osFile) Truncate(size int64) error                { return o.f.Truncate(size) }
func (o *osFile) Name() string                             { return o.f.Name() }
func (o *osFile) Close() error                             { return o.f.Close() }

// Chmod sets the file's mode; WriteFileAtomic uses it so that the umask
// does not change the mode asked for.
func (o *osFile) Chmod(mode os.FileMode) error { return o.f.Chmod(mode) }

func (o *osFile) Size() (int64, error) {
	st, err := o.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Datasync calls fdatasync(2).
func (o *osFile) Datasync() error {
	if err := control(o.f, unix.Fdatasync); err != nil {
		return &fs.PathError{Op: "fdatasync", Path: o.f.Name(), Err: err}
	}
	return nil
}

// control runs call on f's descriptor, retrying it while it fails with
// EINTR (at most syscallEINTRMax times).
func control(f *os.File, call func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		for range syscallEINTRMax {
			if serr = call(int(fd)); serr != unix.EINTR {
				return
			}
		}
	})
	if cerr != nil {
		return fmt.Errorf("vfs: raw descriptor of %s: %w", f.Name(), cerr)
	}
	return serr
}
