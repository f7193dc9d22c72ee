package segment

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/keyspace"
	"github.com/geolog/geolog/vfs"
)

// The key index: which records of a segment have a given key. See the
// package documentation for the file format and the contract.

const (
	keyIndexMagic   = "GLKI"
	keyIndexVersion = 1
	// keyIndexHeaderBytes is the size of the file's header.
	keyIndexHeaderBytes = 32
	// keyEntryBytes is the size of one entry: hash u32, relOffset u32,
	// filePos u32.
	keyEntryBytes = 12
	// keyBlockEntries is the number of entries of a full block; each block
	// is followed by the CRC-32C of its entries.
	keyBlockEntries = 256
	// keyBlockBytes is the size of a full block with its CRC.
	keyBlockBytes = keyBlockEntries*keyEntryBytes + 4
)

// errKeyIndexInvalid marks a key index file that fails validation.
var errKeyIndexInvalid = errors.New("segment: invalid key index file")

// keyHash is the hash the key index files a key under: the low 32 bits of
// the key's XXH64 (keyspace.Hash). The high bits pick the key's range, so
// the keys of one range share them; the low bits are as good as random.
// Keys that share a hash are told apart by comparing the keys themselves.
func keyHash(key []byte) uint32 { return uint32(keyspace.Hash(key)) }

// keyEntry is one record in a key index: the record at relative offset
// rel, in the frame that starts at file position pos, has a key of hash
// hash.
type keyEntry struct {
	hash, rel, pos uint32
}

// sortKey orders entries by hash, then offset.
func (e keyEntry) sortKey() uint64 { return uint64(e.hash)<<32 | uint64(e.rel) }

