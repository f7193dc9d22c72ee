package e2e

import (
	"crypto/rand"
	"fmt"
	"sync"
)

// Key is a conversation key: a 32-byte secret and the id that names it in
// every envelope sealed under it.
type Key struct {
	// ID is 1 to KeyIDBytesMax bytes, any bytes. It travels in clear: do
	// not put secrets in it. It must name one secret for good, in every
	// conversation that may use it.
	ID string
	// Secret is SecretBytes of key material. Callers must not modify a
	// Secret after handing the key over, nor one a provider returned.
	Secret []byte
}

// NewKey returns a key named id with a fresh random secret.
func NewKey(id string) (Key, error) {
	k := Key{ID: id, Secret: make([]byte, SecretBytes)}
	rand.Read(k.Secret) // crypto/rand.Read never fails (it crashes the program instead)
	return k, k.validate()
}

func (k Key) validate() error {
	switch {
	case len(k.ID) == 0 || len(k.ID) > KeyIDBytesMax:
		return fmt.Errorf("%w: key id of %d bytes (want 1 to %d)", ErrInvalidKey, len(k.ID), KeyIDBytesMax)
	case len(k.Secret) != SecretBytes:
		return fmt.Errorf("%w: secret of %d bytes (want %d)", ErrInvalidKey, len(k.Secret), SecretBytes)
	}
	return nil
}

// KeyProvider supplies the keys of conversations. A conversation is a
// record key within a stream: the key routes the record and stays in
// clear, and every record of one conversation is sealed under that
// conversation's current key.
//
// Its methods are called for every record, from producer and consumer
// goroutines at once: they must be safe for concurrent use and fast (keep
// keys in memory; fetch them from a key service out of band).
type KeyProvider interface {
	// CurrentKey returns the key to seal new records of the conversation
	// with, or an error wrapping ErrUnknownKey if it has none.
	CurrentKey(stream string, conversation []byte) (Key, error)
	// Key returns the key named id if it may open records of the
	// conversation, or an error wrapping ErrUnknownKey. Keys that were
	// current once stay here for as long as their records must open.
	Key(stream string, conversation []byte, id string) (Key, error)
}

// Keyring is the in-memory KeyProvider: keys per conversation of a stream,
// and stream-wide keys for conversations that have none of their own.
// Adding a key to a conversation makes it that conversation's current key;
// the earlier ones keep opening the records sealed under them. It is safe
// for concurrent use.
type Keyring struct {
	mu     sync.RWMutex
	scopes map[scope]*scopeKeys
	// added lists every key in the order added, for WriteKeyFile.
	added []scopedKey
}

// scope is one conversation of a stream, or (all) every conversation of
// it without keys of its own.
type scope struct {
	stream       string
	conversation string
	all          bool
}

type scopeKeys struct {
	current Key
	byID    map[string]Key
}

type scopedKey struct {
	scope scope
	key   Key
}

// NewKeyring returns an empty keyring.
func NewKeyring() *Keyring { return &Keyring{scopes: map[scope]*scopeKeys{}} }

// Add adds k to the conversation's keys and makes it current. A key id
// already in the conversation is refused (ErrDuplicateKey).
func (r *Keyring) Add(stream string, conversation []byte, k Key) error {
	return r.add(scope{stream: stream, conversation: string(conversation)}, k)
}

// AddStream adds k to the stream-wide keys and makes it current for every
// conversation of stream without keys of its own. Such a conversation also
// opens records under its stream's keys after it gets its own.
func (r *Keyring) AddStream(stream string, k Key) error {
	return r.add(scope{stream: stream, all: true}, k)
}

func (r *Keyring) add(s scope, k Key) error {
	if err := k.validate(); err != nil {
		return err
	}
	k = Key{ID: k.ID, Secret: append([]byte(nil), k.Secret...)}
	r.mu.Lock()
	defer r.mu.Unlock()
	sk := r.scopes[s]
	if sk == nil {
		sk = &scopeKeys{byID: map[string]Key{}}
		r.scopes[s] = sk
	}
	if _, ok := sk.byID[k.ID]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateKey, k.ID)
	}
	sk.byID[k.ID] = k
	sk.current = k
	r.added = append(r.added, scopedKey{s, k})
	return nil
}

// CurrentKey implements KeyProvider.
func (r *Keyring) CurrentKey(stream string, conversation []byte) (Key, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if sk := r.scopes[scope{stream: stream, conversation: string(conversation)}]; sk != nil {
		return sk.current, nil
	}
	if sk := r.scopes[scope{stream: stream, all: true}]; sk != nil {
		return sk.current, nil
	}
	return Key{}, fmt.Errorf("%w: no key for conversation %q of stream %q", ErrUnknownKey, conversation, stream)
}

// Key implements KeyProvider.
func (r *Keyring) Key(stream string, conversation []byte, id string) (Key, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if sk := r.scopes[scope{stream: stream, conversation: string(conversation)}]; sk != nil {
		if k, ok := sk.byID[id]; ok {
			return k, nil
		}
	}
	if sk := r.scopes[scope{stream: stream, all: true}]; sk != nil {
		if k, ok := sk.byID[id]; ok {
			return k, nil
		}
	}
	return Key{}, fmt.Errorf("%w: no key %q for conversation %q of stream %q", ErrUnknownKey, id, conversation, stream)
}

// keys returns the keys in the order added.
func (r *Keyring) keys() []scopedKey {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]scopedKey(nil), r.added...)
}
