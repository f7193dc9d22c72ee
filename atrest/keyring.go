package atrest

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/vfs"
)

// Config configures a Keyring. Zero values take the documented defaults.
type Config struct {
	// Dir holds the keyring file (KeyringFileName); Open creates it if
	// missing and locks it (one Keyring per directory: a second Open, or
	// an offline tool while a node runs, gets vfs.ErrLocked). Required.
	Dir string
	// FS is the file system of Dir, default vfs.OS().
	FS vfs.FS
	// KEK wraps and unwraps the data keys. Required.
	KEK KEKProvider
	// Create makes Open create a keyring with one fresh data key when Dir
	// holds none; otherwise a missing keyring is ErrNoKeyring.
	Create bool
	// Rand is the source of data keys, key ids and nonce sessions,
	// default crypto/rand.Reader. Tests pass a seeded one.
	Rand io.Reader
	// Now stamps new keys, default time.Now.
	Now func() time.Time
	// Logger defaults to a null logger.
	Logger hclog.Logger
}

// ErrNoKeyring reports a directory without a keyring file, given to Open
// without Config.Create.
var ErrNoKeyring = errors.New("atrest: no keyring")

// ErrInvalidConfig reports a Config that Open refuses.
var ErrInvalidConfig = errors.New("atrest: invalid config")

// Keyring is a node's data keys: it seals frames under the active key and
// opens frames sealed under any key it holds. New keys (Rotate) and new
// wrappings (Rewrap) reach the keyring file before any frame uses them.
// Safe for concurrent use; Seal and Open take no lock.
type Keyring struct {
	cfg  Config
	lock io.Closer
	log  hclog.Logger

	mu   sync.Mutex // serialises Rotate, Rewrap and Close
	set  atomic.Pointer[keySet]
	done bool
}

// keySet is an immutable generation of the keyring: replaced whole by
// Rotate and Rewrap, read without locks.
type keySet struct {
	keys   []*dataKey // oldest first
	byID   map[KeyID]*dataKey
	active *dataKey
}

// dataKey is one data key, unwrapped.
type dataKey struct {
	wrappedKey
	secret []byte
	aead   cipher.AEAD
	// sess is the current nonce session: see nextNonce.
	sess   atomic.Pointer[nonceSession]
	sessMu sync.Mutex
	rand   io.Reader
}

// nonceSession gives out the nonces prefix||counter, counter from 0 up
// to math.MaxUint32.
type nonceSession struct {
	prefix  [8]byte
	counter atomic.Uint64
}

// KeyInfo describes a data key.
type KeyInfo struct {
	ID      KeyID
	Created time.Time
	// KEK is the id of the KEK that wraps it.
	KEK    string
	Active bool
}

// Open loads the keyring in cfg.Dir, unwrapping every data key with
// cfg.KEK, or creates one (cfg.Create). Errors say which key failed and
// why: ErrKEKUnavailable and ErrWrongKEK from the provider, ErrNoKeyring,
// ErrKeyringCorrupt, vfs.ErrLocked. Close releases the directory.
func Open(ctx context.Context, cfg Config) (*Keyring, error) {
	if cfg.Dir == "" || cfg.KEK == nil {
		return nil, fmt.Errorf("%w: Dir and KEK are required", ErrInvalidConfig)
	}
	if cfg.FS == nil {
		cfg.FS = vfs.OS()
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if err := cfg.FS.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("atrest: create %s: %w", cfg.Dir, err)
	}
	if err := cfg.FS.SyncDir(filepath.Dir(filepath.Clean(cfg.Dir))); err != nil {
		return nil, fmt.Errorf("atrest: sync %s: %w", cfg.Dir, err)
	}
	lock, err := cfg.FS.Lock(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("atrest: lock keyring %s: %w", cfg.Dir, err)
	}
	k := &Keyring{cfg: cfg, lock: lock, log: cfg.Logger.Named("atrest")}
	if err := k.load(ctx); err != nil {
		lock.Close()
		return nil, err
	}
	return k, nil
}

func (k *Keyring) path() string { return filepath.Join(k.cfg.Dir, KeyringFileName) }

