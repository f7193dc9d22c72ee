package atrest

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/geolog/geolog/vfs"
)

// KEKProvider wraps and unwraps data keys under key encryption keys
// (KEKs) that it holds and geolog never sees: a file here (FileKEK), a
// cloud KMS or an HSM in production (docs/security.md shows how AWS KMS,
// Google Cloud KMS and Vault's transit engine map onto it). A provider
// must be safe for concurrent use. Its calls are rare: every data key is
// unwrapped once when a node starts, and wrapped once when created or
// when the KEK rotates; records never reach it.
type KEKProvider interface {
	// Wrap encrypts dataKey under the provider's current KEK, binding
	// context (which Unwrap must be given again: the key id, so that a
	// wrapped key cannot be passed off as another), and returns that KEK's
	// id and the wrapped bytes (at most WrappedBytesMax).
	Wrap(ctx context.Context, dataKey, context []byte) (kekID string, wrapped []byte, err error)
	// Unwrap returns the data key that Wrap wrapped under KEK kekID with
	// context. A KEK the provider does not hold is an error wrapping
	// ErrKEKUnavailable; wrapped bytes that KEK does not open (another key
	// under the same id, another context, tampering), ErrWrongKEK.
	Unwrap(ctx context.Context, kekID string, wrapped, context []byte) ([]byte, error)
	// CurrentKEK returns the id of the KEK that Wrap uses now.
	CurrentKEK(ctx context.Context) (string, error)
}

// Reloader is a KEKProvider whose KEKs can change while the node runs:
// a rotation of the KEK (Keyring.Rewrap) reloads first.
type Reloader interface {
	Reload() error
}

// WrappedBytesMax bounds a wrapped data key, so that a keyring file stays
// small whatever the provider.
const WrappedBytesMax = 4096

var (
	// ErrKEKUnavailable reports a data key wrapped under a KEK the provider
	// does not hold (a KEK file without it, a KMS key the node may not
	// use).
	ErrKEKUnavailable = errors.New("atrest: the key encryption key is not available")
	// ErrWrongKEK reports a wrapped data key that the provider's KEK of
	// that id does not open: the provider holds another key under the
	// same id, or the keyring file was altered.
	ErrWrongKEK = errors.New("atrest: the key encryption key does not open the data key (wrong key?)")
	// ErrKEKFile reports a KEK file that cannot be used: unreadable,
	// malformed, empty, or readable by group or others.
	ErrKEKFile = errors.New("atrest: bad KEK file")
)

// kekFileVersion is the KEK file format this package reads and writes.
const kekFileVersion = 1

// kekFileBytesMax bounds what a KEK file may hold.
const kekFileBytesMax = 1 << 20

// kekFile is the JSON form of a KEK file:
//
//	{"version": 1, "keks": [{"id": "kek-...", "secret": "<32 bytes, base64>"}, ...]}
//
// The last KEK listed wraps new data keys; the others still unwrap.
type kekFile struct {
	Version int            `json:"version"`
	KEKs    []kekFileEntry `json:"keks"`
}

type kekFileEntry struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

// kekIDBytesMax bounds a KEK id.
const kekIDBytesMax = 128

// wrapLabel starts the associated data of a data key wrapped by a file
// KEK, so that nothing else sealed under the same KEK opens as a data key.
const wrapLabel = "geolog at-rest data key wrap v1\x00"

// FileKEK is a KEKProvider backed by a KEK file (geologd --kek-file): a
// small JSON file of 256-bit keys, mode 0600, which must live apart from
// the data directory (a disk that holds both protects nothing). Data keys
// are wrapped with AES-256-GCM under the newest KEK (random 96-bit
// nonces: a KEK wraps a handful of keys in its life). Safe for concurrent
// use.
type FileKEK struct {
	path string
	mu   sync.RWMutex
	keks []fileKEK // file order: the last is current
}

type fileKEK struct {
	id   string
	aead cipher.AEAD
}

