// Package e2e seals record values end to end: a producer encrypts each
// record's value, and the headers the application names, under a key of
// the record's conversation; the servers store and replicate only the
// sealed bytes; a consumer holding the key opens them. The client package
// turns it on with one option on each side:
//
//	keys := e2e.NewKeyring()
//	k, _ := e2e.NewKey("room-1/1")
//	keys.Add("chat", []byte("room-1"), k)
//	p, _ := c.NewProducer("chat", client.SealWith(keys, "sender"))
//	for rec, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{}, client.OpenWith(keys)) { ... }
//
// docs/e2e-encryption.md describes the envelope byte by byte, for clients
// in other languages, and the choices behind it.
//
// # Model
//
// A conversation is a record key within a stream: the key stays in clear
// (it routes the record to its range) and names whose keys seal and open
// the record. A KeyProvider gives each conversation a current key, which
// seals new records, and finds any key by id to open old ones, so keys
// rotate without re-encrypting anything: a new key becomes current, records
// sealed under older ones keep opening while the provider keeps those keys.
// Keyring is the in-memory provider; KeyFile reads a JSON key file.
//
// # What a seal protects
//
//  1. Confidentiality of the value and the sealed headers (their names
//     too). The key, the clear headers, the producer time, the key id and
//     the sizes stay visible to the servers.
//  2. Integrity of all of it: the ciphertext is bound, as associated data,
//     to the stream, the record key, the producer time, the clear headers
//     and the envelope's version, suite and key id. A server that moves a
//     ciphertext to another stream or conversation, or edits anything
//     bound, makes it fail to open (ErrTampered).
//  3. Key commitment: each envelope commits to its key, so a record opens
//     under one key only, and a key that is not the sealing one is told
//     apart (ErrWrongKey) from a changed ciphertext (ErrTampered).
//
// Not protected: the order of records, their presence (a server may drop
// one) and their uniqueness (a server may append a ciphertext again in the
// same conversation; its offset differs). An application that needs those
// puts a message id or counter inside the sealed value.
//
// # Contract
//
//  1. Seal reads the conversation's current key once, draws a fresh
//     24-byte salt from crypto/rand, and returns a new record; it never
//     modifies its input.
//  2. Open returns a record only if every check passed; otherwise nil and
//     an *Error wrapping one sentinel (ErrNotSealed, ErrMalformed,
//     ErrUnsupported, ErrUnknownKey, ErrWrongKey, ErrTampered) or the
//     provider's own error. It never returns unauthenticated bytes.
//  3. Parsing is bounded by the input: nothing is allocated from a length
//     or count before it is checked against the bytes that remain, and no
//     input panics (FuzzOpen).
package e2e