// load reads the keyring file, or creates it.
func (k *Keyring) load(ctx context.Context) error {
	b, err := vfs.ReadFile(k.cfg.FS, k.path(), keyringBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		if !k.cfg.Create {
			return fmt.Errorf("%w in %s", ErrNoKeyring, k.cfg.Dir)
		}
		key, err := k.newKey(ctx, nil)
		if err != nil {
			return err
		}
		set := newSet([]*dataKey{key}, key)
		if err := k.save(set); err != nil {
			return err
		}
		k.set.Store(set)
		k.log.Info("created keyring", "dir", k.cfg.Dir, "data_key", key.id, "kek", key.kekID)
		return nil
	}
	if err != nil {
		return fmt.Errorf("atrest: read keyring: %w", err)
	}
	wrapped, active, err := decodeKeyring(b)
	if err != nil {
		return fmt.Errorf("%s: %w", k.path(), err)
	}
	keys := make([]*dataKey, len(wrapped))
	for i, w := range wrapped {
		secret, err := k.cfg.KEK.Unwrap(ctx, w.kekID, w.wrapped, wrapContext(w.id))
		if err != nil {
			return fmt.Errorf("atrest: data key %v of %s: %w", w.id, k.path(), err)
		}
		if keys[i], err = k.unwrapped(w, secret); err != nil {
			return fmt.Errorf("atrest: data key %v of %s: %w", w.id, k.path(), err)
		}
	}
	k.set.Store(newSet(keys, keys[active]))
	k.log.Info("opened keyring", "dir", k.cfg.Dir, "data_keys", len(keys), "active", keys[active].id)
	return nil
}

func newSet(keys []*dataKey, active *dataKey) *keySet {
	s := &keySet{keys: keys, byID: make(map[KeyID]*dataKey, len(keys)), active: active}
	for _, key := range keys {
		s.byID[key.id] = key
	}
	return s
}

// unwrapped builds a data key from its wrapped form and secret.
func (k *Keyring) unwrapped(w wrappedKey, secret []byte) (*dataKey, error) {
	if len(secret) != 32 {
		return nil, fmt.Errorf("%w: the provider returned a key of %d bytes", ErrWrongKEK, len(secret))
	}
	aead, err := newAEAD(secret)
	if err != nil {
		return nil, err
	}
	return &dataKey{wrappedKey: w, secret: secret, aead: aead, rand: k.cfg.Rand}, nil
}

// newKey makes a fresh data key with an id none of taken uses, wrapped by
// the provider.
func (k *Keyring) newKey(ctx context.Context, taken map[KeyID]*dataKey) (*dataKey, error) {
	var b [36]byte
	var id KeyID
	for id == 0 || taken[id] != nil {
		if _, err := io.ReadFull(k.cfg.Rand, b[:]); err != nil {
			return nil, fmt.Errorf("atrest: new data key: %w", err)
		}
		id = KeyID(binary.LittleEndian.Uint32(b[32:]))
	}
	secret := slices.Clone(b[:32])
	kekID, wrapped, err := k.cfg.KEK.Wrap(ctx, secret, wrapContext(id))
	if err != nil {
		return nil, fmt.Errorf("atrest: wrap data key %v: %w", id, err)
	}
	if err := checkWrapped(kekID, wrapped); err != nil {
		return nil, err
	}
	return k.unwrapped(wrappedKey{id: id, created: k.cfg.Now(), kekID: kekID, wrapped: wrapped}, secret)
}

func checkWrapped(kekID string, wrapped []byte) error {
	if err := checkKEKID(kekID); err != nil {
		return fmt.Errorf("atrest: the KEK provider's %w", err)
	}
	if len(wrapped) == 0 || len(wrapped) > WrappedBytesMax {
		return fmt.Errorf("atrest: the KEK provider wrapped a data key into %d bytes (1 to %d allowed)", len(wrapped), WrappedBytesMax)
	}
	return nil
}

// save writes set to the keyring file, atomically and durably.
func (k *Keyring) save(set *keySet) error {
	ws := make([]wrappedKey, len(set.keys))
	for i, key := range set.keys {
		ws[i] = key.wrappedKey
	}
	if err := vfs.WriteFileAtomic(k.cfg.FS, k.path(), encodeKeyring(ws, set.active.id), 0o600); err != nil {
		return fmt.Errorf("atrest: write keyring: %w", err)
	}
	return nil
}

