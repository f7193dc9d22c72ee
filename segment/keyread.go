package segment

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"

	"github.com/geolog/geolog/batch"
)

// KeyRecordsMax bounds the maxRecords argument of ReadKey; larger values
// are clamped to it.
const KeyRecordsMax = 1 << 17

// KeyRecord is one record that ReadKey found.
type KeyRecord struct {
	// Offset is the record's offset.
	Offset uint64
	// Batch is the header of the record's frame (epoch, append time,
	// producer).
	Batch batch.Header
	// Record is the record, copied out of the log: the caller owns it.
	Record batch.Record
}

// ReadKey returns the records whose key equals key (byte for byte; nil
// and empty are the same key) at offsets [from, endOffset), in offset
// order: at most maxRecords of them (clamped to [1, KeyRecordsMax]) and,
// past the first, at most maxBytes of keys and values. next is where to
// continue: the offset after the last record returned when a bound
// stopped the read, else endOffset (or NextOffset, if lower): the records
// in between, of other keys, are skipped.
//
// It costs about one key index probe per segment from the one holding
// from (the active segment's index is in memory; a sealed segment's costs
// one read of a 3 KiB block of its ".keyindex" file, the fence in memory
// saying which) plus one frame read per record found. A segment whose key
// index is missing or found broken is scanned instead (correct, slower).
// Every frame read is verified (CRC, offsets, and the key itself, which
// resolves hash collisions), and an index that disagrees with its log
// makes the read scan that segment: the log is the truth.
//
// from below StartOffset or above NextOffset returns ErrOutOfRange;
// from >= endOffset returns nothing and next == from. A frame failing
// verification during a scan returns a *CorruptionError. Safe from any
// number of goroutines, concurrently with the appender; like ReadFrames it
// may see records that are not durable yet: bound endOffset by what the
// caller may expose.
func (s *Store) ReadKey(key []byte, from, endOffset uint64, maxRecords, maxBytes int) (recs []KeyRecord, next uint64, err error) {
	s.truncMu.RLock()
	defer s.truncMu.RUnlock()
	if err := s.checkReadFrom(from); err != nil {
		return nil, from, err
	}
	r := &keyRead{key: key, hash: keyHash(key), recordsMax: max(1, min(maxRecords, KeyRecordsMax)), bytesMax: maxBytes}
	off := from
	for off < endOffset && !r.stopped {
		covered, err := s.readKeySegment(r, off, endOffset)
		if err != nil {
			return nil, from, err
		}
		if covered <= off {
			break // the end of the log
		}
		off = covered
	}
	if r.stopped {
		return r.out, r.next, nil
	}
	return r.out, max(from, min(off, endOffset)), nil
}

// keyRead is the state of one ReadKey.
type keyRead struct {
	key        []byte
	hash       uint32
	recordsMax int
	bytesMax   int

	out     []KeyRecord
	bytes   int    // keys and values in out
	stopped bool   // a bound stopped the read
	next    uint64 // where to continue when stopped
	// frameBytes is the size on disk of the last frame read (0: none
	// yet), what the next one is guessed to need (readCandidates), across
	// segments.
	frameBytes int
}

// remaining is how many more records the read may return.
func (r *keyRead) remaining() int { return r.recordsMax - len(r.out) }

// add adds record rec at offset off of the frame with header h, copied,
// unless a bound stops the read first.
func (r *keyRead) add(off uint64, h batch.Header, rec *batch.Record) {
	size := len(rec.Key) + len(rec.Value)
	if len(r.out) > 0 && r.bytes+size > r.bytesMax {
		r.stopped, r.next = true, off
		return
	}
	kr := KeyRecord{Offset: off, Batch: h, Record: batch.Record{
		Key: bytes.Clone(rec.Key), Value: bytes.Clone(rec.Value), ProducerTimeUnixNanos: rec.ProducerTimeUnixNanos}}
	if len(rec.Headers) > 0 {
		kr.Record.Headers = make([]batch.RecordHeader, len(rec.Headers))
		for i, hd := range rec.Headers {
			kr.Record.Headers[i] = batch.RecordHeader{Key: hd.Key, Value: bytes.Clone(hd.Value)}
		}
	}
	r.out = append(r.out, kr)
	r.bytes += size
	if len(r.out) == r.recordsMax {
		r.stopped, r.next = true, off+1
	}
}