// NewMemKEK returns a provider that holds one KEK, id, in memory: the
// in-memory twin of a KEK file, for tests and the simulator. secret is 32
// bytes.
func NewMemKEK(id string, secret []byte) (*FileKEK, error) {
	if err := checkKEKID(id); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKEKFile, err)
	}
	if len(secret) != 32 {
		return nil, fmt.Errorf("%w: a secret of %d bytes, want 32", ErrKEKFile, len(secret))
	}
	aead, err := newAEAD(secret)
	if err != nil {
		return nil, err
	}
	return &FileKEK{keks: []fileKEK{{id: id, aead: aead}}}, nil
}

// OpenKEKFile loads a KEK file (see FileKEK). A file accessible by group
// or others is refused.
func OpenKEKFile(path string) (*FileKEK, error) {
	k := &FileKEK{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the file again; on error the KEKs loaded before stay. A
// provider from NewMemKEK has nothing to reload.
func (k *FileKEK) Reload() error {
	if k.path == "" && len(k.keks) > 0 {
		return nil
	}
	keks, err := readKEKFile(k.path)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.keks = keks
	k.mu.Unlock()
	return nil
}

func readKEKFile(path string) ([]fileKEK, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKEKFile, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s is mode %v, accessible by group or others (want 0600)", ErrKEKFile, path, st.Mode().Perm())
	}
	b, err := vfs.ReadFile(vfs.OS(), path, kekFileBytesMax)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKEKFile, err)
	}
	keks, err := parseKEKFile(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrKEKFile, path, err)
	}
	return keks, nil
}

// parseKEKFile decodes and checks a KEK file's bytes.
func parseKEKFile(b []byte) ([]fileKEK, error) {
	var kf kekFile
	if err := json.Unmarshal(b, &kf); err != nil {
		return nil, err
	}
	if kf.Version != kekFileVersion {
		return nil, fmt.Errorf("version %d, want %d", kf.Version, kekFileVersion)
	}
	if len(kf.KEKs) == 0 {
		return nil, errors.New("no key")
	}
	var keks []fileKEK
	for i, e := range kf.KEKs {
		if err := checkKEKID(e.ID); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		if slices.ContainsFunc(keks, func(k fileKEK) bool { return k.id == e.ID }) {
			return nil, fmt.Errorf("key %d: id %q listed twice", i, e.ID)
		}
		secret, err := base64.StdEncoding.DecodeString(e.Secret)
		if err != nil || len(secret) != 32 {
			return nil, fmt.Errorf("key %q: the secret is not 32 bytes in base64", e.ID)
		}
		aead, err := newAEAD(secret)
		if err != nil {
			return nil, err
		}
		keks = append(keks, fileKEK{id: e.ID, aead: aead})
	}
	return keks, nil
}

// checkKEKID accepts ids of printable ASCII without spaces.
func checkKEKID(id string) error {
	if id == "" || len(id) > kekIDBytesMax {
		return fmt.Errorf("KEK id of %d bytes", len(id))
	}
	for _, c := range []byte(id) {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("KEK id %q: only printable ASCII without spaces", id)
		}
	}
	return nil
}

func newAEAD(secret []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(secret)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func (k *FileKEK) find(id string) (cipher.AEAD, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	for _, e := range k.keks {
		if e.id == id {
			return e.aead, true
		}
	}
	return nil, false
}

// CurrentKEK implements KEKProvider: the last KEK of the file.
func (k *FileKEK) CurrentKEK(context.Context) (string, error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.keks[len(k.keks)-1].id, nil
}

// IDs returns the ids of the file's KEKs, in file order.
func (k *FileKEK) IDs() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	ids := make([]string, len(k.keks))
	for i, e := range k.keks {
		ids[i] = e.id
	}
	return ids
}

// Wrap implements KEKProvider: nonce, then ciphertext and tag.
func (k *FileKEK) Wrap(_ context.Context, dataKey, context []byte) (string, []byte, error) {
	k.mu.RLock()
	cur := k.keks[len(k.keks)-1]
	k.mu.RUnlock()
	nonce := make([]byte, cur.aead.NonceSize(), cur.aead.NonceSize()+len(dataKey)+cur.aead.Overhead())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return "", nil, err
	}
	return cur.id, cur.aead.Seal(nonce, nonce, dataKey, append([]byte(wrapLabel), context...)), nil
}

