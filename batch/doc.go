// Package batch defines the record-batch frame: the unit that geolog stores
// in segments, replicates through Raft and ships across regions.
//
// A frame is little-endian: a fixed 88-byte header followed by RecordCount
// records.
//
//	off size field
//	0   4    Length               u32: bytes after this field (frame size - 4)
//	4   4    CRC                  u32: CRC32C (Castagnoli) of bytes [8, 4+Length)
//	8   1    Version              u8 = 1
//	9   1    Type                 u8: 0 data, 1 noop, 2 config, 3 fork, 4 compact
//	10  2    Flags                u16: 0x100 compacted, 0x200 tombstones (low byte reserved for compression)
//	12  4    RecordCount          u32
//	16  8    BaseOffset           u64
//	24  8    Epoch                u64: homing epoch
//	32  8    Term                 u64: raft term
//	40  8    Index                u64: raft index
//	48  8    AppendTimeUnixNanos  i64: server append time, non-decreasing per range
//	56  8    HLC                  u64: hybrid logical clock
//	64  8    ProducerID           u64: 0 = not idempotent
//	72  8    BaseSequence         u64
//	80  8    reserved             0; with FlagCompacted: OffsetSpan u32, then 4 zero bytes
//	88  ...  records
//
// Each record is
//
//	uvarint  bodyLen (bytes of the rest of this record)
//	uvarint  offsetDelta          only with FlagCompacted
//	u8       attributes           only with FlagTombstones: bit 0 tombstone, others 0
//	varint   ProducerTimeUnixNanos (zigzag)
//	uvarint  keyLen, key
//	uvarint  valueLen, value
//	uvarint  headerCount, then headerCount × (uvarint kLen, k, uvarint vLen, v)
//
// and record i of a frame as appended has offset BaseOffset+i.
//
// # Compaction by key
//
// Compaction by key (package compact) rewrites a frame to hold only some of
// its records (FlagCompacted): each record then carries its offset delta
// (its offset minus BaseOffset; strictly increasing, below OffsetSpan), and
// the header keeps the span of offsets the batch took when appended, so
// NextOffset (BaseOffset + OffsetSpan) and every other header field are
// unchanged. Offsets thus stay with their records and become sparse. A
// compacted frame may hold no record at all (a batch header kept for its
// producer), and in a log it may start past the previous frame's end: the
// frames in between were compacted away.
//
// A tombstone is a record whose value is absent, not empty (a key's
// deletion, which compaction eventually removes): a frame holding one sets
// FlagTombstones and every record of it carries an attributes byte. A
// tombstone with a value is corrupt. Decode reports each record's
// Tombstone and OffsetDelta (i for record i of a frame as appended);
// Encode derives both flags from the header's OffsetSpan and the records.
//
// A compaction marker (TypeCompact) is the decision of a range's home
// leader to compact below a point (Compaction): one record without key,
// headers, producer time or producer, whose value is the decision. It
// takes an offset like a record (it is shipped to mirrors with the data
// frames) but readers never see it.
//
// # Control frames
//
// A frame of type noop, config or fork with RecordCount 0 is a control
// frame: its body, after the header, is an opaque payload of any length (a
// Raft ConfChange, say; a leader's no-op carries none) instead of records.
// It takes no offset: its NextOffset is its BaseOffset, the offset the next
// record will get. EncodeControl builds one and DecodeControl returns its
// payload; Decode returns it with no records. A data frame always holds
// records in its body, none meaning an empty body. A fork frame never holds
// records (decoders reject one that claims some); its payload starts with
// the Raft index of the frame before it (ForkPrevIndex), see TypeFork.
//
// # Produced frames
//
// A producer builds a data frame itself (EncodeProduced) and sends it as
// AppendRequest.batch: only ProducerID and BaseSequence are set in its
// header, and the leader, after ValidateProduced has checked it in place
// and shown it each record (its key, header count and payload size, for
// the leader's own rules), stamps the fields only it may set (Patch,
// PatchRaft) and writes the frame as it came.
//
// Under Raft every frame is one entry and carries the entry's Term and Index
// (PatchRaft sets them); outside Raft both are 0.
//
// The encoding is canonical: every varint is minimal, reserved fields are
// zero, a flag is set exactly when the frame needs it (FlagTombstones with
// at least one tombstone) and a frame holds no bytes beyond its last
// record (or its payload).
// Decoders reject anything else as ErrCorrupt, so decode followed by encode
// (Decode and Encode, or DecodeControl and EncodeControl for a control
// frame) reproduces the input frame byte for byte. The wire format does not distinguish a nil
// key, value or header value from an empty one; decoders return nil for
// every zero-length field.
//
// Every decoder bounds every length against the bytes actually present before
// it allocates or slices, and never panics, whatever its input (see the fuzz
// targets FuzzDecode and FuzzRoundTrip, which cover control frames too).
package batch