// mix scrambles e for the fingerprint (see keyFingerprint).
func (e keyEntry) mix() uint64 {
	return splitmix64(splitmix64(e.sortKey()) + uint64(e.pos))
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// keyFingerprint summarises a set of entries independently of their order:
// the count and the sum of every entry's mix. Recovery computes it from
// the log, in log order, and from a key index file, in hash order; equal
// fingerprints and a file whose entries are sorted mean the file holds the
// log's entries (but with probability about 2^-64), without recovery
// having to hold or sort the entries of a segment.
type keyFingerprint struct {
	count uint64
	sum   uint64
}

func (f *keyFingerprint) add(e keyEntry) { f.count++; f.sum += e.mix() }

// frameKeyEntries calls fn with the entry of every record of the data frame
// at position pos of the segment based at base, at its offset (BaseOffset
// plus its delta, which has holes in a compacted frame). Other frames
// (control frames, compaction markers) have none.
// The frame passed batch.DecodeHeader; h is its header.
func frameKeyEntries(frame []byte, h batch.Header, base uint64, pos int64, fn func(keyEntry)) error {
	if h.RecordCount == 0 {
		return nil
	}
	if h.BaseOffset < base || h.NextOffset()-base > math.MaxUint32 || pos < 0 || pos > math.MaxUint32 {
		return fmt.Errorf("frame at offset %d, position %d does not fit the key index of segment %d", h.BaseOffset, pos, base)
	}
	rel := uint32(h.BaseOffset - base)
	return batch.RecordKeys(frame, func(delta uint32, key []byte) {
		fn(keyEntry{hash: keyHash(key), rel: rel + delta, pos: uint32(pos)})
	})
}

// sortKeyEntries sorts entries that are in log order (offsets increasing)
// by hash, keeping log order among equal hashes: by sort key. It is an LSD
// radix sort of the hash, stable, in O(n).
func sortKeyEntries(ents []keyEntry) []keyEntry {
	if len(ents) < 256 {
		slices.SortStableFunc(ents, func(a, b keyEntry) int { return cmp.Compare(a.hash, b.hash) })
		return ents
	}
	tmp := make([]keyEntry, len(ents))
	src, dst := ents, tmp
	for shift := 0; shift < 32; shift += 8 {
		var count [257]int
		for _, e := range src {
			count[1+(e.hash>>shift)&0xff]++
		}
		for i := 1; i < len(count); i++ {
			count[i] += count[i-1]
		}
		for _, e := range src {
			b := (e.hash >> shift) & 0xff
			dst[count[b]] = e
			count[b]++
		}
		src, dst = dst, src
	}
	return src // four passes: back in ents
}

// appendKeyIndexFile appends the key index file image of a segment based
// at base whose log holds logBytes bytes, with entries ents sorted by
// sortKey, to dst:
//
//	header (32 bytes, little-endian):
//	  0  4  magic "GLKI"
//	  4  1  version 1
//	  5  3  zero
//	  8  8  base offset of the segment
//	  16 4  bytes of the segment's log the index covers
//	  20 4  entry count
//	  24 4  entries per block (256)
//	  28 4  CRC-32C of bytes [0, 28)
//	blocks: the entries, 256 to a block (the last may hold fewer), each
//	  entry hash u32, relOffset u32, filePos u32; each block followed by
//	  the CRC-32C of its entries.
func appendKeyIndexFile(dst []byte, base uint64, logBytes int64, ents []keyEntry) []byte {
	le := binary.LittleEndian
	blocks := (len(ents) + keyBlockEntries - 1) / keyBlockEntries
	dst = slices.Grow(dst, keyIndexHeaderBytes+len(ents)*keyEntryBytes+4*blocks)
	start := len(dst)
	dst = append(dst, keyIndexMagic...)
	dst = append(dst, keyIndexVersion, 0, 0, 0)
	dst = le.AppendUint64(dst, base)
	dst = le.AppendUint32(dst, uint32(logBytes))
	dst = le.AppendUint32(dst, uint32(len(ents)))
	dst = le.AppendUint32(dst, keyBlockEntries)
	dst = le.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
	for len(ents) > 0 {
		n := min(len(ents), keyBlockEntries)
		bs := len(dst)
		for _, e := range ents[:n] {
			dst = le.AppendUint32(dst, e.hash)
			dst = le.AppendUint32(dst, e.rel)
			dst = le.AppendUint32(dst, e.pos)
		}
		dst = le.AppendUint32(dst, crc32.Checksum(dst[bs:], castagnoli))
		ents = ents[n:]
	}
	return dst
}

// keyIndexFileBytes is the size of the key index file holding count
// entries.
func keyIndexFileBytes(count uint64) uint64 {
	blocks := (count + keyBlockEntries - 1) / keyBlockEntries
	return keyIndexHeaderBytes + count*keyEntryBytes + 4*blocks
}

// keyIndexWant is what a key index file must describe: the segment based
// at base, whose log holds logBytes bytes and whose records have relative
// offsets below span.
type keyIndexWant struct {
	base     uint64
	logBytes int64
	span     uint64
}

// decodeKeyIndexFile checks a key index file against want and returns the
// fence (the sort key of each block's first entry) and the fingerprint of
// its entries, calling each (if not nil) with every entry in file order.
// It accepts only what appendKeyIndexFile writes: the header and every
// block's CRC, entries strictly increasing by sort key, every offset below
// want.span and every position inside the log, positions not decreasing
// along one hash (its records are in log order). It never panics and
// allocates only the fence, bounded by the bytes given.
func decodeKeyIndexFile(b []byte, want keyIndexWant, each func(keyEntry)) ([]uint64, keyFingerprint, error) {
	bad := func(format string, args ...any) ([]uint64, keyFingerprint, error) {
		return nil, keyFingerprint{}, fmt.Errorf("%w: "+format, append([]any{errKeyIndexInvalid}, args...)...)
	}
	le := binary.LittleEndian
	if len(b) < keyIndexHeaderBytes {
		return bad("%d bytes, shorter than the header", len(b))
	}
	switch {
	case string(b[:4]) != keyIndexMagic:
		return bad("bad magic")
	case le.Uint32(b[28:]) != crc32.Checksum(b[:28], castagnoli):
		return bad("header crc mismatch")
	case b[4] != keyIndexVersion || b[5] != 0 || b[6] != 0 || b[7] != 0:
		return bad("unknown version %d", b[4])
	case le.Uint32(b[24:]) != keyBlockEntries:
		return bad("%d entries per block, want %d", le.Uint32(b[24:]), keyBlockEntries)
	case le.Uint64(b[8:]) != want.base:
		return bad("base offset %d, want %d", le.Uint64(b[8:]), want.base)
	case int64(le.Uint32(b[16:])) != want.logBytes:
		return bad("covers %d bytes of log, want %d", le.Uint32(b[16:]), want.logBytes)
	}
	count := uint64(le.Uint32(b[20:]))
	if size := keyIndexFileBytes(count); uint64(len(b)) != size {
		return bad("%d bytes, want %d for %d entries", len(b), size, count)
	}
	fence := make([]uint64, 0, (count+keyBlockEntries-1)/keyBlockEntries)
	var fp keyFingerprint
	var prev keyEntry
	p := keyIndexHeaderBytes
	for i := uint64(0); i < count; {
		n := int(min(count-i, keyBlockEntries))
		block := b[p : p+n*keyEntryBytes]
		if le.Uint32(b[p+len(block):]) != crc32.Checksum(block, castagnoli) {
			return bad("block %d crc mismatch", len(fence))
		}
		for k := 0; k < n; k++ {
			e := keyEntry{hash: le.Uint32(block[k*keyEntryBytes:]), rel: le.Uint32(block[k*keyEntryBytes+4:]),
				pos: le.Uint32(block[k*keyEntryBytes+8:])}
			switch {
			case i > 0 && e.sortKey() <= prev.sortKey():
				return bad("entry %d does not increase", i)
			case uint64(e.rel) >= want.span:
				return bad("entry %d offset %d past the segment's span %d", i, e.rel, want.span)
			case int64(e.pos) >= want.logBytes:
				return bad("entry %d position %d past the log's %d bytes", i, e.pos, want.logBytes)
			case i > 0 && e.hash == prev.hash && e.pos < prev.pos:
				return bad("entry %d position %d goes back", i, e.pos)
			}
			if k == 0 {
				fence = append(fence, e.sortKey())
			}
			fp.add(e)
			if each != nil {
				each(e)
			}
			prev = e
			i++
		}
		p += len(block) + 4
	}
	return fence, fp, nil
}

// KeyIndexBuilder builds the key index of one segment from its frames, as
// the store builds it for the segments it writes (Append, recovery,
// Install): a segment rewritten by another component (compaction) gets its
// index this way. Add the frames in log order with their positions in the
// log file, then write File beside the log as the segment's ".keyindex"
// file; recovery verifies it against the log like any other.
type KeyIndexBuilder struct {
	base uint64
	ents []keyEntry
}

// NewKeyIndexBuilder starts the key index of the segment whose name (first
// offset) is baseOffset.
func NewKeyIndexBuilder(baseOffset uint64) *KeyIndexBuilder {
	return &KeyIndexBuilder{base: baseOffset}
}

// AddFrame adds the records of the frame at byte position pos of the
// segment's log; control frames add nothing. It verifies the frame (CRC
// and records) and returns an error wrapping batch.ErrCorrupt or
// batch.ErrShort if it fails. Each record adds 12 bytes until File.
func (b *KeyIndexBuilder) AddFrame(frame []byte, pos int64) error {
	h, err := batch.Validate(frame)
	if err != nil {
		return err
	}
	return b.add(frame, h, pos)
}

// add is AddFrame for a frame that passed DecodeHeader.
func (b *KeyIndexBuilder) add(frame []byte, h batch.Header, pos int64) error {
	return frameKeyEntries(frame, h, b.base, pos, func(e keyEntry) { b.ents = append(b.ents, e) })
}

// File returns the key index file of the segment, whose log holds
// logBytes bytes (the end of the last frame added).
func (b *KeyIndexBuilder) File(logBytes int64) []byte {
	return appendKeyIndexFile(nil, b.base, logBytes, b.sorted())
}

// sorted sorts the entries (in place) and returns them.
func (b *KeyIndexBuilder) sorted() []keyEntry {
	b.ents = sortKeyEntries(b.ents)
	return b.ents
}

// fenceOf returns the fence of sorted entries.
func fenceOf(ents []keyEntry) []uint64 {
	fence := make([]uint64, 0, (len(ents)+keyBlockEntries-1)/keyBlockEntries)
	for i := 0; i < len(ents); i += keyBlockEntries {
		fence = append(fence, ents[i].sortKey())
	}
	return fence
}

// activeKeys is the key index of the active segment, in memory: every
// record's entry in log order, and for every hash its newest entry, from
// which a chain runs back through the older ones. It costs 16 bytes per
// record plus a map slot per distinct hash; SegmentRecordsMax bounds it.
// The appender changes it under Store.mu; readers walk it under
// Store.mu.RLock.
type activeKeys struct {
	heads map[uint32]uint32 // hash → 1 + position in ents of its newest entry
	ents  []activeEntry
}

type activeEntry struct {
	keyEntry
	prev uint32 // 1 + position in ents of the previous entry of the same hash, 0 if none
}

func newActiveKeys() *activeKeys { return &activeKeys{heads: map[uint32]uint32{}} }

// add appends e, the entry of the record after every one held.
func (a *activeKeys) add(e keyEntry) {
	a.ents = append(a.ents, activeEntry{keyEntry: e, prev: a.heads[e.hash]})
	a.heads[e.hash] = uint32(len(a.ents))
}

// truncate drops the entries of frames at positions >= pos, newest first,
// so that every head falls back to the entry before it.
func (a *activeKeys) truncate(pos uint32) {
	for n := len(a.ents); n > 0 && a.ents[n-1].pos >= pos; n-- {
		e := a.ents[n-1]
		if e.prev == 0 {
			delete(a.heads, e.hash)
		} else {
			a.heads[e.hash] = e.prev
		}
		a.ents = a.ents[:n-1]
	}
}

// candidates returns, in log order, the oldest limit entries of hash with
// relative offsets in [fromRel, endRel). It walks the hash's chain from
// the newest entry, keeping the last limit it passes in a ring.
func (a *activeKeys) candidates(hash, fromRel, endRel uint32, limit int) []keyEntry {
	var ring []keyEntry
	n := 0 // entries passed that qualify
	for i := a.heads[hash]; i != 0; i = a.ents[i-1].prev {
		e := a.ents[i-1]
		if e.rel < fromRel {
			break
		}
		if e.rel >= endRel {
			continue
		}
		if len(ring) < limit {
			ring = append(ring, e.keyEntry)
		} else {
			ring[n%limit] = e.keyEntry
		}
		n++
	}
	// ring holds the last min(n, limit) qualifying entries passed, newest
	// first from position n%limit (when it wrapped) or 0.
	out := make([]keyEntry, 0, len(ring))
	start := 0
	if n > limit {
		start = n % limit
	}
	for k := range ring {
		out = append(out, ring[(start+k)%len(ring)])
	}
	slices.Reverse(out)
	return out
}

// sorted returns the entries sorted for the segment's file.
func (a *activeKeys) sorted() []keyEntry {
	ents := make([]keyEntry, len(a.ents))
	for i, e := range a.ents {
		ents[i] = e.keyEntry
	}
	return sortKeyEntries(ents)
}

// sealedKeys is the key index of a sealed segment: the entries stay in the
// segment's ".keyindex" file, verified when it was written or recovered,
// and only the fence stays in memory (8 bytes per 256 records). The file
// is opened by the first lookup and closed with the segment's last
// reference (or by TruncateSuffix, which excludes readers).
type sealedKeys struct {
	fence []uint64 // sort key of the first entry of each block
	count uint64

	mu   sync.Mutex
	file vfs.File
	// broken is set when a lookup found the file not as verified: the
	// segment is scanned instead until the next Open rebuilds the file.
	broken atomic.Bool
}

// open returns the file at path, opening it on first use.
func (k *sealedKeys) open(fsys vfs.FS, path string) (vfs.File, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.file == nil {
		f, err := fsys.OpenFile(path, 0, 0)
		if err != nil {
			return nil, err
		}
		k.file = f
	}
	return k.file, nil
}

// close closes the file if it was opened.
func (k *sealedKeys) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.file == nil {
		return nil
	}
	err := k.file.Close()
	k.file = nil
	return err
}

// block returns the file position of block b and its number of entries.
func (k *sealedKeys) block(b int) (pos int64, entries int) {
	return keyIndexHeaderBytes + int64(b)*keyBlockBytes, int(min(k.count-uint64(b)*keyBlockEntries, keyBlockEntries))
}

// readKeyIndexFile reads the key index file at path, at most maxBytes of
// it: a larger file is reported as its size alone (b nil). A missing file
// returns fs.ErrNotExist.
func readKeyIndexFile(fsys vfs.FS, path string, maxBytes uint64) (b []byte, size int64, err error) {
	f, err := fsys.OpenFile(path, 0, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	if size, err = f.Size(); err != nil {
		return nil, 0, err
	}
	if uint64(size) > maxBytes {
		return nil, size, nil
	}
	b = make([]byte, size)
	if err := readFull(f, b, 0); err != nil {
		return nil, 0, err
	}
	return b, size, nil
}