// Unwrap implements KEKProvider.
func (k *FileKEK) Unwrap(_ context.Context, kekID string, wrapped, context []byte) ([]byte, error) {
	aead, ok := k.find(kekID)
	if !ok {
		return nil, fmt.Errorf("%w: KEK %q is not in %s (it holds %s)", ErrKEKUnavailable, kekID, k.path, strings.Join(k.IDs(), ", "))
	}
	n := aead.NonceSize()
	if len(wrapped) < n+aead.Overhead() {
		return nil, fmt.Errorf("%w: KEK %q: a wrapped key of %d bytes", ErrWrongKEK, kekID, len(wrapped))
	}
	key, err := aead.Open(nil, wrapped[:n], wrapped[n:], append([]byte(wrapLabel), context...))
	if err != nil {
		return nil, fmt.Errorf("%w: KEK %q in %s does not open it", ErrWrongKEK, kekID, k.path)
	}
	return key, nil
}

// AddKEK adds a new random KEK to the KEK file at path (creating the file,
// mode 0600, if missing) as its current one, and returns its id. The file
// is replaced atomically. Running nodes keep wrapping under the KEK they
// loaded until their KEK is rotated (Keyring.Rewrap reloads the file).
func AddKEK(path string) (string, error) {
	fsys := vfs.OS()
	var kf kekFile
	b, err := vfs.ReadFile(fsys, path, kekFileBytesMax)
	switch {
	case err == nil:
		if _, err := parseKEKFile(b); err != nil {
			return "", fmt.Errorf("%w: %s: %w", ErrKEKFile, path, err)
		}
		if err := json.Unmarshal(b, &kf); err != nil {
			return "", err
		}
	case errors.Is(err, os.ErrNotExist):
		kf.Version = kekFileVersion
	default:
		return "", fmt.Errorf("%w: %w", ErrKEKFile, err)
	}
	secret := make([]byte, 32)
	var idb [6]byte
	if _, err := io.ReadFull(rand.Reader, secret); err != nil {
		return "", err
	}
	if _, err := io.ReadFull(rand.Reader, idb[:]); err != nil {
		return "", err
	}
	id := "kek-" + hex.EncodeToString(idb[:])
	kf.KEKs = append(kf.KEKs, kekFileEntry{ID: id, Secret: base64.StdEncoding.EncodeToString(secret)})
	out, err := json.MarshalIndent(kf, "", "  ")
	if err != nil {
		return "", err
	}
	if err := vfs.WriteFileAtomic(fsys, path, append(out, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("atrest: write KEK file: %w", err)
	}
	return id, nil
}

// RemoveKEK removes the KEK id from the KEK file at path, atomically. The
// current (last) KEK cannot be removed, nor can one that still wraps a
// data key: check every node first (geolog keys list).
func RemoveKEK(path, id string) error {
	fsys := vfs.OS()
	b, err := vfs.ReadFile(fsys, path, kekFileBytesMax)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrKEKFile, err)
	}
	if _, err := parseKEKFile(b); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrKEKFile, path, err)
	}
	var kf kekFile
	if err := json.Unmarshal(b, &kf); err != nil {
		return err
	}
	i := slices.IndexFunc(kf.KEKs, func(e kekFileEntry) bool { return e.ID == id })
	switch {
	case i < 0:
		return fmt.Errorf("%w: %s holds no KEK %q", ErrKEKUnavailable, path, id)
	case i == len(kf.KEKs)-1:
		return fmt.Errorf("atrest: %q is the current KEK of %s: add another first", id, path)
	}
	kf.KEKs = slices.Delete(kf.KEKs, i, i+1)
	out, err := json.MarshalIndent(kf, "", "  ")
	if err != nil {
		return err
	}
	return vfs.WriteFileAtomic(fsys, path, append(out, '\n'), 0o600)
}
