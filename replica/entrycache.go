package replica

import "go.etcd.io/raft/v3/raftpb"

// entryCache holds the newest entries of the log as Raft sees it (queued
// for writing or written), so that Raft's reads of recent entries (the
// term of the entry before an append it sends, terms when it commits, the
// committed entries it hands over to apply) are answered from memory
// instead of the segment store: with asynchronous writes, entries leave
// Raft's unstable log as soon as they are durable, before they commit and
// apply. It is etcd's MemoryStorage, or CockroachDB's raft entry cache, in
// small. Driver goroutine only: filled by ProcessReady, read by Raft.
//
// The entries are Raft's own (the frames of data entries lack the term and
// index the log's copies carry; nothing reads those from an entry's Data).
type entryCache struct {
	ents  []*raftpb.Entry // contiguous indexes
	bytes int
}

const (
	// entryCacheBytesMax bounds the cache; past it the oldest entries go,
	// applied or not (Raft then reads them from the log).
	entryCacheBytesMax = 4 << 20
	// entryCacheAppliedBytesMax bounds the applied entries kept (for the
	// terms and retransmissions of appends to followers just behind).
	entryCacheAppliedBytesMax = 64 << 10
)

func entryBytes(e *raftpb.Entry) int { return len(e.GetData()) + 24 }

// add caches ents, which follow or overwrite the log's tail: a cached
// suffix they replace is dropped first.
func (c *entryCache) add(ents []*raftpb.Entry) {
	if len(ents) == 0 {
		return
	}
	lo := ents[0].GetIndex()
	if n := len(c.ents); n > 0 {
		first, last := c.ents[0].GetIndex(), c.ents[n-1].GetIndex()
		switch {
		case lo < first || lo > last+1:
			c.clear()
		case lo <= last:
			for _, e := range c.ents[lo-first:] {
				c.bytes -= entryBytes(e)
			}
			clear(c.ents[lo-first:])
			c.ents = c.ents[:lo-first]
		}
	}
	for _, e := range ents {
		c.ents = append(c.ents, e)
		c.bytes += entryBytes(e)
	}
	for len(c.ents) > 1 && c.bytes > entryCacheBytesMax {
		c.dropFirst()
	}
}

// trim drops applied entries, oldest first, beyond
// entryCacheAppliedBytesMax; the last applied entry stays.
func (c *entryCache) trim(applied uint64) {
	for len(c.ents) > 1 && c.ents[0].GetIndex() < applied && c.bytes > entryCacheAppliedBytesMax {
		c.dropFirst()
	}
}

func (c *entryCache) dropFirst() {
	c.bytes -= entryBytes(c.ents[0])
	c.ents[0] = nil
	c.ents = c.ents[1:]
}

func (c *entryCache) clear() {
	clear(c.ents)
	c.ents, c.bytes = c.ents[:0], 0
}

// term returns the term of the entry at index i, if cached.
func (c *entryCache) term(i uint64) (uint64, bool) {
	if len(c.ents) == 0 {
		return 0, false
	}
	first := c.ents[0].GetIndex()
	if i < first || i-first >= uint64(len(c.ents)) {
		return 0, false
	}
	return c.ents[i-first].GetTerm(), true
}

// entries returns the entries [lo, hi), at least one and about maxSize
// bytes in all, if all of them are cached. The caller owns the slice.
func (c *entryCache) entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, bool) {
	if len(c.ents) == 0 || lo >= hi {
		return nil, false
	}
	first := c.ents[0].GetIndex()
	if lo < first || hi-first > uint64(len(c.ents)) {
		return nil, false
	}
	var out []*raftpb.Entry
	var size uint64
	for _, e := range c.ents[lo-first : hi-first] {
		size += uint64(entryBytes(e))
		if len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, e)
	}
	return out, true
}
