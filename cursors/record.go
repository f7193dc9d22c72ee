package cursors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// The record format of the cursor stream (doc.go, "Records"). Every
// record's key names what it holds, so that keeping the newest record per
// key (compaction by key) keeps exactly the current state:
//
//	position key: 'P' str(cursor) str(stream) u32be(range)
//	group key:    'G' str(group)
//
// A deleted position is a tombstone (its key, no value): compaction by
// key keeps it for the stream's delete retention, then drops the key. A
// deleted group is not a tombstone but a group record marked deleted: it
// keeps the group's epoch, so that a group created again under the name
// issues epochs above every one the old group issued (fencing).
//
// Values start with the format version (1). Integers are minimal uvarints
// (a non-minimal encoding is refused, so that every value has one exact
// encoding); strings and byte strings are a uvarint length and the bytes;
// range sets are a count and strictly increasing values, delta-encoded.

// Record kinds: the first byte of a key.
const (
	kindPosition byte = 'P'
	kindGroup    byte = 'G'
)

// formatVersion is the version byte every value starts with.
const formatVersion byte = 1

// Bounds of what a record may hold. Decoders refuse anything past them,
// so a corrupt or hostile record costs bounded memory.
const (
	// NameBytesMax bounds cursor, group, member and instance names.
	NameBytesMax = 256
	// StreamNameBytesMax bounds stream names (the catalogue's bound).
	StreamNameBytesMax = 128
	// MetadataBytesMax bounds the opaque metadata of one position.
	MetadataBytesMax = 1024
	// RangesMax bounds a group's stream's range count (the catalogue's).
	RangesMax = 4096
	// MembersMax bounds the members of one group.
	MembersMax = 1000
	// RecordBytesMax bounds one encoded record (a group of MembersMax
	// members owning RangesMax ranges fits in a fraction of it).
	RecordBytesMax = 1 << 20
)

// ErrMalformed is returned for a record that does not decode.
var ErrMalformed = errors.New("cursors: malformed record")

// Record is one record of the cursor stream: a key and a value, or a
// tombstone (a key and no value).
type Record struct {
	Key, Value []byte
	Tombstone  bool
}

// Position is a cursor's committed place in one range of a stream: the
// next offset its consumer has to process, as a max-register ordered by
// (Generation, Offset).
type Position struct {
	Stream string
	Range  uint32
	// Generation is the cursor's reset generation: an operator's reset
	// writes generation+1, which wins over any offset of the older one.
	Generation uint64
	// Offset is the next offset to process: every offset below it was
	// processed.
	Offset uint64
	// Epoch is the homing epoch of the record at Offset-1 as the consumer
	// read it (0: not given); it tells a position taken on a divergent
	// tail after a failover.
	Epoch uint64
	// CommitTimeUnixNanos is when the coordinator took the commit.
	CommitTimeUnixNanos int64
	// MemberID and MemberEpoch name the group member that committed (empty
	// for a commit outside a group, or a reset).
	MemberID    string
	MemberEpoch uint64
	Metadata    []byte
	// Deleted marks the record of a position removed by DeleteGroup, a
	// tombstone: it removes the position whatever it held (only a record;
	// a State never holds a deleted position). A tombstone carries only
	// the key's fields (Stream, Range).
	Deleted bool
}

// after reports whether p wins over q as a max-register: a higher
// generation, or the same one and a higher offset.
func (p Position) after(q Position) bool {
	if p.Generation != q.Generation {
		return p.Generation > q.Generation
	}
	return p.Offset > q.Offset
}

// PositionKey is the key of a position record.
func PositionKey(cursor, stream string, rng uint32) []byte {
	return appendPositionKey(make([]byte, 0, positionKeySize(cursor, stream)), cursor, stream, rng)
}

func positionKeySize(cursor, stream string) int {
	return 1 + binary.MaxVarintLen64 + len(cursor) + binary.MaxVarintLen64 + len(stream) + 4
}

func appendPositionKey(b []byte, cursor, stream string, rng uint32) []byte {
	b = append(b, kindPosition)
	b = appendString(b, cursor)
	b = appendString(b, stream)
	return binary.BigEndian.AppendUint32(b, rng)
}

