package vfs

import (
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces the file name with data, created with mode perm:
// it writes name+".tmp", fdatasyncs it, renames it over name and syncs the
// directory, so that after a crash at any point name holds the old data
// or the new, whole, and the new is durable once it returns nil. A
// leftover name+".tmp" from a crash is overwritten by the next call.
func WriteFileAtomic(fsys FS, name string, data []byte, perm os.FileMode) error {
	tmp := name + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
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
	return fsys.SyncDir(filepath.Dir(name))
}