// checkpoint and restore let a segment's index-driven read be undone
// before the segment is scanned instead.
func (r *keyRead) checkpoint() (int, int) { return len(r.out), r.bytes }

func (r *keyRead) restore(n, b int) {
	clear(r.out[n:])
	r.out, r.bytes, r.stopped, r.next = r.out[:n], b, false, 0
}

// checkReadFrom checks from against [StartOffset, NextOffset].
func (s *Store) checkReadFrom(from uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	if start, next := s.startOffset.Load(), s.nextOffset.Load(); from < start || from > next {
		return fmt.Errorf("%w: offset %d not in [%d, %d]", ErrOutOfRange, from, start, next)
	}
	return nil
}

// keyView is a reader's snapshot of the segment holding an offset, for a
// key read: the view, and the active segment's candidates or the sealed
// segment's index (neither: scan it).
type keyView struct {
	v      segView
	active bool
	cands  []keyEntry
	sealed *sealedKeys
}

// viewKeys snapshots the segment holding off (false at the end of the
// log), taking the active segment's candidates for r in [off, end) under
// the same lock. Retention may have deleted it since the read began
// (ErrOutOfRange: the records there are gone).
func (s *Store) viewKeys(r *keyRead, off, end uint64) (keyView, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch start, next := s.startOffset.Load(), s.nextOffset.Load(); {
	case s.closed:
		return keyView{}, false, ErrClosed
	case off < start:
		return keyView{}, false, fmt.Errorf("%w: offset %d not in [%d, %d]", ErrOutOfRange, off, start, next)
	case off >= next:
		return keyView{}, false, nil
	}
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].baseOffset > off }) - 1
	g := s.segs[i]
	kv := keyView{v: viewLocked(g)}
	switch {
	case g.keys != nil:
		kv.active = true
		stop := min(end, g.nextOffset)
		kv.cands = g.keys.candidates(r.hash, uint32(off-g.baseOffset), uint32(stop-g.baseOffset), r.remaining())
	default:
		if k := g.sealed.Load(); k != nil && !k.broken.Load() {
			kv.sealed = k
		}
	}
	return kv, true, nil
}

// readKeySegment reads the records of r's key at offsets [off, end) of the
// segment holding off, and returns the offset up to which it looked (off
// itself at the end of the log).
func (s *Store) readKeySegment(r *keyRead, off, end uint64) (uint64, error) {
	kv, ok, err := s.viewKeys(r, off, end)
	if !ok {
		return off, err
	}
	defer s.releaseView(kv.v)
	stop := min(end, kv.v.nextOffset)
	indexed := kv.active
	if kv.sealed != nil {
		cands, err := s.probeSealed(kv, r.hash, off, stop, r.remaining())
		if err != nil {
			s.log.Warn("key index unusable; scanning the segment", "segment", kv.v.seg.name(), "error", err)
		} else {
			kv.cands, indexed = cands, true
		}
	}
	if indexed {
		n, b := r.checkpoint()
		err := s.readCandidates(r, kv.v, kv.cands)
		if err == nil {
			return stop, nil
		}
		// The index and the log disagree; the log is the truth.
		s.log.Warn("key index disagrees with the log; scanning the segment", "segment", kv.v.seg.name(), "error", err)
		r.restore(n, b)
	}
	return stop, s.scanKeys(r, kv.v, off, stop)
}

// errKeyIndexMismatch marks a key index entry that its log does not bear
// out.
var errKeyIndexMismatch = errors.New("key index entry does not match the log")