// GroupKey is the key of a group record.
func GroupKey(group string) []byte {
	return appendString([]byte{kindGroup}, group)
}

// EncodePosition is the record of cursor's position p: a tombstone if p
// is Deleted.
func EncodePosition(cursor string, p Position) Record {
	_, r := appendPosition(make([]byte, 0, positionRecordSize(cursor, p)), cursor, p)
	return r
}

// positionRecordSize bounds the encoded size of a position record.
func positionRecordSize(cursor string, p Position) int {
	return positionKeySize(cursor, p.Stream) + 2 + 7*binary.MaxVarintLen64 + len(p.MemberID) + len(p.Metadata)
}

// appendPosition appends the key and value of cursor's position p to buf
// and returns buf and the record, whose key and value are views of it.
func appendPosition(buf []byte, cursor string, p Position) ([]byte, Record) {
	start := len(buf)
	buf = appendPositionKey(buf, cursor, p.Stream, p.Range)
	keyEnd := len(buf)
	if p.Deleted {
		return buf, Record{Key: buf[start:keyEnd:keyEnd], Tombstone: true}
	}
	// The byte after the version is reserved (0): it was a deleted flag
	// before deletions were tombstones.
	buf = append(buf, formatVersion, 0)
	buf = binary.AppendUvarint(buf, p.Generation)
	buf = binary.AppendUvarint(buf, p.Offset)
	buf = binary.AppendUvarint(buf, p.Epoch)
	buf = binary.AppendVarint(buf, p.CommitTimeUnixNanos)
	buf = appendString(buf, p.MemberID)
	buf = binary.AppendUvarint(buf, p.MemberEpoch)
	buf = appendString(buf, string(p.Metadata))
	end := len(buf)
	// Slicing after the appends: a buffer that grew moved; the record
	// views the new one.
	return buf, Record{Key: buf[start:keyEnd:keyEnd], Value: buf[keyEnd:end:end]}
}

// EncodeGroup is the record of group g.
func EncodeGroup(g *Group) Record {
	v := []byte{formatVersion, boolByte(g.Deleted)}
	v = appendString(v, g.Stream)
	v = binary.AppendUvarint(v, uint64(g.RangeCount))
	v = binary.AppendUvarint(v, g.Epoch)
	v = binary.AppendUvarint(v, g.AssignmentEpoch)
	v = binary.AppendUvarint(v, uint64(len(g.Members)))
	for i := range g.Members {
		v = appendMember(v, &g.Members[i])
	}
	return Record{Key: GroupKey(g.Name), Value: v}
}

func appendMember(v []byte, m *Member) []byte {
	v = appendString(v, m.ID)
	v = appendString(v, m.InstanceID)
	v = binary.AppendUvarint(v, m.Epoch)
	v = binary.AppendUvarint(v, m.JoinEpoch)
	v = binary.AppendUvarint(v, uint64(m.SessionTimeoutMillis))
	v = binary.AppendUvarint(v, uint64(m.RebalanceTimeoutMillis))
	v = append(v, boolByte(m.Away))
	v = appendRanges(v, m.Target)
	v = appendRanges(v, m.Owned)
	return appendRanges(v, m.Revoking)
}

// Decoded is a decoded record: exactly one of Position and Group is set.
type Decoded struct {
	// Cursor names the cursor of a position record.
	Cursor   string
	Position *Position
	Group    *Group
}

// Decode decodes and validates a record of the cursor stream. Anything
// that is not exactly what the encoders produce is ErrMalformed.
func Decode(r Record) (Decoded, error) {
	if err := checkRecordSize(r); err != nil {
		return Decoded{}, err
	}
	switch r.Key[0] {
	case kindPosition:
		v, err := decodePositionRecord(r)
		if err != nil {
			return Decoded{}, err
		}
		p := v.p
		p.Stream, p.MemberID = string(v.stream), string(v.memberID)
		if len(v.metadata) > 0 {
			p.Metadata = slices.Clone(v.metadata)
		}
		return Decoded{Cursor: string(v.cursor), Position: &p}, nil
	case kindGroup:
		k := &reader{b: r.Key[1:]}
		name := k.str(NameBytesMax)
		if err := k.end(); err != nil {
			return Decoded{}, err
		}
		if name == "" || r.Tombstone {
			return Decoded{}, fmt.Errorf("%w: group key names no group, or is a tombstone", ErrMalformed)
		}
		g, err := decodeGroup(name, r.Value)
		if err != nil {
			return Decoded{}, err
		}
		return Decoded{Group: g}, nil
	default:
		return Decoded{}, fmt.Errorf("%w: unknown kind %q", ErrMalformed, r.Key[0])
	}
}