// Rotate makes a new data key the active one: frames sealed from now on
// use it, frames sealed before stay readable under their keys (until
// re-encrypted, see package segment's Reseal and the node's background
// re-encryption). The new key is in the keyring file before any frame is
// sealed under it.
func (k *Keyring) Rotate(ctx context.Context) (KeyInfo, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return KeyInfo{}, errors.New("atrest: keyring is closed")
	}
	old := k.set.Load()
	if len(old.keys) >= keysMax {
		return KeyInfo{}, fmt.Errorf("atrest: the keyring holds %d keys already", len(old.keys))
	}
	key, err := k.newKey(ctx, old.byID)
	if err != nil {
		return KeyInfo{}, err
	}
	set := newSet(append(slices.Clone(old.keys), key), key)
	if err := k.save(set); err != nil {
		return KeyInfo{}, err
	}
	k.set.Store(set)
	k.log.Info("rotated data key", "active", key.id, "previous", old.active.id, "kek", key.kekID)
	return key.info(true), nil
}

// Rewrap rotates the KEK: it reloads the provider if it can (Reloader),
// wraps every data key again under the provider's current KEK and writes
// the keyring file. Data keys and sealed frames do not change. It returns
// the current KEK's id and how many keys it wrapped anew (those not under
// it already).
func (k *Keyring) Rewrap(ctx context.Context) (string, int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return "", 0, errors.New("atrest: keyring is closed")
	}
	if r, ok := k.cfg.KEK.(Reloader); ok {
		if err := r.Reload(); err != nil {
			return "", 0, err
		}
	}
	cur, err := k.cfg.KEK.CurrentKEK(ctx)
	if err != nil {
		return "", 0, err
	}
	old := k.set.Load()
	keys := make([]*dataKey, len(old.keys))
	var active *dataKey
	n := 0
	for i, key := range old.keys {
		keys[i] = key
		if key.kekID != cur {
			kekID, wrapped, err := k.cfg.KEK.Wrap(ctx, key.secret, wrapContext(key.id))
			if err != nil {
				return "", 0, fmt.Errorf("atrest: wrap data key %v: %w", key.id, err)
			}
			if err := checkWrapped(kekID, wrapped); err != nil {
				return "", 0, err
			}
			keys[i] = key.rewrapped(kekID, wrapped)
			n++
		}
		if key == old.active {
			active = keys[i]
		}
	}
	set := newSet(keys, active)
	if err := k.save(set); err != nil {
		return "", 0, err
	}
	k.set.Store(set)
	k.log.Info("rewrapped data keys", "kek", cur, "rewrapped", n)
	return cur, n, nil
}

// ErrKeyActive reports Retire of the active data key.
var ErrKeyActive = errors.New("atrest: the active data key cannot be retired")

// Retire removes the data key id from the keyring: once nothing is sealed
// under it any more (the node's background re-encryption rewrote every
// segment and orphan log, see docs/security.md), it need not be kept. It
// refuses the active key (ErrKeyActive) and a key the keyring lacks
// (ErrKeyUnavailable). The caller vouches that no unit names the key: a
// node that finds one refuses to start (ErrKeyUnavailable), and the
// frames under it are lost for good with the key.
func (k *Keyring) Retire(id KeyID) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return errors.New("atrest: keyring is closed")
	}
	old := k.set.Load()
	switch {
	case old.active.id == id:
		return fmt.Errorf("%w: %v", ErrKeyActive, id)
	case old.byID[id] == nil:
		return fmt.Errorf("%w: %v", ErrKeyUnavailable, id)
	}
	keys := slices.DeleteFunc(slices.Clone(old.keys), func(key *dataKey) bool { return key.id == id })
	set := newSet(keys, old.active)
	if err := k.save(set); err != nil {
		return err
	}
	k.set.Store(set)
	k.log.Info("retired data key", "key", id, "active", old.active.id)
	return nil
}

// rewrapped is key with another wrapping; the nonce session carries over
// (the data key is the same, so its nonces must stay unique).
func (key *dataKey) rewrapped(kekID string, wrapped []byte) *dataKey {
	w := key.wrappedKey
	w.kekID, w.wrapped = kekID, wrapped
	nk := &dataKey{wrappedKey: w, secret: key.secret, aead: key.aead, rand: key.rand}
	key.sessMu.Lock()
	// Hand the session over: the old generation may still seal with it,
	// and both draw from the same counter.
	nk.sess.Store(key.ensureSessionLocked())
	key.sessMu.Unlock()
	return nk
}

