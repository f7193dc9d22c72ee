package e2e

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/geolog/geolog/vfs"
)

// KeyFileVersion is the key file format version this package reads and
// writes.
const KeyFileVersion = 1

// keyFileBytesMax bounds what ReadKeyFile reads: about 60,000 keys.
const keyFileBytesMax = 16 << 20

// ErrKeyFilePermissions: a key file is readable or writable by group or
// others.
var ErrKeyFilePermissions = errors.New("e2e: key file is accessible by group or others (want mode 0600 or stricter)")

// keyFile is the JSON form of a key file (docs/e2e-encryption.md). Keys
// are listed in the order added: a conversation's (or a stream's) current
// key is the last one listed for it.
type keyFile struct {
	Version int            `json:"version"`
	Keys    []keyFileEntry `json:"keys"`
}

type keyFileEntry struct {
	Stream string `json:"stream"`
	// Conversation is a UTF-8 record key; ConversationBase64 any other.
	Conversation       string `json:"conversation,omitempty"`
	ConversationBase64 string `json:"conversation_base64,omitempty"`
	// AllConversations marks a stream-wide key (Keyring.AddStream).
	AllConversations bool   `json:"all_conversations,omitempty"`
	ID               string `json:"id"`
	// Secret is the 32-byte secret in standard base64.
	Secret string `json:"secret"`
}

// ReadKeyFile loads a keyring from a key file. The file must not be
// accessible by group or others (ErrKeyFilePermissions).
func ReadKeyFile(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("e2e: key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("e2e: key file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s is %v", ErrKeyFilePermissions, path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, keyFileBytesMax+1))
	if err != nil {
		return nil, fmt.Errorf("e2e: key file %s: %w", path, err)
	}
	if len(b) > keyFileBytesMax {
		return nil, fmt.Errorf("e2e: key file %s is larger than %d bytes", path, keyFileBytesMax)
	}
	r, err := parseKeyFile(b)
	if err != nil {
		return nil, fmt.Errorf("e2e: key file %s: %w", path, err)
	}
	return r, nil
}

func parseKeyFile(b []byte) (*Keyring, error) {
	var kf keyFile
	if err := json.Unmarshal(b, &kf); err != nil {
		return nil, err
	}
	if kf.Version != KeyFileVersion {
		return nil, fmt.Errorf("%w: key file version %d (want %d)", ErrUnsupported, kf.Version, KeyFileVersion)
	}
	r := NewKeyring()
	for i, e := range kf.Keys {
		if err := r.addEntry(e); err != nil {
			return nil, fmt.Errorf("key %d (%q): %w", i, e.ID, err)
		}
	}
	return r, nil
}

func (r *Keyring) addEntry(e keyFileEntry) error {
	secret, err := base64.StdEncoding.DecodeString(e.Secret)
	if err != nil {
		return fmt.Errorf("%w: secret: %v", ErrInvalidKey, err)
	}
	k := Key{ID: e.ID, Secret: secret}
	conv := []byte(e.Conversation)
	if e.ConversationBase64 != "" {
		if e.Conversation != "" {
			return fmt.Errorf("both conversation and conversation_base64")
		}
		if conv, err = base64.StdEncoding.DecodeString(e.ConversationBase64); err != nil {
			return fmt.Errorf("conversation_base64: %v", err)
		}
	}
	if e.AllConversations {
		if len(conv) != 0 {
			return fmt.Errorf("all_conversations with a conversation")
		}
		return r.AddStream(e.Stream, k)
	}
	return r.Add(e.Stream, conv, k)
}

// WriteKeyFile writes r's keys to path with mode 0600, atomically: a
// reader sees the old file or the new one, and the new one is on disk when
// it returns.
func WriteKeyFile(path string, r *Keyring) error {
	kf := keyFile{Version: KeyFileVersion}
	for _, sk := range r.keys() {
		if !utf8.ValidString(sk.key.ID) {
			return fmt.Errorf("e2e: key id %q is not UTF-8: a key file cannot hold it", sk.key.ID)
		}
		e := keyFileEntry{Stream: sk.scope.stream, AllConversations: sk.scope.all, ID: sk.key.ID,
			Secret: base64.StdEncoding.EncodeToString(sk.key.Secret)}
		if utf8.ValidString(sk.scope.conversation) {
			e.Conversation = sk.scope.conversation
		} else {
			e.ConversationBase64 = base64.StdEncoding.EncodeToString([]byte(sk.scope.conversation))
		}
		kf.Keys = append(kf.Keys, e)
	}
	b, err := json.MarshalIndent(kf, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'))
}

// writeFileAtomic writes a key file: mode 0600, atomically.
func writeFileAtomic(path string, data []byte) error {
	if err := vfs.WriteFileAtomic(vfs.OS(), path, data, 0o600); err != nil {
		return fmt.Errorf("e2e: write key file: %w", err)
	}
	return nil
}

// KeyFile is a KeyProvider backed by a key file: the keyring ReadKeyFile
// loads, loaded again by Reload and, at most once per ReloadIntervalMin,
// when a record names a key id the keyring lacks (another process added a
// key to the file). The current key of a conversation changes only on a
// reload. It is safe for concurrent use.
type KeyFile struct {
	path string
	ring atomic.Pointer[Keyring]

	mu     sync.Mutex // serializes reloads; guards loaded
	loaded time.Time
	// reloadInterval is ReloadIntervalMin; tests shorten it.
	reloadInterval time.Duration
}

// ReloadIntervalMin is how often, at most, a KeyFile reloads by itself on
// an unknown key id.
const ReloadIntervalMin = time.Second

// OpenKeyFile loads path (see ReadKeyFile).
func OpenKeyFile(path string) (*KeyFile, error) {
	f := &KeyFile{path: path, reloadInterval: ReloadIntervalMin}
	if err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Reload reads the file again. On error the keys loaded before stay.
func (f *KeyFile) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reloadLocked()
}

func (f *KeyFile) reloadLocked() error {
	f.loaded = time.Now()
	r, err := ReadKeyFile(f.path)
	if err != nil {
		return err
	}
	f.ring.Store(r)
	return nil
}

// CurrentKey implements KeyProvider.
func (f *KeyFile) CurrentKey(stream string, conversation []byte) (Key, error) {
	return f.ring.Load().CurrentKey(stream, conversation)
}

// Key implements KeyProvider.
func (f *KeyFile) Key(stream string, conversation []byte, id string) (Key, error) {
	k, err := f.ring.Load().Key(stream, conversation, id)
	if !errors.Is(err, ErrUnknownKey) {
		return k, err
	}
	// Whether this call reloads or another one just did, the keyring to
	// ask again is the newest.
	f.reloadIfStale()
	return f.ring.Load().Key(stream, conversation, id)
}

// reloadIfStale reloads unless the last load is recent. A failed reload
// keeps the keys loaded before.
func (f *KeyFile) reloadIfStale() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.loaded) >= f.reloadInterval {
		f.reloadLocked()
	}
}
