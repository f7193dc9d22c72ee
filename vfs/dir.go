package vfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
)

// EnsureDir creates dir and any missing parents, mode 0700, and makes every
// entry it created durable by syncing the directory that received it,
// parents first (an entry is only reachable once its parent's is). A dir
// that exists is left as it is; a path component that is not a directory
// is an error. This is the project's one way to create a directory that
// must survive a crash.
func EnsureDir(fsys FS, dir string) error {
	dir = filepath.Clean(dir)
	// Find the deepest existing ancestor; every directory below it is new.
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		st, err := fsys.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("vfs: %s is not a directory", d)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if len(created) == 0 {
		return nil
	}
	if err := fsys.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for i := len(created) - 1; i >= 0; i-- {
		if err := fsys.SyncDir(filepath.Dir(created[i])); err != nil {
			return err
		}
	}
	return nil
}