func (key *dataKey) info(active bool) KeyInfo {
	return KeyInfo{ID: key.id, Created: key.created, KEK: key.kekID, Active: active}
}

// Keys describes the data keys, oldest first.
func (k *Keyring) Keys() []KeyInfo {
	set := k.set.Load()
	out := make([]KeyInfo, len(set.keys))
	for i, key := range set.keys {
		out[i] = key.info(key == set.active)
	}
	return out
}

// Active returns the id of the key new frames are sealed under.
func (k *Keyring) Active() KeyID { return k.set.Load().active.id }

// Has reports whether the keyring holds key id.
func (k *Keyring) Has(id KeyID) bool { return k.set.Load().byID[id] != nil }

// Close releases the keyring's directory. Seal and Open keep working (on
// the keys in memory); Rotate and Rewrap fail.
func (k *Keyring) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return nil
	}
	k.done = true
	return k.lock.Close()
}

// Seal appends to dst the sealed unit of frame under the active key and
// returns it (len(frame)+Overhead bytes more). frame is not checked: it
// is whatever the caller would have written in the clear.
func (k *Keyring) Seal(dst, frame []byte) []byte {
	key := k.set.Load().active
	return seal(dst, key.id, key.aead, key.nextNonce(), frame)
}

// OpenInPlace opens the sealed unit (exactly one whole unit) in place and
// returns the frame it held, which aliases unit[HeaderBytes:]. Errors: the
// header's (CheckHeader), a *KeyError for a key the keyring lacks, or an
// error carrying ErrAuth and batch.ErrCorrupt. The unit's bytes are
// overwritten either way.
func (k *Keyring) OpenInPlace(unit []byte) ([]byte, error) {
	size, id, err := CheckHeader(unit)
	if err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, errKind // a plain frame: nothing to open
	}
	if size != len(unit) {
		return nil, errLengthUnit
	}
	key := k.set.Load().byID[id]
	if key == nil {
		return nil, &KeyError{ID: id}
	}
	return openInPlace(key.aead, unit)
}

// OpenInPlace is Keyring.OpenInPlace for a keyring that may be nil (at-rest
// encryption off): a nil k refuses every sealed unit with a *KeyError.
func OpenInPlace(k *Keyring, unit []byte) ([]byte, error) {
	if k == nil {
		_, id, err := CheckHeader(unit)
		if err != nil {
			return nil, err
		}
		if id == 0 {
			return nil, errKind
		}
		return nil, &KeyError{ID: id, NoKeyring: true}
	}
	return k.OpenInPlace(unit)
}

// nextNonce returns a nonce never returned before under this key: the
// session's 8 random bytes and its counter (big-endian). A session is
// drawn at the key's first seal in this process and whenever the counter
// runs out (2^32 seals), so nonces repeat only if two sessions of a key
// draw the same 64 bits: with a million sessions per key (restarts and
// wraps) that chance is below 3e-8. Keys rotate long before.
func (key *dataKey) nextNonce() [nonceSize]byte {
	for {
		s := key.sess.Load()
		if s == nil {
			key.sessMu.Lock()
			key.ensureSessionLocked()
			key.sessMu.Unlock()
			continue
		}
		n := s.counter.Add(1) - 1
		if n > math.MaxUint32 {
			key.sessMu.Lock()
			if key.sess.Load() == s {
				key.sess.Store(nil)
				key.ensureSessionLocked()
			}
			key.sessMu.Unlock()
			continue
		}
		var nonce [nonceSize]byte
		copy(nonce[:8], s.prefix[:])
		binary.BigEndian.PutUint32(nonce[8:], uint32(n))
		return nonce
	}
}

// ensureSessionLocked draws a session if there is none and returns the
// current one; the caller holds sessMu.
func (key *dataKey) ensureSessionLocked() *nonceSession {
	if s := key.sess.Load(); s != nil {
		return s
	}
	s := &nonceSession{}
	if _, err := io.ReadFull(key.rand, s.prefix[:]); err != nil {
		// The system's random source failing is not an operating error
		// anyone can handle; sealing without a fresh nonce would be worse.
		panic(fmt.Sprintf("atrest: random source failed: %v", err))
	}
	key.sess.Store(s)
	return s
}
