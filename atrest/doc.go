// Package atrest is encryption at rest: the sealed unit that replaces a
// frame in a log file, a node's keyring of data keys, and the key
// encryption key (KEK) providers that wrap them. docs/security.md has the
// operator's view (keys, rotation, what is and is not sealed).
//
// # Envelope keys
//
// Frames are sealed with AES-256-GCM under data keys. Each node has its
// own data keys (a Keyring, in <data-dir>/keys/keyring.json), and the
// keyring holds them only wrapped by a KEK that a KEKProvider keeps: a
// KEK file here (FileKEK, geologd --kek-file), a cloud KMS in production
// through the same interface. Without the KEK, the data directory and
// its keyring are opaque; a wrong KEK is refused when the keyring opens
// (ErrWrongKEK, ErrKEKUnavailable), so a node never starts on a key that
// would read garbage.
//
// Regions and nodes share no key: frames travel between them in the
// clear, over TLS, and each receiver seals what it stores under its own
// active key (segment transfer, mirroring). Orphan logs are not sealed yet
// (see notes/atrest.md).
//
// # The sealed unit
//
// A sealed unit takes one frame's place in a log file (see unit.go for
// the bytes): a 24-byte clear header (the frame's length field's
// counterpart, the key id, a kind byte that a plain frame never has, a
// 96-bit nonce), the frame encrypted, and the 16-byte tag: 40 bytes per
// frame. The header is associated data. One unit per frame, not per
// write: a frame is the unit of every log operation (a Raft entry, a
// truncation point, an index entry, a rewrite), and sealing 64 frames of
// 1 KiB one by one measured the same as sealing them as one 64 KiB write
// (BenchmarkSealPerFrame: about 120 µs either way on the shared 2-core
// machine, AES-NI); the per-call cost is lost in the noise of the bytes.
//
// A log file may mix plain frames (written before encryption was on) and
// sealed units under several keys; each names its own key. Readers tell
// them apart by byte 8 (Sealed). Re-encryption rewrites a file under the
// active key (package segment, Store.Reseal).
//
// # Nonces
//
// A data key's nonces are an 8-byte session prefix, random, drawn the
// first time the key seals in a process, and a 4-byte counter; a session
// that has given out 2^32 nonces draws a new prefix. No nonce state is
// persisted, so a crash cannot make one repeat; two sessions of a key
// collide with probability about n^2/2^65 for n sessions.
//
// # Errors
//
// Opening a unit either returns its frame, or an error of one of two
// kinds, which storage code must keep apart:
//
//   - ErrAuth (with batch.ErrCorrupt): the bytes are wrong. Storage judges
//     it as it judges a frame failing its CRC: a torn write at the tail,
//     corruption anywhere else.
//   - ErrKeyUnavailable (*KeyError): the unit names a key this node does
//     not hold. Its bytes may be fine: it is never taken for a torn tail
//     (which would truncate data), and the store refuses to open.
package atrest