func checkRecordSize(r Record) error {
	if len(r.Key) == 0 || len(r.Key)+len(r.Value) > RecordBytesMax {
		return fmt.Errorf("%w: key of %d bytes, value of %d", ErrMalformed, len(r.Key), len(r.Value))
	}
	return nil
}

// positionRecord is a position record decoded in place: cursor, stream,
// memberID and metadata are views of the record's bytes, valid while
// they are; p holds the other fields (Stream, MemberID and Metadata
// unset). The applier merges it into a State without allocating when the
// cursor and its position are already held.
type positionRecord struct {
	cursor, stream, memberID, metadata []byte
	p                                  Position
}

// decodePositionRecord decodes and validates a position record (a key
// of kindPosition), as Decode does.
func decodePositionRecord(r Record) (positionRecord, error) {
	if err := checkRecordSize(r); err != nil {
		return positionRecord{}, err
	}
	var v positionRecord
	k := &reader{b: r.Key[1:]}
	v.cursor = k.bytes(NameBytesMax)
	v.stream = k.bytes(StreamNameBytesMax)
	rng := k.u32be()
	if err := k.end(); err != nil {
		return positionRecord{}, err
	}
	if err := v.decodeValue(r); err != nil {
		return positionRecord{}, err
	}
	v.p.Range = rng
	if len(v.cursor) == 0 || len(v.stream) == 0 || rng >= RangesMax {
		return positionRecord{}, fmt.Errorf("%w: position key names cursor %q, stream %q, range %d", ErrMalformed, v.cursor, v.stream, rng)
	}
	return v, nil
}

func (v *positionRecord) decodeValue(r Record) error {
	if r.Tombstone {
		if len(r.Value) > 0 {
			return fmt.Errorf("%w: a tombstone with a value", ErrMalformed)
		}
		v.p.Deleted = true
		return nil
	}
	d := &reader{b: r.Value}
	d.version()
	if d.flag() {
		d.fail("reserved flag set")
	}
	v.p.Generation = d.uvarint()
	v.p.Offset = d.uvarint()
	v.p.Epoch = d.uvarint()
	v.p.CommitTimeUnixNanos = d.varint()
	v.memberID = d.bytes(NameBytesMax)
	v.p.MemberEpoch = d.uvarint()
	v.metadata = d.bytes(MetadataBytesMax)
	return d.end()
}

