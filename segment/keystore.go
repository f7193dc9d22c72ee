package segment

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/geolog/geolog/batch"
)

// How the store keeps each segment's key index (see keyindex.go for the
// structures): the active segment's in memory, built by Append and by
// recovery; a sealed segment's in its ".keyindex" file, written when the
// segment is sealed (roll) or rebuilt by recovery, with its fence in
// memory.

// keyPass is what recovery's pass over a segment builds of its key index:
// the index itself for the last (active) segment, the fingerprint of its
// entries for a sealed one.
type keyPass struct {
	active *activeKeys
	fp     keyFingerprint
}

func (p *keyPass) add(e keyEntry) {
	if p.active != nil {
		p.active.add(e)
		return
	}
	p.fp.add(e)
}

// finishKeys settles the key index of segment g after recovery's pass:
// the active segment takes the index built (and a file left beside it, if
// any, is stale); a sealed segment keeps its file if it matches the log,
// or is noted for a rebuild.
func (s *Store) finishKeys(g *segment, last bool, pass *keyPass, plan *recoveryPlan) error {
	if last {
		g.keys = pass.active
		if _, err := s.fs.Stat(g.path(keyIndexSuffix)); err == nil {
			plan.keyStale = append(plan.keyStale, g)
		}
		return nil
	}
	k, reason, err := s.keyIndexProblem(g, pass.fp)
	if err != nil {
		return fmt.Errorf("segment: check key index of %s: %w", g.name(), err)
	}
	if reason != "" {
		plan.keyRewrite[g] = reason
		return nil
	}
	g.sealed.Store(k)
	return nil
}

// applyKeyPlan rebuilds the key index files recovery found missing,
// malformed or stale, and removes the file beside the active segment. A
// failure leaves the segment without a key index (readers scan it) and is
// logged: key index files are a cache, rebuilt at the next Open.
func (s *Store) applyKeyPlan(segs []*segment, plan *recoveryPlan) {
	for _, g := range segs {
		reason, ok := plan.keyRewrite[g]
		if !ok {
			continue
		}
		if err := s.rebuildKeyIndex(g); err != nil {
			s.log.Warn("could not rebuild key index; the segment will be scanned", "segment", g.name(), "error", err)
			continue
		}
		s.log.Info("rebuilt key index", "segment", g.name(), "reason", reason)
	}
	for _, g := range plan.keyStale {
		s.removeKeyIndexFile(g)
	}
}

// keyIndexProblem checks g's key index file against fp, the fingerprint of
// the entries recovery computed from the log. It returns the sealed index
// if the file matches, else why the file must be rebuilt.
func (s *Store) keyIndexProblem(g *segment, fp keyFingerprint) (*sealedKeys, string, error) {
	want := keyIndexFileBytes(fp.count)
	b, size, err := readKeyIndexFile(s.fs, g.path(keyIndexSuffix), want)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, "missing", nil
	case err != nil:
		return nil, "", err
	case b == nil:
		return nil, fmt.Sprintf("%d bytes, want %d", size, want), nil
	}
	fence, got, err := decodeKeyIndexFile(b, keyIndexWant{base: g.baseOffset, logBytes: g.size, span: g.nextOffset - g.baseOffset}, nil)
	if err != nil {
		return nil, err.Error(), nil
	}
	if got != fp {
		return nil, fmt.Sprintf("stale: %d entries that do not match the log's %d", got.count, fp.count), nil
	}
	return &sealedKeys{fence: fence, count: got.count}, "", nil
}

// rebuildKeyIndex writes g's key index file from its log and makes it the
// segment's index. Recovery and Install call it for sealed segments, before
// they are published.
func (s *Store) rebuildKeyIndex(g *segment) error {
	b := NewKeyIndexBuilder(g.baseOffset)
	if err := s.walkKeyEntries(g, g.size, func(e keyEntry) { b.ents = append(b.ents, e) }); err != nil {
		return err
	}
	k, err := s.writeKeyIndex(g, b.sorted())
	if err != nil {
		return err
	}
	g.sealed.Store(k)
	return nil
}