// probeSealed returns, in offset order, up to limit entries of hash with
// offsets in [off, stop) from the sealed index of kv: the fence says which
// block the first one would be in, so that a key with no record there
// costs one block read. A block failing its CRC marks the index broken.
func (s *Store) probeSealed(kv keyView, hash uint32, off, stop uint64, limit int) ([]keyEntry, error) {
	k, g := kv.sealed, kv.v.seg
	lo := uint64(hash)<<32 | (off - g.baseOffset)
	endRel := stop - g.baseOffset
	b := max(0, sort.Search(len(k.fence), func(i int) bool { return k.fence[i] > lo })-1)
	if b >= len(k.fence) || k.fence[b]>>32 > uint64(hash) {
		return nil, nil
	}
	f, err := k.open(s.fs, g.path(keyIndexSuffix))
	if err != nil {
		return nil, err
	}
	buf := s.getBuf()
	defer s.putBuf(buf)
	var out []keyEntry
	le := binary.LittleEndian
	for ; b < len(k.fence) && k.fence[b]>>32 <= uint64(hash); b++ {
		pos, n := k.block(b)
		block := (*buf)[:n*keyEntryBytes+4]
		if err := readFull(f, block, pos); err != nil {
			return nil, err
		}
		if le.Uint32(block[n*keyEntryBytes:]) != crc32.Checksum(block[:n*keyEntryBytes], castagnoli) {
			k.broken.Store(true)
			return nil, fmt.Errorf("%w: block %d crc mismatch", errKeyIndexInvalid, b)
		}
		for j := range n {
			e := keyEntry{hash: le.Uint32(block[j*keyEntryBytes:]), rel: le.Uint32(block[j*keyEntryBytes+4:]),
				pos: le.Uint32(block[j*keyEntryBytes+8:])}
			switch {
			case e.sortKey() < lo:
				continue
			case e.hash != hash || uint64(e.rel) >= endRel:
				return out, nil
			}
			if out = append(out, e); len(out) == limit {
				return out, nil
			}
		}
	}
	return out, nil
}

// Coalescing of a key read's frame reads (readCandidates): frames of one
// key closer than keyReadGapBytesMax to each other are read with one
// pread, up to keyReadCoalesceBytesMax at a time (the bytes in between are
// read and skipped: cheaper than a system call when the gap is small).
// The bound is the pooled buffers' size, so coalescing allocates nothing.
const (
	keyReadGapBytesMax      = 16 << 10
	keyReadCoalesceBytesMax = readChunkBytes
)

// readCandidates adds to r the records of its key among the candidate
// entries of segment v (in offset order), reading each frame once, and
// frames near each other with one pread (keyReadGapBytesMax). It returns
// errKeyIndexMismatch (wrapped) if an entry does not point at a verified
// data frame holding its offset: the caller then scans.
func (s *Store) readCandidates(r *keyRead, v segView, cands []keyEntry) error {
	w, buf := s.walker(v.seg.f, 0, v.size)
	defer s.releaseWalker(&w, buf)
	for len(cands) > 0 && !r.stopped {
		pos := cands[0].pos
		w.pos = int64(pos)
		// A window read here (none if an earlier one holds the frame)
		// covers this frame and the candidates' frames near it.
		w.chunk = r.windowBytes(cands)
		frame, h, err := w.next()
		if err != nil {
			return fmt.Errorf("%w: frame at position %d: %w", errKeyIndexMismatch, pos, err)
		}
		r.frameBytes = int(w.pos) - int(pos) // the unit on disk (sealed: larger than frame)
		n := 1
		for n < len(cands) && cands[n].pos == pos {
			n++
		}
		if err := r.addFromFrame(frame, h, v.seg.baseOffset, cands[:n]); err != nil {
			return fmt.Errorf("%w: frame at position %d: %w", errKeyIndexMismatch, pos, err)
		}
		cands = cands[n:]
	}
	return nil
}