func decodeGroup(name string, v []byte) (*Group, error) {
	d := &reader{b: v}
	d.version()
	g := &Group{Name: name}
	g.Deleted = d.flag()
	g.Stream = d.str(StreamNameBytesMax)
	g.RangeCount = uint32(d.bounded(RangesMax))
	g.Epoch = d.uvarint()
	g.AssignmentEpoch = d.uvarint()
	n := d.bounded(MembersMax)
	for i := uint64(0); i < n && d.err == nil; i++ {
		// A member's ranges may be a split's children, past the range
		// count as created (split.go).
		g.Members = append(g.Members, d.member(RangesMax))
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	if err := g.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return g, nil
}

func (d *reader) member(rangeCount uint32) Member {
	var m Member
	m.ID = d.str(NameBytesMax)
	m.InstanceID = d.str(NameBytesMax)
	m.Epoch = d.uvarint()
	m.JoinEpoch = d.uvarint()
	m.SessionTimeoutMillis = uint32(d.bounded(math.MaxUint32))
	m.RebalanceTimeoutMillis = uint32(d.bounded(math.MaxUint32))
	m.Away = d.flag()
	m.Target = d.ranges(rangeCount)
	m.Owned = d.ranges(rangeCount)
	m.Revoking = d.ranges(rangeCount)
	return m
}

// validate checks a group's structural invariants: members sorted by id
// and unique, instance ids unique, revoking a subset of owned, no range
// owned twice, epochs ordered.
func (g *Group) validate() error {
	if len(g.Members) > 0 && (g.Stream == "" || g.RangeCount == 0) {
		return errors.New("a group with members names no stream")
	}
	owner := map[uint32]bool{}
	instances := map[string]bool{}
	for i, m := range g.Members {
		if m.ID == "" || (i > 0 && g.Members[i-1].ID >= m.ID) {
			return fmt.Errorf("member %d: ids not sorted or unique", i)
		}
		if m.InstanceID != "" {
			if instances[m.InstanceID] {
				return fmt.Errorf("instance id %q twice", m.InstanceID)
			}
			instances[m.InstanceID] = true
		}
		if m.JoinEpoch > m.Epoch || m.Epoch > g.Epoch {
			return fmt.Errorf("member %q: epochs join %d, member %d, group %d out of order", m.ID, m.JoinEpoch, m.Epoch, g.Epoch)
		}
		for _, r := range m.Revoking {
			if _, ok := slices.BinarySearch(m.Owned, r); !ok {
				return fmt.Errorf("member %q revokes range %d it does not own", m.ID, r)
			}
		}
		for _, r := range m.Owned {
			if owner[r] {
				return fmt.Errorf("range %d owned twice", r)
			}
			owner[r] = true
		}
	}
	if g.AssignmentEpoch > g.Epoch {
		return fmt.Errorf("assignment epoch %d past group epoch %d", g.AssignmentEpoch, g.Epoch)
	}
	return nil
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendRanges appends a sorted set of ranges: the count, the first value,
// then each gap minus one.
func appendRanges(b []byte, rs []uint32) []byte {
	b = binary.AppendUvarint(b, uint64(len(rs)))
	for i, r := range rs {
		if i == 0 {
			b = binary.AppendUvarint(b, uint64(r))
		} else {
			b = binary.AppendUvarint(b, uint64(r-rs[i-1]-1))
		}
	}
	return b
}

// reader decodes a value; the first error sticks and later reads return
// zero values.
type reader struct {
	b   []byte
	err error
}

func (d *reader) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
	}
}

func (d *reader) version() {
	if len(d.b) == 0 || d.b[0] != formatVersion {
		d.fail("unknown format version")
		return
	}
	d.b = d.b[1:]
}

func (d *reader) flag() bool {
	if d.err != nil {
		return false
	}
	if len(d.b) == 0 || d.b[0] > 1 {
		d.fail("bad flag")
		return false
	}
	v := d.b[0] == 1
	d.b = d.b[1:]
	return v
}

// uvarint reads a minimally encoded uvarint.
func (d *reader) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || (n > 1 && d.b[n-1] == 0) {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *reader) varint() int64 {
	u := d.uvarint()
	// Zig-zag, as binary.AppendVarint writes it.
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

func (d *reader) bounded(max uint64) uint64 {
	v := d.uvarint()
	if v > max {
		d.fail("value %d over %d", v, max)
		return 0
	}
	return v
}

func (d *reader) str(max int) string { return string(d.bytes(max)) }

// bytes reads a byte string of at most max bytes: a view of the input
// (nil if empty).
func (d *reader) bytes(max int) []byte {
	n := d.bounded(uint64(max))
	if d.err != nil || n == 0 {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail("string of %d bytes past the end", n)
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (d *reader) u32be() uint32 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 4 {
		d.fail("short range")
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

// ranges reads a sorted range set whose values are below rangeCount.
func (d *reader) ranges(rangeCount uint32) []uint32 {
	n := d.bounded(uint64(rangeCount))
	var out []uint32
	var prev uint64
	for i := uint64(0); i < n && d.err == nil; i++ {
		v := d.uvarint()
		if i > 0 {
			v += prev + 1
		}
		if v >= uint64(rangeCount) || (i > 0 && v <= prev) {
			d.fail("range %d out of order or past %d", v, rangeCount)
			return nil
		}
		out = append(out, uint32(v))
		prev = v
	}
	return out
}

func (d *reader) end() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}
