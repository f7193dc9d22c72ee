// Package vfs is the file system seam of geolog's storage: a small FS and
// File interface, the real implementation (OS) and an in-memory twin (Mem)
// for tests and the deterministic simulator. Storage code takes an FS in its
// Config and runs unchanged over either.
//
// # The contract
//
// FS states what is durable when (see its doc comment): file data after
// File.Datasync, directory entries after FS.SyncDir of their directory, and
// nothing after a failed Datasync. Code that follows the contract survives
// Mem.Crash; code that does not is caught by it.
//
// # OS
//
// OS() is the real file system. Datasync is fdatasync(2) (retried only on
// EINTR, never after a failure), SyncDir fsyncs the directory, and Lock
// takes a non-blocking exclusive flock(2) on a LOCK file in the directory,
// so a second holder (another process, or a second Lock in this one) gets an
// error wrapping ErrLocked; the kernel drops the lock when the process dies.
//
// # SyncGroup
//
// NewSyncGroup() is a sync point that many files' Datasyncs can share (a
// node's range logs on one disk): an idle caller flushes at once, callers
// arriving during a flush are flushed together in the next round, each
// with its own file's result. See SyncGroup for why it is off by default.
//
// # Mem
//
// NewMem(rng) is an in-memory FS that keeps, per file, the durable content
// and the writes since the last Datasync, and per directory the durable
// entries and the changes since the last SyncDir. Crash returns a new Mem
// with what a power loss would leave, drawn from rng:
//
//   - data written before a file's last successful Datasync (and not
//     changed since) always survives;
//   - unsynced writes and truncations survive not at all, entirely, as an
//     in-order prefix, or page by page (PageBytes) in any order, each page
//     in any version it went through, with any size the file had since the
//     last Datasync; never-written bytes read as zero;
//   - a directory keeps its entries as of its last SyncDir plus a prefix of
//     the creates, removes and renames made since (a rename within one
//     directory is atomic), so an unsynced create may vanish and an
//     unsynced remove may be undone.
//
// Faults: FailDatasyncs(n) fails the next n Datasync calls with EIO (and,
// like Linux, decides at once which of the covered writes were lost for
// good), FailWrites(n) fails the next n writes with EIO (a write may land in
// part), and SetHook runs a callback before every operation, for latency or
// any other error. SetSpaceBytes bounds the data Mem holds, a disk that
// fills up: a write past the bound lands in part and fails with ENOSPC
// (IsNoSpace classifies that, for OS too). Mem is safe for concurrent
// use; given the seed and the same sequence of calls, everything it
// decides is the same.
//
// Memory is bounded by the live data plus, per file and directory, at most
// pendingOpsMax unsynced changes: past that the oldest half is written back
// (made durable), as a kernel flushes dirty pages on its own.
package vfs
