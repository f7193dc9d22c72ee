package vfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// atomicTmpTriesMax bounds the temporary names WriteFileAtomic tries
// before giving up (each is random: a clash is a leftover, or another
// writer of the same file at the same moment).
const atomicTmpTriesMax = 8

// WriteFileAtomic replaces the file name with data, mode perm (exactly, on
// the real file system: the process's umask does not apply): it writes a
// temporary file in name's directory ("."+base+".tmp-<random>", so that
// two writers of one file never share one), fdatasyncs it, renames it over
// name and syncs the directory. After a crash at any point name holds the
// old data or the new, whole, and the new is durable once it returns nil.
// A failure leaves name as it was and removes the temporary file; only a
// crash can leave one behind. This is the project's one atomic-write
// helper.
func WriteFileAtomic(fsys FS, name string, data []byte, perm os.FileMode) error {
	if err := writeFileAtomic(fsys, name, data, perm); err != nil {
		return fmt.Errorf("vfs: write %s atomically: %w", name, err)
	}
	return nil
}

func writeFileAtomic(fsys FS, name string, data []byte, perm os.FileMode) error {
	f, tmp, err := createAtomicTmp(fsys, name, perm)
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if !renamed {
			fsys.Remove(tmp) // best effort; the error that matters is returned
		}
	}()
	if c, ok := f.(interface{ Chmod(os.FileMode) error }); ok {
		if err := c.Chmod(perm); err != nil {
			f.Close()
			return err
		}
	}
	if len(data) > 0 {
		if _, err := f.WriteAt(data, 0); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Datasync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fsys.Rename(tmp, name); err != nil {
		return err
	}
	renamed = true
	return fsys.SyncDir(filepath.Dir(name))
}

// createAtomicTmp creates a new temporary file for name, exclusively.
func createAtomicTmp(fsys FS, name string, perm os.FileMode) (File, string, error) {
	var b [6]byte
	for range atomicTmpTriesMax {
		if _, err := rand.Read(b[:]); err != nil {
			return nil, "", err
		}
		tmp := filepath.Join(filepath.Dir(name), "."+filepath.Base(name)+".tmp-"+hex.EncodeToString(b[:]))
		f, err := fsys.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, tmp, err
	}
	return nil, "", fmt.Errorf("no free temporary name after %d tries", atomicTmpTriesMax)
}