// windowBytes is how much a read of the frame of cands[0] should take in
// one pread: the frames of the candidates that follow it within
// keyReadGapBytesMax of each other (up to keyReadCoalesceBytesMax), each
// guessed to be the size on disk of the last frame read, at least
// firstReadBytes. Frames of one range tend to be alike; one larger than
// the guess costs a second read. No slack is added: a read's cost grows
// with the pages it touches, and a few hundred bytes past the frame
// cross into another page often enough to cost more (measured: +50 µs
// per sync of 100 frames) than the rare second reads they save.
func (r *keyRead) windowBytes(cands []keyEntry) int {
	guess := firstReadBytes
	if r.frameBytes > 0 {
		guess = max(guess, r.frameBytes)
	}
	first, last := int64(cands[0].pos), int64(cands[0].pos)
	for _, c := range cands[1:] {
		p := int64(c.pos)
		if p-last > int64(guess)+keyReadGapBytesMax || p+int64(guess)-first > keyReadCoalesceBytesMax {
			break
		}
		last = p
	}
	return int(min(last-first+int64(guess), max(keyReadCoalesceBytesMax, int64(guess))))
}

// addFromFrame adds to r the records of its key at the offsets of cands
// (entries of one frame, in offset order, of the segment based at base)
// in the verified frame with header h, decoding only those records (a
// record of another key is a hash collision). It fails if the frame does
// not hold the offsets.
func (r *keyRead) addFromFrame(frame []byte, h batch.Header, base uint64, cands []keyEntry) error {
	if h.Type != batch.TypeData {
		return fmt.Errorf("a %v frame", h.Type)
	}
	if first, last := base+uint64(cands[0].rel), base+uint64(cands[len(cands)-1].rel); first < h.BaseOffset || last >= h.NextOffset() {
		return fmt.Errorf("offsets [%d, %d] are not in the frame's [%d, %d)", first, last, h.BaseOffset, h.NextOffset())
	}
	var decodeErr error
	err := batch.EachRecord(frame, func(raw batch.RawRecord) bool {
		off := h.BaseOffset + uint64(raw.Delta)
		want := base + uint64(cands[0].rel)
		if off < want {
			return true
		}
		if off > want {
			decodeErr = fmt.Errorf("no record at offset %d", want)
			return false
		}
		rec, err := raw.Decode()
		if err != nil {
			decodeErr = err
			return false
		}
		if bytes.Equal(rec.Key, r.key) {
			r.add(off, h, &rec)
		}
		cands = cands[1:]
		return len(cands) > 0 && !r.stopped
	})
	if err == nil && decodeErr == nil && len(cands) > 0 && !r.stopped {
		return fmt.Errorf("no record at offset %d", base+uint64(cands[0].rel))
	}
	return errors.Join(err, decodeErr)
}

// scanKeys adds to r the records of its key at offsets [off, stop) of
// segment v by reading its frames from the one holding off, verifying
// each as ReadFrames does: the path for a segment without a usable key
// index.
func (s *Store) scanKeys(r *keyRead, v segView, off, stop uint64) error {
	pos, q, err := s.seek(v, off)
	if err != nil {
		return err
	}
	w, buf := s.walker(v.seg.f, pos, v.size)
	defer s.releaseWalker(&w, buf)
	w.chunk = readChunkBytes
	for !r.stopped {
		frame, h, err := w.next()
		framePos := w.at
		if err == io.EOF {
			return nil
		}
		if err == nil {
			err = q.check(h)
		}
		if err != nil {
			return s.readError(v.seg, framePos, q.offset, err)
		}
		if h.BaseOffset >= stop {
			return nil
		}
		if err := s.scanFrame(r, frame, h, off, stop); err != nil {
			return s.readError(v.seg, framePos, q.offset, err)
		}
		q.advance(h)
	}
	return nil
}

// scanFrame adds to r the records of its key at offsets [off, stop) of a
// verified frame.
func (s *Store) scanFrame(r *keyRead, frame []byte, h batch.Header, off, stop uint64) error {
	found := false
	err := batch.RecordKeys(frame, func(delta uint32, key []byte) {
		o := h.BaseOffset + uint64(delta)
		found = found || (o >= off && o < stop && bytes.Equal(key, r.key))
	})
	if err != nil || !found {
		return err
	}
	_, recs, err := batch.Decode(frame)
	if err != nil {
		return err
	}
	for i := range recs {
		o := h.Offset(&recs[i])
		if o >= off && o < stop && bytes.Equal(recs[i].Key, r.key) && !r.stopped {
			r.add(o, h, &recs[i])
		}
	}
	return nil
}
