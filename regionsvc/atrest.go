package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/geolog/geolog/atrest"
)

// Encryption at rest, the node's side (package atrest has the keys,
// package segment the sealing): the node owns one keyring in
// <DataDir>/keys, opened before any range, and hands it to every range's
// segment store. Startup refuses, with an error that says what is wrong,
// rather than serve a range it cannot read:
//
//  1. a data directory with a keyring but no KEK (geologd without
//     --kek-file): ErrKEKRequired;
//  2. a KEK that does not open the keyring (another KEK file, a KEK
//     removed from it): atrest.ErrKEKUnavailable or atrest.ErrWrongKEK;
//  3. a log holding frames sealed under a data key the keyring lacks (the
//     keyring was replaced or deleted): atrest.ErrKeyUnavailable, from
//     checkRangeKeys.
//
// A node given a KEK rewraps its data keys under the provider's current
// KEK if they are under an older one (KEK rotation: add a KEK to the file,
// restart), and starts a new data key when the active one is older than
// Config.DataKeyRotationPeriod.

// defaultDataKeyRotationPeriod is Config.DataKeyRotationPeriod's default.
const defaultDataKeyRotationPeriod = 7 * 24 * time.Hour

// ErrKEKRequired reports a data directory whose logs are sealed (it holds
// a keyring) opened without a KEK.
var ErrKEKRequired = errors.New("regionsvc: the data directory is encrypted at rest (it holds a keyring): a KEK is required (geologd --kek-file)")

// KeysDir is the keyring directory of the data directory dataDir.
func KeysDir(dataDir string) string { return atrest.NodeKeysDir(dataDir) }

// openKeyring opens (or, in a data directory without one, creates) the
// node's keyring when cfg.KEK is set, and returns nil when it is not,
// refusing a data directory that holds a keyring. See the steps above.
func openKeyring(cfg Config) (*atrest.Keyring, error) {
	dir := KeysDir(cfg.DataDir)
	if cfg.KEK == nil {
		_, err := os.Stat(filepath.Join(dir, atrest.KeyringFileName))
		switch {
		case err == nil:
			return nil, fmt.Errorf("%w: %s", ErrKEKRequired, dir)
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("regionsvc: keyring: %w", err)
		}
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := atrest.Open(ctx, atrest.Config{Dir: dir, KEK: cfg.KEK, Create: true, Now: cfg.Now, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("regionsvc: encryption at rest: %w", err)
	}
	if err := maintainKeys(ctx, cfg, k); err != nil {
		k.Close()
		return nil, fmt.Errorf("regionsvc: encryption at rest: %w", err)
	}
	return k, nil
}

// maintainKeys rewraps data keys wrapped under an older KEK and rotates
// an active data key older than the rotation period.
func maintainKeys(ctx context.Context, cfg Config, k *atrest.Keyring) error {
	cur, err := cfg.KEK.CurrentKEK(ctx)
	if err != nil {
		return err
	}
	for _, ki := range k.Keys() {
		if ki.KEK != cur {
			if _, _, err := k.Rewrap(ctx); err != nil {
				return err
			}
			break
		}
	}
	_, err = rotateIfDue(ctx, cfg, k)
	return err
}

// rotateIfDue starts a new data key when the active one is older than
// Config.DataKeyRotationPeriod, and reports whether it did. The node calls
// it at startup and on each pass of its resealer (reseal.go), so that a
// node that runs for longer than the period rotates too.
func rotateIfDue(ctx context.Context, cfg Config, k *atrest.Keyring) (bool, error) {
	period := cfg.DataKeyRotationPeriod
	if period == 0 {
		period = defaultDataKeyRotationPeriod
	}
	if period < 0 {
		return false, nil
	}
	for _, ki := range k.Keys() {
		if ki.Active && cfg.Now().Sub(ki.Created) > period {
			_, err := k.Rotate(ctx)
			return err == nil, err
		}
	}
	return false, nil
}

// checkRangeKeys returns the first range whose log could not open for
// want of a data key, as a startup error.
func (n *Node) checkRangeKeys() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for name, st := range n.streams {
		for r, d := range st.ranges {
			if d != nil && d.keyErr != nil {
				return fmt.Errorf("regionsvc: stream %s range %d: %w", name, r, d.keyErr)
			}
		}
	}
	if n.replicated() && n.region.meta != nil && n.region.meta.keyErr != nil {
		return fmt.Errorf("regionsvc: catalogue range: %w", n.region.meta.keyErr)
	}
	return nil
}
