// Package segment is one range's append-only log on disk: the Raft log and
// the message log at once (batches are written once, here).
//
// # Frames, offsets and Raft indexes
//
// The log is a sequence of frames (package batch). A data frame holds one or
// more records, which take the offsets [BaseOffset, NextOffset), dense across
// the log. A control frame (batch.TypeNoop, batch.TypeConfig or
// batch.TypeFork without records: a Raft leader's empty entry, a
// configuration change with its payload, a fork marker) takes no offset:
// its BaseOffset is the offset of the next record.
//
// Under Raft every frame is one entry and carries its term and index.
// Frames carrying an index (Index > 0) are a suffix of the log: once one
// does, every later frame carries the next index, with terms
// non-decreasing. Indexes start wherever the first indexed frame says (a
// log may start after a Raft snapshot). FirstIndex and LastIndex bound the
// indexes held (0, 0 when none); TermAt, ReadFramesByIndex and
// TruncateSuffixAtIndex work by index.
//
// The one exception to dense indexes is a fork frame (batch.TypeFork),
// which ends a divergent tail that the range moved out of its log (package
// replica): its index may skip the indexes of that tail, and its payload
// names the index of the frame before it (batch.ForkPrevIndex), so that
// the gap is recorded where it is and a gap anywhere else is corruption.
// An index in such a gap is out of range (ErrOutOfRange) for TermAt; a
// ReadFramesByIndex from one starts at the fork frame, and
// TruncateSuffixAtIndex at one drops the fork frame and everything after
// it. A fork frame that starts the log (a fork where retention had deleted
// the frames it keeps, and a snapshot of that log, staged from a first
// index) may name any index below its own: the frame it names lies below
// the log, and the gap with it. Outside Raft every Index is 0 and
// only offsets matter.
//
// Readers by offset (ReadFrames: consumers, mirrors) see data frames only,
// each offset once and in order, never a control frame; readers by index
// (ReadFramesByIndex: Raft) see every frame.
//
// # Holes left by compaction by key
//
// Compaction by key (package compact) rewrites sealed segments
// (RewriteSegment, rewrite.go): frames keep only some of their records,
// as compacted frames (batch.FlagCompacted) whose records keep their
// offsets, and frames left without records may go altogether, their Raft
// indexes with them. So a compacted frame may start past the previous
// frame's NextOffset and past the next Raft index: offsets, and indexes,
// become sparse where compaction ran (below the Raft compaction point,
// which Raft never reads below), and dense everywhere else. A rewrite
// always keeps a segment's last frame, so that segments still join up by
// name, and a read by offset from inside a hole starts at the frame after
// it. A mirror may append compacted frames its home shipped, holes
// included.
//
// # On-disk layout
//
// A range's directory holds, for every segment, named by the segment's base
// offset (the BaseOffset of its first frame) in 20 zero-padded digits:
//
//	00000000000000000000.log        frames back to back, in log order: each
//	                                frame's BaseOffset is the previous
//	                                frame's NextOffset
//	00000000000000000000.index      sparse offset index, 8-byte entries
//	                                (relOffset u32, filePos u32), little-endian
//	00000000000000000000.timeindex  time index, 12-byte entries
//	                                (appendTime i64, relOffset u32)
//	00000000000000000000.keyindex   key index of a sealed segment (see Key
//	                                index below)
//	00000000000000012345.log        the next segment starts where the last
//	...                             one ends; the newest is the active one
//	LOCK                            held (flock) while a Store has it open
//	_logstart                       the start record (startrecord.go): where
//	                                the log starts, saved before retention
//	                                or an install makes segments go
//
// Other files are ignored (names starting with "_" silently: they belong to
// the range's other components, such as the Raft hard state), except
// "_snap." files: a log being staged to replace this one, and the manifest
// that commits the replacement (see install.go; Open completes a committed
// install and removes abandoned staging), and "_clean." files: a segment
// being rewritten (see rewrite.go; Open removes them, the segment being
// the old one).
//
// relOffset is an offset minus the segment's base offset. A frame at file
// position p gets a sparse index entry when p is at least IndexIntervalBytes
// past the previous entry's position (the first frame never needs one);
// appendTime is the newest append time up to that frame. An entry also
// records, in memory only, the frame's Raft index, so that lookups by index
// seek like lookups by offset. The index files hold the entries whose
// relOffset increases strictly from above 0 and stays below the segment's
// record count; entries at control frames that share their offset with an
// earlier entry, or sit past the last record, live in memory only. The
// active segment's index files are written when it is sealed and on Close.
// Index files are a cache: Open recomputes every entry from the log and
// rewrites a file that is missing, malformed (size not a multiple of the
// entry size, entries not increasing, pointing past the log) or merely
// stale. In memory the index costs 24 bytes per IndexIntervalBytes of log
// (0.6% at the 4 KiB default).
//
// A segment is sealed (and the next one started) when a frame would take it
// past SegmentBytesMax or SegmentRecordsMax, but only once it holds a
// record: the next segment is named by the offset where this one ends,
// which a segment of control frames alone shares with its own name. Such a
// segment grows past SegmentBytesMax until a record arrives.
//
// # Key index
//
// ReadKey finds one key's records (a chat conversation) without reading
// the range: every segment has a key index with one entry per record,
// (hash, relOffset, filePos) of u32 each, where hash is the low 32 bits of
// the key's XXH64 (the high bits pick the key's range, so the keys of a
// range share them) and filePos is the position of the record's frame.
// A record's offset is its frame's BaseOffset plus its offset delta
// (batch.RecordKeys gives both), so records of compacted frames keep
// theirs; only data frames have entries (a compaction marker's record is
// no reader's).
//
//   - The active segment's index is in memory: the entries in log order
//     and, per hash, a chain from the newest entry back (16 bytes per
//     record plus a map slot per distinct hash). Append adds a frame's
//     records as it writes it, recovery rebuilds it in its pass over the
//     last segment, TruncateSuffix cuts it (or rebuilds it from the log
//     when the cut makes a sealed segment the active one again). It has no
//     file. SegmentRecordsMax (default 512 Ki) bounds it whatever the
//     record size: 17 MiB of heap per range at most, measured with every
//     key distinct (sealing takes about as much again for a moment, to
//     sort).
//   - Sealing a segment writes its ".keyindex" file (fsynced under
//     FsyncAlways, like the other index files): a 32-byte header (magic
//     "GLKI", version 1, the segment's base offset, the log bytes it
//     covers, the entry count, entries per block, and the header's
//     CRC-32C), then the entries sorted by (hash, relOffset) in blocks of
//     256, each block followed by the CRC-32C of its entries. Only the
//     fence stays in memory, the first (hash, relOffset) of every block: 8
//     bytes per 256 records (a twentieth of what the sparse offset index
//     takes for 100-byte records), so that millions of distinct keys cost
//     memory in the active segment only.
//   - A lookup of a key from an offset costs, per sealed segment from the
//     one holding the offset, a binary search of the fence and one read of
//     the block where the key's first entry would be (3 KiB; none when the
//     fence alone shows the key is absent), then one read per frame that
//     holds records of the key. Every frame read is verified (its CRC,
//     that it holds the entry's offset, and the record's key byte for
//     byte, which resolves hash collisions); an entry the log does not
//     bear out, or a block failing its CRC, makes the read scan that
//     segment instead (a bad block marks the file broken until the next
//     Open). The log is the truth; the key index only says where to look.
//   - Recovery verifies every sealed segment's key index file against the
//     log without holding its entries: its pass over the segment sums a
//     fingerprint of the entries it computes from the frames (their count
//     and a 64-bit sum of a mix of each entry, independent of order), and
//     the file must decode (header and block CRCs, entries strictly
//     sorted, offsets and positions inside the segment) to the same
//     fingerprint. A file missing, torn, corrupt or stale is rebuilt from
//     the log (one more read of that segment) once the whole log has
//     verified; a file beside the active segment, or without a log, is
//     removed. A failure to write one leaves the segment without a key
//     index (scanned) until the next Open. Install removes every index file
//     and its reload rebuilds them, so a transferred log ends with valid
//     key indexes. A frame whose CRC is valid but whose records do not
//     parse is corruption.
//   - RewriteSegment (compaction by key) builds the new segment's key
//     index from the frames it writes (12 bytes per record kept), writes
//     it as "_clean.<segment>.keyindex" and renames it over the old file
//     before it publishes the new segment, so that no reader of the new
//     segment uses the old index; readers of the old segment keep the old
//     file, which the swap opens for them first. A crash in between leaves
//     an index that does not match its log, which Open rebuilds.
//     KeyIndexBuilder builds a segment's key index file from its frames
//     exactly as the store does, for any other component that writes
//     segments. The key index is a file of its own with its own CRCs, so
//     that encryption at rest can seal logs and indexes apart.
//
// All file I/O goes through Config.FS (vfs.OS by default; vfs.Mem in tests
// and the simulator), which spells out what is durable when.
//
// # Contract
//
//  1. Open a directory with one Store at a time: Open locks it, and a second
//     Open (this process or another) fails with ErrLocked until Close.
//     Open verifies the whole log (see Recovery) and calls Config.OnRecover
//     for every retained frame in order; if Open fails, discard what
//     OnRecover built.
//  2. One goroutine, the range driver, is the appender: it alone calls
//     Append, TruncateSuffix, TruncateSuffixAtIndex, DeletePrefix,
//     ApplyRetention and Close. (They are serialised internally too, so a
//     mistake costs latency, not data.)
//  3. Append takes exactly one frame that the caller built with BaseOffset ==
//     NextOffset(), at least one record unless it is a control frame, an
//     append time no earlier than the previous frame's, and either no Raft
//     index (while the log holds none) or index LastIndex()+1 (any index
//     for the first indexed frame) with a term no lower than the previous
//     one. Append re-validates the frame (CRC, structure, offset, index,
//     term) before the single write; a frame failing that is refused with
//     ErrInvalidFrame and nothing is written.
//  4. Nothing appended is durable until Sync returns nil for a call made
//     after the Append. Persist before you acknowledge: a Raft entry is
//     acked to the leader, and a record to its producer, only after a Sync
//     covering it. Sync may be called from any goroutine; concurrent callers
//     share one fdatasync (group commit); with Config.SyncGroup set, that
//     fdatasync joins the node's rounds across stores (vfs.SyncGroup), and
//     its result is still this store's file's. DurableOffset reports the result
//     for records (control frames take no offset: their durability shows
//     only as Sync returning).
//  5. A failed write or fdatasync is never retried: the store refuses every
//     later Append and Sync with ErrFailed. Close it and Open again;
//     recovery keeps exactly what reached the disk. The one exception is a
//     write (or a segment's creation) refused for space (ENOSPC, EDQUOT,
//     vfs.IsNoSpace): Append cuts off whatever part of the frame landed and
//     returns ErrNoSpace, the store stays as it was (earlier frames
//     readable, Sync working), and the next Append tries again (NoSpace
//     reports the state). A failed fdatasync is final whatever its errno.
//  6. Readers (ReadFrames, ReadFramesByIndex, ReadKey, TermAt, OffsetForTime,
//     NextOffset, DurableOffset, StartOffset, FirstIndex, LastIndex, Size)
//     may run on any goroutines concurrently with the appender. The reads
//     verify the CRC and sequence (offsets, indexes) of every frame they
//     pass and may return frames that are not durable or not committed
//     yet: bound endOffset, or hi, by what the caller may expose.
//  7. TruncateSuffix (by offset: every frame with BaseOffset >= offset,
//     which must be a batch boundary) and TruncateSuffixAtIndex (every frame
//     with Index >= index; NextOffset falls back to that frame's
//     BaseOffset) drop a suffix and return once the shorter log is durable;
//     they wait for readers in flight. Never truncate below what was
//     acknowledged as committed.
//  8. DeletePrefix and ApplyRetention delete whole segments, oldest first,
//     never the active one; FirstIndex moves with them. A reader of a
//     deleted segment finishes on the unlinked file; later reads below
//     StartOffset (or FirstIndex) get ErrOutOfRange.
//  9. A *CorruptionError (errors.Is ErrCorrupt) from Open or a read means
//     the range must stop serving: the store never skips over corruption
//     and never repairs it beyond the torn tail rules below.
//  10. Close fsyncs the log, writes the active segment's index files,
//     closes the files once the last reader is done with them, and
//     releases the directory lock.
//  11. Raft log compaction: RetentionCandidates says which segments
//     ApplyRetention would delete (and deletes nothing), so that a replica
//     can record its compaction point before DeletePrefix deletes the ones
//     it has applied. For the appender.
//  12. Replacing the log (a Raft snapshot): BeginStaging, Staging.Append
//     (validated as Append validates) and Finish, on any one goroutine,
//     write the new log beside this one; Install, on the appender, swaps it
//     in, atomically across crashes (install.go has the steps), and waits
//     for readers in flight. One staging per store at a time.
//  13. Rewriting a sealed segment (compaction by key): SealBefore, on the
//     appender, seals what lies below an offset; WalkSegment and
//     RewriteSegment, on any one goroutine (one rewrite at a time), read a
//     sealed segment and replace it with the frames a function returns,
//     validated, atomically across crashes (rewrite.go has the steps). A
//     rewrite takes the appender's lock only to swap; readers of the old
//     file finish on it. A segment that retention, a truncation or an
//     install changed meanwhile is left alone (ErrRewriteAbandoned).
//
// # Recovery
//
// Open makes one pass over all segments in log order. It verifies every
// frame's CRC, that each frame's BaseOffset is the previous frame's
// NextOffset (or past it, for a compacted frame), that a data frame holds
// records (but a compacted one), that Raft indexes, once present, are
// dense (but at a fork frame that names the frame before its gap, and at
// a compacted frame) with terms non-decreasing, and that each segment's
// name is the offset where the previous one ends and its first frame's
// BaseOffset. While the pass runs nothing on disk changes; once the whole
// log has verified, recovery truncates a torn tail, rewrites index files
// (the key index too) that do not match the log and removes orphan index
// files.
//
// Lost segments. Before recovery's pass, the first segment is checked
// against the start record: starting past the recorded start, or no
// segment at all under a record, means segment files went missing (not
// by retention, which saves the record before it deletes), and Open
// returns a *CorruptionError wrapping a *MissingError (ErrDataLoss) that
// names the offsets; so does a gap between two segments. A first segment
// below the record (a crash between the save and the deletion it
// announced) is kept, and the record lowered to it. Verify makes the same
// checks and the same pass offline, changing nothing.
//
// Torn tail rule. In the last segment, a frame that is short (its length
// runs past the end of the file) or fails its CRC or header checks is a torn
// tail if no valid frame follows it anywhere in that segment: neither where
// its length field points (if that length is plausible) nor at any later
// byte position where a frame with a valid CRC and BaseOffset >= the
// expected offset starts. Only an interrupted write can produce that.
//
// Hole rule. A bad frame in the last segment that a valid frame does follow
// is a torn tail too if a hole lies between them: a 4 KiB-aligned block,
// starting before the valid frame, whose bytes from the bad frame (or the
// block's start, if later) to the block's end (or the file's) are all zero.
// That is what a crash leaves when the kernel wrote back the pages of
// writes made since the last fdatasync out of order: a page never written
// reads as zero, and a later page made it. Since an fdatasync makes every
// earlier write of the file durable, a frame with a hole in it was never
// synced, nor was anything after it. (The residual risk: a corrupt frame
// that holds an aligned 4 KiB run of zeros of its own is taken for torn.)
//
// A torn tail is truncated at the bad frame's position, the truncation is
// fsynced, and the loss is logged. Everything else is mid-log corruption and
// Open returns a *CorruptionError naming segment, position and offset,
// deleting and truncating nothing: a bad frame with a valid frame after it
// and no hole between, a bad frame in any segment but the last, a frame
// whose CRC is valid but whose offset, index or term is out of sequence or
// that is a data frame without records (never the product of a torn
// write), and segments that do not join up. Empty segment files are fine
// where they can occur: as the last segment.
//
// Padding rule. With zero-ahead (Config.ZeroAheadBytes, zeroahead.go) the
// last segment's file may go on past its last frame in zeros that no frame
// has been written over yet. A tail that is all zeros from the first bad
// frame's position to the end of the file is that padding: it is cut off
// as a torn tail would be (the outcome the torn tail rule gives it too, as
// no valid frame follows zeros), logged at debug, not as a loss. Roll cuts
// the padding off a segment before the fdatasync that seals it, and Close
// before its own, so sealed segments end at their last frame.
//
// Under FsyncAlways a sealed segment is complete on disk before the next one
// is created, so only the last segment can have a torn tail.
package segment
