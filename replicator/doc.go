// Package replicator ships a range's committed log from its home region to
// its mirrors in the stream's other regions, asynchronously, over the
// Mirror service of proto/geolog/internal/v1/mirror.proto.
//
// In the home region a range is a writable Raft group; in every other
// region of the stream it is a mirror group that applies the home's frames
// verbatim: same offsets, epochs, append times, producer ids and sequences.
// Only the Raft term and index of a frame header are per region; a
// mirror's Raft group re-stamps them. So a mirror is always a prefix of the
// home's log (DESIGN.md invariants 2 and 6), up to a fork point that
// homing records after an unplanned failover.
//
// # Pieces
//
//   - Cursor, the source side's deterministic core: events in (Start,
//     Connected, Response, Refused, StreamFailed, TailAdvanced, ReadDone,
//     Tick, ...), Actions out (Connect after a delay, Read and send,
//     Heartbeat, Stop). No goroutine, clock or socket; the reconnect
//     jitter comes from a seeded generator.
//   - Task, its driver: one per (range, destination region), run by the
//     home range's leader for as long as it leads at one epoch. It owns the
//     gRPC stream through a Dialer and reads through a Source.
//   - Server, the destination side: the Mirror service of a node, over a
//     MirrorStore the node provides.
//   - Lag, the deterministic lag tracker both sides can use.
//   - In-memory twins: MemSource (a frame slice) and MemMirrorStore /
//     MemMirror (frames in memory, enforcing the mirror contract).
//
// # Protocol
//
// One bidi stream per (stream, range, destination region). The first
// request opens it (stream, range, source and destination regions, home
// epoch); the mirror answers with its applied end and the highest epoch it
// has seen, and shipping resumes at that applied end: nothing the mirror
// holds is sent again, nothing is skipped. Every request carries the home's
// heartbeat (committed tail, home time, epoch) and at most one batch:
// consecutive whole data frames, as stored, zstd-compressed or not. Every
// request gets exactly one answer, in order, so requests pipeline up to the
// window.
//
// Control frames (Raft no-ops and configuration changes) are never
// shipped: they take no offset, and they belong to the home region's Raft
// group, whose membership means nothing in another region. A Source
// returns data frames only (segment.Store.ReadFrames already does). The
// mirror refuses a control frame as malformed.
//
// Compaction by key (package compact) ships like any data: its markers
// (batch.TypeCompact) take an offset and travel with the data frames, so
// every mirror compacts at the home's decisions. A home that compacted
// below a point may ship frames it rewrote (batch.FlagCompacted): they may
// hold no record, and may start past the previous frame's end (the frames
// between were compacted away). So a batch may begin with a hole (its
// first_offset is where the mirror stands, its first frame later), the
// mirror applies a compacted frame past its applied end, and frames below
// the applied end that compaction rewrote on either side are not compared
// frame by frame (the copies hold the same records, but not always the
// same emptied batches): compaction only runs below what every mirror had
// applied, where no divergent tail can be.
//
// # The mirror's contract
//
// The Server validates everything before the MirrorRange sees it: the open
// (names, regions, epoch), every heartbeat's epoch (that of the open), the
// compression and sizes (nothing is decompressed past the announced size,
// which is bounded), and every frame (CRC and structure, data frames with
// records, compacted frames or markers only, offsets dense from
// first_offset to end_offset but for holes before compacted frames, epochs
// not decreasing and not above the home's, append times not decreasing).
// Anything else ends the stream with INVALID_ARGUMENT (ErrMalformed);
// nothing a peer sends makes the server panic. Then, with the range's
// requests serialized and A = AppliedEnd():
//
//  0. Home. A MirrorRange that knows the range's home (HomeChecker: the
//     node's homing view, i.e. the lease store's current home and epoch)
//     is asked first, at the open and with every request: a source of
//     another region, or at an epoch above the current one, is refused
//     with NOT_HOME (ErrNotHome; the source retries later), one below it
//     with STALE_EPOCH, before anything is recorded or applied. So a
//     forged or confused stream cannot raise the epoch the mirror fences
//     its real home with, nor cut its log into the orphan log.
//  1. Fencing. A home epoch below HighestEpoch is refused with STALE_EPOCH
//     (ErrStaleEpoch) and the stream ends; the source stops (ErrFenced). A
//     home epoch above it is recorded through RecordHeartbeat at the open,
//     before any of that home's frames is applied.
//  2. Gap. first_offset > A is refused with OFFSET_OUT_OF_RANGE (ErrGap)
//     whose tail_offset is A; the stream stays open and the source rewinds
//     to A. The answers to what it had pipelined after the refused batch
//     are ignored.
//  3. Overlap. The frames below A are compared with the mirror's, frame by
//     frame, on every field but the CRC and the Raft term and index. If all
//     match, a batch wholly below A is acknowledged as is (a resend after a
//     lost ack is harmless) and a batch across A has its part from A
//     applied. Any difference (data, frame boundaries, a missing frame)
//     is refused with CORRUPTION (ErrDiverged) and the stream ends: the
//     mirror holds a divergent tail that homing must cut into the orphan
//     log first. The source backs off and retries.
//  4. Extension. Frames starting exactly at A are handed to Apply, which
//     answers once they are applied (committed by the mirror's Raft
//     group); the answer carries the new applied end.
//
// A node that does not lead the range's mirror group answers NOT_LEADER
// with the leader's address as hint; the source follows it (up to
// HintsFollowMax hints in a row at once, then with backoff) and otherwise
// walks the destination's address list.
//
// # Driver contract (Task)
//
//  1. One goroutine (Run) owns the Cursor. It selects over the context, the
//     heartbeat ticker, the Source's TailChanged channel, the reconnect
//     timer and the inbox of session reports, feeds each to the Cursor,
//     then executes Ready's actions in order until there are none.
//  2. Connect: end the current session first (cancel it and wait for its
//     goroutines), wait the action's Delay, then start a session to the
//     hint or the next address. A session's receiver goroutine dials,
//     sends the open with a fresh heartbeat and waits HandshakeTimeout for
//     the answer, then reports every answer to the inbox tagged with the
//     session's generation; reports of an ended session are dropped.
//  3. Read: read from the Source on the Run goroutine, bounded by the
//     action's MaxBytes and by the committed tail; a result larger than
//     FitBytes is not sent (ReadBlocked); otherwise queue the request and
//     report ReadDone before handling any other event. The send queue holds
//     as many requests as the window allows, so queueing never blocks; the
//     session's sender goroutine compresses (with the process's shared
//     zstd encoder) and sends in queue order.
//  4. Backpressure. The Cursor issues a Read only while the requests in
//     flight are below WindowRequestsMax and the frame bytes in flight
//     leave room for a whole batch (BatchBytesMax) or for the frame that
//     did not fit last time; a frame larger than the window goes alone
//     when nothing else is in flight. So in-flight bytes never exceed
//     WindowBytes but for that lone frame, and a mirror that stops
//     answering stops the reads: the source's memory is bounded by the
//     window, whatever the backlog. The server handles one request of a
//     stream at a time and HTTP/2 flow control holds back the rest.
//  5. Every request's heartbeat reads the home clock before the committed
//     tail, so the tail it claims for that time is never too low and lag
//     errs high. An idle stream sends a heartbeat-only request when a
//     HeartbeatInterval passed without any request.
//  6. Stop: the Cursor stops on STALE_EPOCH (or an answer showing a higher
//     epoch): Run returns an error wrapping ErrFenced. Cancelling Run's
//     context stops it too. Every other failure (transport, refusal, read
//     error) drops the stream and reconnects after a jittered exponential
//     backoff (BackoffMin doubling to BackoffMax, each wait in [w/2, w)),
//     reset by the first answer that is not a refusal.
//
// # Lag
//
// Both ends can keep a Lag. The Server keeps one per range, fed by the
// heartbeats it receives and the applied ends it reaches (Server.Lag), and
// keeps it while the stream is down so that a stalled link shows a growing
// lag, never zero. The Task keeps one fed by the heartbeats it sends and
// the applied ends the mirror reports (Task.Lag), entirely on the home's
// clock. See Lag for the clock-offset caveat of the mirror's view.
//
// # Divergent mirrors and retention
//
// A mirror whose log ends in an older epoch than the home's is resent from
// where the home's log left that epoch (Task, evConnected), and the Server
// forks it where a newer epoch's frame meets an older one it holds
// (Forker). When the resend starts below what the mirror retains, the
// overlap cannot be compared; if the batch's first frame is of a newer
// epoch than the mirror's log (its last frame's, or LogEpocher's), nothing
// the mirror holds from there is the range's, and the Server forks at the
// batch's start, below the mirror's log start (a reset: regionsvc's
// replica.ProposeFork), then applies the batch; otherwise it refuses the
// batch with UNAVAILABLE. Heartbeats carry the home's compaction floor
// (TaskConfig.RetainFrom, Heartbeat.RetainFrom): a mirror keeps its log
// from there, so that whichever region takes the range over still holds
// every other mirror's resend point. See notes/simgaps.md.
//
// # A mirror behind the home's log start
//
// The home's retention may delete what a mirror has yet to receive (the
// mirror hold released it: regionsvc/mirrorhold.go). The Task's read
// below the Source's start then fails with ErrOutOfRange; a Source that
// says where it starts (SourceStarter) is read from there instead, and the
// batch goes flagged from_source_start (the Cursor sees it as covering the
// skipped offsets, as for a compacted hole). The Server refuses a flagged
// batch with ErrSkipRefused (INVALID_ARGUMENT; the stream ends) unless its
// start is above the mirror's applied end, its end within the heartbeat's
// committed tail, and the mirror a Skipper; it then calls SkipTo (the
// mirror's log starts and ends at the batch's start, its older frames
// deleted as the home's were) and applies the batch. A skip deletes what
// the mirror held below the home's start: a prefix of the home's log.
// But when the mirror's log ends in an older epoch than the batch's first
// frame (LogEpocher), part of it may be an old home's divergent tail,
// which the home's deleted frames would have shown; the Server then first
// forks the mirror at its log's start (Forker, SourceStarter), moving all
// it retains into its orphan log, and skips after. A Source whose whole
// log retention deleted has no frame to flag: the Task sends a skip
// marker, a flagged batch of no frames at the Source's start, and the
// Server skips with the home's epoch standing in for the first frame's.
//
// # Limits
//
// Everything is bounded: in-flight bytes and requests (WindowBytes 8 MiB,
// WindowRequestsMax 32), batch size (BatchBytesMax 1 MiB), a request's
// frames on the server (UncompressedBytesMax, batch.FrameBytesMax), the
// decompressions at once (DecoderConcurrency), the server's per-range
// state (RangesMax), the dialer's connections, the backoff, the hints
// followed in a row, the handshake, and the Lag's pending heartbeats.
//
// # Not yet
//
//   - A Source without SourceStarter cannot ship to a mirror below its
//     start: the read fails and the Task retries with backoff, logging
//     each failure (TaskStats.BehindSourceStart).
//   - The Server applies one request of a range at a time and answers it
//     once applied; a MirrorRange that pipelined proposals would let one
//     stream fill the mirror's Raft pipeline.
//   - Server.Lag is the view of the node that leads the mirror group; the
//     others know nothing (Known false, time lag counting from their
//     state's creation).
package replicator
