package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
)

// errKeyInUse reports a data key that still seals frames on disk.
var errKeyInUse = errors.New("the data key still seals frames in the data directory")

// keysRetire removes the data key keyID from k, the keyring of the
// (stopped) node whose data directory is dataDir, after checking every
// segment log and orphan log there for a frame under it.
func (e *env) keysRetire(k *atrest.Keyring, dataDir, keyID string) error {
	if keyID == "" {
		return usagef("%s", keysUsage)
	}
	id, err := atrest.ParseKeyID(keyID)
	if err != nil {
		return usagef("--key: %v", err)
	}
	units, files, example, err := unitsUnder(dataDir, id)
	if err != nil {
		return err
	}
	if units > 0 {
		return fmt.Errorf("%w: %d frames under %v in %d files (%s, ...); start the node and let it re-encrypt them (geolog_atrest_segments_pending_reseal falls to 0), then retry",
			errKeyInUse, units, id, files, example)
	}
	if err := k.Retire(id); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "retired data key %v; active %v\n", id, k.Active())
	return nil
}

// unitsUnder counts the frames sealed under id in the segment logs
// (*.log) and orphan logs (*.fork) under dataDir: how many, in how many
// files, and one of them.
func unitsUnder(dataDir string, id atrest.KeyID) (units, files int, example string, err error) {
	fsys := vfs.OS()
	keysDir := atrest.NodeKeysDir(dataDir)
	err = filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == keysDir {
				return filepath.SkipDir
			}
			return nil
		}
		var keys map[atrest.KeyID]int
		switch {
		case strings.HasSuffix(p, ".log"):
			keys, err = segment.FileUnitKeys(fsys, p)
		case strings.HasSuffix(p, ".fork"):
			keys, err = replica.ForkFileKeys(fsys, p)
		default:
			return nil
		}
		if err != nil {
			return err
		}
		if n := keys[id]; n > 0 {
			units += n
			files++
			if example == "" {
				example = p
			}
		}
		return nil
	})
	return units, files, example, err
}
