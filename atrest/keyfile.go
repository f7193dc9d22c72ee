package atrest

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"
)

// The keyring file (KeyringFileName in the keyring's directory) lists a
// node's data keys, each wrapped by the KEK provider:
//
//	{
//	  "version": 1,
//	  "active": "1f2e3d4c",
//	  "keys": [
//	    {"id": "1f2e3d4c", "created": "2026-12-01T10:00:00Z",
//	     "kek": "kek-0a1b2c3d4e5f", "wrapped": "<base64>"}
//	  ]
//	}
//
// Keys are listed oldest first; active is the one new frames are sealed
// under. The file holds no secret in the clear: without the KEK it is
// useless, and it is useless without the data directory too.

// NodeKeysDirName is the keyring's directory in a node's data directory.
const NodeKeysDirName = "keys"

// NodeKeysDir is the keyring directory of a node's data directory.
func NodeKeysDir(dataDir string) string { return filepath.Join(dataDir, NodeKeysDirName) }

// KeyringFileName is the keyring file's name in Config.Dir.
const KeyringFileName = "keyring.json"

// keyringVersion is the keyring file format this package reads and writes.
const keyringVersion = 1

// keyringBytesMax and keysMax bound a keyring file: a node rotating its
// data key every day for 25 years stays under keysMax.
const (
	keyringBytesMax = 4 << 20
	keysMax         = 10000
)

// ErrKeyringCorrupt reports a keyring file that does not decode or whose
// fields do not hold together.
var ErrKeyringCorrupt = errors.New("atrest: keyring file is corrupt")

type keyringFile struct {
	Version int            `json:"version"`
	Active  string         `json:"active"`
	Keys    []keyringEntry `json:"keys"`
}

type keyringEntry struct {
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
	KEK     string    `json:"kek"`
	Wrapped string    `json:"wrapped"`
}

// wrappedKey is a data key as the keyring file holds it.
type wrappedKey struct {
	id      KeyID
	created time.Time
	kekID   string
	wrapped []byte
}

// decodeKeyring parses and checks a keyring file: every error wraps
// ErrKeyringCorrupt. It returns the keys, oldest first, and the active
// one's position.
func decodeKeyring(b []byte) ([]wrappedKey, int, error) {
	bad := func(format string, args ...any) ([]wrappedKey, int, error) {
		return nil, 0, fmt.Errorf("%w: "+format, append([]any{ErrKeyringCorrupt}, args...)...)
	}
	if len(b) > keyringBytesMax {
		return bad("%d bytes", len(b))
	}
	var f keyringFile
	if err := json.Unmarshal(b, &f); err != nil {
		return bad("%v", err)
	}
	if f.Version != keyringVersion {
		return bad("version %d, want %d", f.Version, keyringVersion)
	}
	if len(f.Keys) == 0 || len(f.Keys) > keysMax {
		return bad("%d keys", len(f.Keys))
	}
	active := -1
	keys := make([]wrappedKey, 0, len(f.Keys))
	seen := make(map[KeyID]bool, len(f.Keys))
	for i, e := range f.Keys {
		id, err := parseKeyID(e.ID)
		if err != nil {
			return bad("key %d: %v", i, err)
		}
		if seen[id] {
			return bad("key %v listed twice", id)
		}
		seen[id] = true
		if err := checkKEKID(e.KEK); err != nil {
			return bad("key %v: %v", id, err)
		}
		w, err := base64.StdEncoding.DecodeString(e.Wrapped)
		if err != nil || len(w) == 0 || len(w) > WrappedBytesMax {
			return bad("key %v: wrapped key of %d characters is not base64 of 1 to %d bytes", id, len(e.Wrapped), WrappedBytesMax)
		}
		if e.ID == f.Active {
			active = i
		}
		keys = append(keys, wrappedKey{id: id, created: e.Created, kekID: e.KEK, wrapped: w})
	}
	if active < 0 {
		return bad("active key %q is not listed", f.Active)
	}
	return keys, active, nil
}

// encodeKeyring is decodeKeyring's inverse.
func encodeKeyring(keys []wrappedKey, active KeyID) []byte {
	f := keyringFile{Version: keyringVersion, Active: active.String()}
	for _, k := range keys {
		f.Keys = append(f.Keys, keyringEntry{ID: k.id.String(), Created: k.created.UTC(), KEK: k.kekID,
			Wrapped: base64.StdEncoding.EncodeToString(k.wrapped)})
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("atrest: encode keyring: %v", err)) // plain strings and times only
	}
	return append(b, '\n')
}

// ParseKeyID reads a key id as KeyID.String writes it (8 hex digits).
func ParseKeyID(s string) (KeyID, error) { return parseKeyID(s) }

func parseKeyID(s string) (KeyID, error) {
	if len(s) != 8 {
		return 0, fmt.Errorf("key id %q is not 8 hex digits", s)
	}
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("key id %q is not 8 hex digits naming a key", s)
	}
	return KeyID(v), nil
}

// wrapContext is what a data key's wrapping binds: its id.
func wrapContext(id KeyID) []byte {
	return binary.LittleEndian.AppendUint32([]byte("data key "), uint32(id))
}