// writeKeyIndex writes g's key index file from its entries, sorted,
// fsyncing it under FsyncAlways, and returns the sealed index. Like the
// other index files it is a cache that recovery verifies, so a crash in
// the middle of this is harmless.
func (s *Store) writeKeyIndex(g *segment, ents []keyEntry) (*sealedKeys, error) {
	img := appendKeyIndexFile(nil, g.baseOffset, g.size, ents)
	if err := writeFile(s.fs, g.path(keyIndexSuffix), img, s.cfg.Fsync == FsyncAlways); err != nil {
		return nil, err
	}
	return &sealedKeys{fence: fenceOf(ents), count: uint64(len(ents))}, nil
}

// sealKeys writes the key index file of g, which roll is sealing, and
// swaps its in-memory index for the sealed one. A segment whose file could
// not be written is left without a key index (readers scan it) until
// recovery rebuilds the file. The caller is the appender.
func (s *Store) sealKeys(g *segment) {
	var k *sealedKeys
	if g.keys != nil {
		var err error
		if k, err = s.writeKeyIndex(g, g.keys.sorted()); err != nil {
			s.log.Warn("could not write key index; the segment will be scanned", "segment", g.name(), "error", err)
		}
	}
	s.mu.Lock()
	g.keys = nil
	if k != nil {
		g.sealed.Store(k)
	}
	s.mu.Unlock()
}

// cutKeys prepares g's key index for a truncation of its log at pos, after
// which g is the active segment: an active index drops the entries from
// pos on; a sealed one is rebuilt in memory from what remains of the log
// (read here, while the truncation excludes readers). It returns what to
// apply under mu and whether g had a key index file, now stale.
func (s *Store) cutKeys(g *segment, pos int64) (apply func(), stale bool) {
	if g.keys != nil {
		return func() { g.keys.truncate(uint32(pos)) }, false
	}
	keys := newActiveKeys()
	if err := s.walkKeyEntries(g, pos, keys.add); err != nil {
		s.log.Warn("could not rebuild the key index of a truncated segment; it will be scanned", "segment", g.name(), "error", err)
		keys = nil
	}
	return func() {
		g.keys = keys
		if k := g.sealed.Swap(nil); k != nil {
			k.close()
		}
	}, true
}

// removeKeyIndexFile removes g's key index file, if any: a stale file is
// harmless (recovery checks it against the log), so failures are logged.
func (s *Store) removeKeyIndexFile(g *segment) {
	if err := s.fs.Remove(g.path(keyIndexSuffix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("could not remove stale key index", "segment", g.name(), "error", err)
	}
}

// walkKeyEntries calls fn with the key entry of every record of g's log in
// bytes [0, end), verifying every frame (CRC, offsets, records).
func (s *Store) walkKeyEntries(g *segment, end int64, fn func(keyEntry)) error {
	w := frameWalker{f: g.f, keys: s.cfg.Keyring, end: end, chunk: recoverChunkBytes}
	q := seq{offset: g.baseOffset}
	for {
		frame, h, err := w.next()
		pos := w.at
		if err == io.EOF {
			return nil
		}
		if err == nil {
			err = q.check(h)
		}
		if err == nil {
			err = frameKeyEntries(frame, h, g.baseOffset, pos, fn)
		}
		if err != nil {
			return s.readError(g, pos, q.offset, err)
		}
		q.advance(h)
	}
}

// appendKeys adds the records of frame h, written at position pos of the
// active segment g, to its key index. The caller is the appender, holding
// mu; hashes are the records' key hashes and offset deltas (see
// frameKeyHashes).
func appendKeys(g *segment, h batch.Header, pos int64, hashes []keyEntry) {
	if g.keys == nil {
		return // a segment left unindexed by a failed rebuild: scanned
	}
	rel := relOffset(g, h.BaseOffset)
	for _, e := range hashes {
		g.keys.add(keyEntry{hash: e.hash, rel: rel + e.rel, pos: uint32(pos)})
	}
}

// frameKeyHashes returns in dst the key hash and offset delta (as rel) of
// each record of a frame that passed batch.Validate (none for a frame
// that is not a data frame, such as a compaction marker).
func frameKeyHashes(dst []keyEntry, frame []byte) []keyEntry {
	dst = dst[:0]
	if err := batch.RecordKeys(frame, func(delta uint32, key []byte) {
		dst = append(dst, keyEntry{hash: keyHash(key), rel: delta})
	}); err != nil {
		panic(fmt.Sprintf("segment: records of a validated frame do not parse: %v", err))
	}
	return dst
}
