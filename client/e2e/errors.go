package e2e

import (
	"errors"
	"fmt"
)

// The reasons a record cannot be sealed or opened. Every error this package
// returns wraps one of them (test with errors.Is); an *Error adds the
// operation and the key id.
var (
	// ErrNotSealed: the record has no sealed-record marker header (it was
	// appended without end-to-end encryption, or the marker was removed).
	ErrNotSealed = errors.New("e2e: record is not sealed")
	// ErrMalformed: the envelope or its payload does not parse, or the
	// marker header appears more than once.
	ErrMalformed = errors.New("e2e: malformed envelope")
	// ErrUnsupported: the envelope's version or suite is not one this
	// package knows (a newer producer).
	ErrUnsupported = errors.New("e2e: unsupported envelope version or suite")
	// ErrUnknownKey: the key provider has no key with the envelope's key id
	// for the record's conversation (opening), or no current key for it
	// (sealing).
	ErrUnknownKey = errors.New("e2e: unknown key")
	// ErrWrongKey: the key the provider returned for the envelope's key id
	// is not the one the record was sealed with (its commitment does not
	// match): the provider holds another secret under that id, or the
	// commitment bytes were altered.
	ErrWrongKey = errors.New("e2e: wrong key")
	// ErrTampered: authentication failed: the ciphertext, or what it is
	// bound to (stream, record key, producer time, clear headers, key id),
	// is not what was sealed. A record moved to another stream or
	// conversation fails this way.
	ErrTampered = errors.New("e2e: authentication failed (tampered or moved record)")
	// ErrReservedHeader: a record to seal already carries a header named
	// HeaderName.
	ErrReservedHeader = errors.New("e2e: record uses the reserved header " + HeaderName)
	// ErrInvalidKey: a key's id or secret has the wrong size.
	ErrInvalidKey = errors.New("e2e: invalid key")
	// ErrDuplicateKey: a key id added twice to one conversation of a
	// Keyring.
	ErrDuplicateKey = errors.New("e2e: duplicate key id")
)

// Error is a sealing or opening failure: Op is "seal" or "open", KeyID the
// envelope's (or the current) key id when known, Err one of the sentinels
// above or the key provider's own error.
type Error struct {
	Op    string
	KeyID string
	Err   error
}

func (e *Error) Error() string {
	if e.KeyID == "" {
		return fmt.Sprintf("e2e: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("e2e: %s under key id %q: %v", e.Op, e.KeyID, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

func openErr(keyID string, err error) error { return &Error{Op: "open", KeyID: keyID, Err: err} }

func sealErr(keyID string, err error) error { return &Error{Op: "seal", KeyID: keyID, Err: err} }
