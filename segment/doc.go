// Package segment is one range's append-only log on disk: the Raft log and
// the message log at once (batches are written once, here).
//
// # On-disk layout
//
// A range's directory holds, for every segment, named by the segment's base
// offset (the offset of its first record) in 20 zero-padded digits:
//
//	00000000000000000000.log        frames (package batch), back to back,
//	                                offsets contiguous: each frame's BaseOffset
//	                                is the previous frame's NextOffset
//	00000000000000000000.index      sparse offset index, 8-byte entries
//	                                (relOffset u32, filePos u32), little-endian
//	00000000000000000000.timeindex  time index, 12-byte entries
//	                                (appendTime i64, relOffset u32)
//	00000000000000012345.log        the next segment starts where the last
//	...                             one ends; the newest is the active one
//
// relOffset is an offset minus the segment's base offset. A frame at file
// position p gets an entry in both index files when p is at least
// IndexIntervalBytes past the previous entry's position (the first frame
// never needs one); appendTime is the newest append time up to that frame.
// The active segment's index files are written when it is sealed and on
// Close. Index files are a cache: Open recomputes every entry from the log
// and rewrites a file that is missing, malformed (size not a multiple of the
// entry size, entries not increasing, pointing past the log) or merely
// stale. In memory the index costs 16 bytes per IndexIntervalBytes of log
// (0.4% at the 4 KiB default).
//
// # Contract
//
//  1. Open a directory with one Store at a time. Open verifies the whole log
//     (see Recovery) and calls Config.OnRecover for every retained batch in
//     order; if Open fails, discard what OnRecover built.
//  2. One goroutine, the range driver, is the appender: it alone calls
//     Append, TruncateSuffix, DeletePrefix, ApplyRetention and Close. (They
//     are serialised internally too, so a mistake costs latency, not data.)
//  3. Append takes exactly one frame that the caller built with BaseOffset ==
//     NextOffset(), at least one record and an append time no earlier than
//     the previous batch's. Append re-validates the frame (CRC, structure,
//     offset) before the single write; a frame failing that is refused
//     with ErrInvalidFrame and nothing is written.
//  4. Nothing appended is durable until Sync returns nil for a call made
//     after the Append. Persist before you acknowledge: a Raft entry is
//     acked to the leader, and a record to its producer, only after a Sync
//     covering it. Sync may be called from any goroutine; concurrent callers
//     share one fdatasync (group commit). DurableOffset reports the result.
//  5. A failed write or fdatasync is never retried: the store refuses every
//     later Append and Sync with ErrFailed. Close it and Open again;
//     recovery keeps exactly what reached the disk.
//  6. Readers (ReadFrames, OffsetForTime, NextOffset, DurableOffset,
//     StartOffset, Size) may run on any goroutines concurrently with the
//     appender. ReadFrames verifies the CRC of every frame it returns and
//     may return frames that are not durable or not committed yet: bound
//     endOffset by what the caller may expose.
//  7. TruncateSuffix drops a suffix at a batch boundary and returns once
//     the shorter log is durable; it waits for readers in flight. Never
//     truncate below what was acknowledged as committed.
//  8. DeletePrefix and ApplyRetention delete whole segments, oldest first,
//     never the active one. A reader of a deleted segment finishes on the
//     unlinked file; later reads below StartOffset get ErrOutOfRange.
//  9. A *CorruptionError (errors.Is ErrCorrupt) from Open or ReadFrames means
//     the range must stop serving: the store never skips over corruption
//     and never repairs it beyond the torn tail rule below.
//  10. Close fsyncs the log, writes the active segment's index files and
//     closes the files once the last reader is done with them.
//
// # Recovery
//
// Open makes one pass over all segments in offset order. It verifies every
// frame's CRC, that each frame's BaseOffset is the previous frame's
// NextOffset, and that each segment's name is the offset where the previous
// one ends and its first frame's BaseOffset. While the pass runs nothing on
// disk changes; once the whole log has verified, recovery truncates a torn
// tail, rewrites index files that do not match the log and removes orphan
// index files.
//
// Torn tail rule. In the last segment, a frame that is short (its length
// runs past the end of the file) or fails its CRC or header checks is a torn
// tail if no valid frame follows it anywhere in that segment: neither where
// its length field points (if that length is plausible) nor at any later
// byte position where a frame with a valid CRC and BaseOffset >= the
// expected offset starts. Only an interrupted write can produce that: the
// file is truncated at the bad frame's position, the truncation is fsynced,
// and the loss is logged. Everything else is mid-log corruption and Open
// returns a *CorruptionError naming segment, position and offset, deleting
// and truncating nothing: a bad frame with a valid frame after it, a bad
// frame in any segment but the last, a frame whose CRC is valid but whose
// BaseOffset is out of sequence or that holds no records (never the product
// of a torn write), and segments that do not join up. Empty segment files
// are fine where they can occur: as the last segment.
//
// Under FsyncAlways a sealed segment is complete on disk before the next one
// is created, so only the last segment can have a torn tail.
package segment
