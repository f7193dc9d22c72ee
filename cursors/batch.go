package cursors

import (
	"slices"
	"strings"
	"time"
)

// CommitPositionsMax bounds the positions of one commit.
const CommitPositionsMax = 4096

// epochShift places the homing epoch of the cursor range in the high bits
// of group epochs: 2^40 epochs per homing epoch, 2^24 homing epochs.
const epochShift = 40

// Batch is a set of changes validated against a State and not yet in the
// log: the coordinator opens one per proposal, runs requests through it in
// order (each sees the changes of those before it), proposes Records, and
// throws the batch away; the State learns the changes when it applies the
// committed records. A request that fails changes nothing.
type Batch struct {
	s            *State
	nowUnixNanos int64
	// epochFloor is the lowest group epoch this coordinator may issue:
	// its homing epoch in the high bits.
	epochFloor uint64
	positions  map[posKey]Position
	groups     map[string]*Group
	// order is the records to write, in the order they were staged: a key
	// changed again after another key was staged gets a second record
	// (the first frozen at the value it had), so that in the log every
	// record follows every value it was validated against.
	order        []stagedKey
	newPositions int
	newGroups    int
}

type posKey struct {
	cursor, stream string
	rng            uint32
}

// stagedKey is one staged record: a position (group == "") or a group;
// frozen, if set, is its value as of when another record was staged after
// it.
type stagedKey struct {
	pos    posKey
	group  string
	frozen *Record
}

// restage makes k the last record of the batch: if k's live record is the
// last one, it stays (its value changes in place); else that record is
// frozen at its current value (encode) and a new live one is appended.
func (b *Batch) restage(k stagedKey, encode func() Record) {
	for i := len(b.order) - 1; i >= 0; i-- {
		o := &b.order[i]
		if o.frozen != nil || o.group != k.group || o.pos != k.pos {
			continue
		}
		if i == len(b.order)-1 {
			return
		}
		r := encode()
		o.frozen = &r
		break
	}
	b.order = append(b.order, k)
}

// Begin opens a batch at now, for a coordinator whose cursor range is
// homed at homingEpoch (1 when homing is off).
func (s *State) Begin(now time.Time, homingEpoch uint64) *Batch {
	return s.BeginReusing(nil, now, homingEpoch)
}

// batchReusePositionsMax is the most positions a dropped batch may have
// staged for BeginReusing to keep its memory: a bigger one's map is let go
// (a cleared map keeps its capacity, and a burst must not pin it).
const batchReusePositionsMax = 8192

// BeginReusing is Begin, taking the memory of old, a batch the caller has
// dropped (nil: none): its maps, cleared, and its order slice. The new
// batch starts empty, exactly as one from Begin; old must not be used
// again. A coordinator opens a batch per run of proposals, and growing its
// maps from nothing each time was the largest allocation of the commit
// path.
func (s *State) BeginReusing(old *Batch, now time.Time, homingEpoch uint64) *Batch {
	b := &Batch{s: s, nowUnixNanos: now.UnixNano(), epochFloor: homingEpoch << epochShift}
	if old != nil && len(old.positions) <= batchReusePositionsMax && len(old.groups) <= batchReusePositionsMax {
		clear(old.positions)
		clear(old.groups)
		clear(old.order[:cap(old.order)])
		b.positions, b.groups, b.order = old.positions, old.groups, old.order[:0]
		*old = Batch{}
	} else {
		b.positions, b.groups = map[posKey]Position{}, map[string]*Group{}
	}
	return b
}

// Now is the batch's time.
func (b *Batch) Now() time.Time { return time.Unix(0, b.nowUnixNanos) }

// SetNow moves the batch's time (a batch kept across proposals, see Cut);
// time never goes back.
func (b *Batch) SetNow(now time.Time) { b.nowUnixNanos = max(b.nowUnixNanos, now.UnixNano()) }

// recordsBufferBytes is the size of the buffers Records encodes positions
// into.
const recordsBufferBytes = 32 << 10

// Records returns the records the batch writes, in the order they were
// staged (see Batch.order): at least one per key it changed, the last with
// the key's final value.
func (b *Batch) Records() []Record {
	out, _ := b.AppendRecords(make([]Record, 0, len(b.order)), nil)
	return out
}

// AppendRecords appends the records Records returns to out and returns
// it, with buf: the positions' keys and values are encoded into buf while
// it has room (its contents from len(buf) on are overwritten), else into
// new buffers of about recordsBufferBytes, and the last of those is
// returned. A caller that reuses out and buf for its next call must be done
// with the records of this one: they are views of buf.
func (b *Batch) AppendRecords(out []Record, buf []byte) ([]Record, []byte) {
	for _, k := range b.order {
		if k.frozen != nil {
			out = append(out, *k.frozen)
			continue
		}
		if k.group != "" {
			out = append(out, EncodeGroup(b.groups[k.group]))
			continue
		}
		p := b.positions[k.pos]
		if size := positionRecordSize(k.pos.cursor, p); cap(buf)-len(buf) < size {
			buf = make([]byte, 0, max(size, recordsBufferBytes))
		}
		var r Record
		buf, r = appendPosition(buf, k.pos.cursor, p)
		out = append(out, r)
	}
	return out, buf
}

// Empty reports whether the batch changed nothing (since the last Cut).
func (b *Batch) Empty() bool { return len(b.order) == 0 }

// Len is the number of records the batch writes (since the last Cut).
func (b *Batch) Len() int { return len(b.order) }

// Cut returns the records staged since the last Cut (as Records does) and
// starts a new set, while the batch keeps every change as its view: a
// coordinator with several proposals in flight keeps one batch for all of
// them, cutting one proposal's records at a time, so that each request is
// validated against the changes of every proposal before it, committed or
// not. It drops the batch once none is in flight (the State then has them
// all).
func (b *Batch) Cut() []Record {
	out := b.Records()
	b.clearOrder()
	return out
}

// CutAppend is Cut through AppendRecords: the records are appended to out
// and encoded into buf (see AppendRecords for who owns what).
func (b *Batch) CutAppend(out []Record, buf []byte) ([]Record, []byte) {
	out, buf = b.AppendRecords(out, buf)
	b.clearOrder()
	return out, buf
}

// clearOrder starts a new set of staged records, keeping the slice.
func (b *Batch) clearOrder() {
	clear(b.order)
	b.order = b.order[:0]
}

// Positions returns a cursor's positions as the batch sees them, sorted by
// stream and range; on one stream only if stream is set.
func (b *Batch) Positions(cursor, stream string) []Position {
	var out []Position
	for _, p := range b.cursorPositions(cursor) {
		if stream == "" || p.Stream == stream {
			out = append(out, p)
		}
	}
	return out
}

// Group returns a group as the batch sees it, or nil. The caller must not
// modify it.
func (b *Batch) Group(name string) *Group { return b.group(name) }

// position returns the position as the batch sees it.
func (b *Batch) position(cursor, stream string, rng uint32) (Position, bool) {
	if p, ok := b.positions[posKey{cursor, stream, rng}]; ok {
		return p, !p.Deleted
	}
	return b.s.Position(cursor, stream, rng)
}

func (b *Batch) stagePosition(cursor string, p Position) {
	k := posKey{cursor, p.Stream, p.Range}
	staged, inBatch := b.positions[k]
	_, held := b.position(cursor, p.Stream, p.Range)
	b.stage(k, p, held, inBatch, staged)
}

// stage stages position p of key k, which the batch sees held or not;
// inBatch tells whether the batch staged k already (as staged).
func (b *Batch) stage(k posKey, p Position, held, inBatch bool, staged Position) {
	switch {
	case !held && !p.Deleted:
		b.newPositions++
	case held && p.Deleted:
		b.newPositions--
	}
	if inBatch {
		b.restage(stagedKey{pos: k}, func() Record { return EncodePosition(k.cursor, staged) })
	} else {
		b.order = append(b.order, stagedKey{pos: k})
	}
	b.positions[k] = p
}

// group returns the group as the batch sees it (nil if none). The caller
// must not modify it: see mutGroup.
func (b *Batch) group(name string) *Group {
	if g, ok := b.groups[name]; ok {
		return g
	}
	return b.s.Group(name)
}

// mutGroup returns the batch's own copy of a group to change, staging it.
func (b *Batch) mutGroup(name string) *Group {
	if g, ok := b.groups[name]; ok {
		b.restage(stagedKey{group: name}, func() Record { return EncodeGroup(g) })
		return g
	}
	var g *Group
	if held := b.s.Group(name); held != nil {
		g = held.clone()
	} else {
		g = &Group{Name: name}
		b.newGroups++
	}
	b.groups[name] = g
	b.order = append(b.order, stagedKey{group: name})
	return g
}

// nextEpoch is the group epoch after cur.
func (b *Batch) nextEpoch(cur uint64) uint64 { return max(cur+1, b.epochFloor) }

// CommitRequest raises positions of one cursor.
type CommitRequest struct {
	Cursor string
	// MemberID and MemberEpoch identify the committing group member; empty
	// for a cursor without members.
	MemberID    string
	MemberEpoch uint64
	// Positions to commit: Stream, Range, Generation, Offset, Epoch and
	// Metadata are taken; the rest is set by the batch.
	Positions []Position
}

// CommitResult is one position's outcome: the position held after the
// commit, and whether the commit raised it.
type CommitResult struct {
	Position Position
	Applied  bool
}

// Commit raises a cursor's positions (doc.go, "Commits"). Fencing and
// generation errors fail the whole request; a position not above the held
// one is no error (Applied false).
func (b *Batch) Commit(req CommitRequest) ([]CommitResult, error) {
	if err := b.checkCommit(req); err != nil {
		return nil, err
	}
	out := make([]CommitResult, len(req.Positions))
	for i, p := range req.Positions {
		k := posKey{req.Cursor, p.Stream, p.Range}
		staged, inBatch := b.positions[k]
		cur, held := staged, inBatch && !staged.Deleted
		if !inBatch {
			cur, held = b.s.Position(req.Cursor, p.Stream, p.Range)
		}
		p.CommitTimeUnixNanos = b.nowUnixNanos
		p.MemberID, p.MemberEpoch, p.Deleted = req.MemberID, req.MemberEpoch, false
		if held && !p.after(cur) {
			out[i] = CommitResult{Position: cur}
			continue
		}
		b.stage(k, p, held, inBatch, staged)
		out[i] = CommitResult{Position: p, Applied: true}
	}
	return out, nil
}

// Merge raises a cursor's positions from records a failover stranded in
// an orphan log (doc.go, "Commits"): each position above the held one
// (by generation, then offset) is staged, as a commit by no member; the
// others, deleted ones and older generations included, are skipped. No
// fencing: a position is a max-register, so merging one back can only
// raise the cursor to where it had been acknowledged.
func (b *Batch) Merge(cursor string, ps []Position) ([]CommitResult, error) {
	if err := checkName("cursor", cursor, false); err != nil {
		return nil, err
	}
	if len(ps) == 0 || len(ps) > CommitPositionsMax {
		return nil, errInvalid("a merge carries %d positions: at least 1, at most %d", len(ps), CommitPositionsMax)
	}
	out := make([]CommitResult, len(ps))
	for i, p := range ps {
		cur, held := b.position(cursor, p.Stream, p.Range)
		if p.Deleted || checkStream(p.Stream) != nil || p.Range >= RangesMax || len(p.Metadata) > MetadataBytesMax ||
			(held && !p.after(cur)) || (!held && b.s.positions+b.newPositions >= b.s.limits.PositionsMax) {
			out[i] = CommitResult{Position: cur}
			continue
		}
		p.MemberID, p.MemberEpoch, p.CommitTimeUnixNanos = "", 0, b.nowUnixNanos
		b.stagePosition(cursor, p)
		out[i] = CommitResult{Position: p, Applied: true}
	}
	return out, nil
}

// checkCommit validates a commit against the batch without changing it.
func (b *Batch) checkCommit(req CommitRequest) error {
	if err := checkName("cursor", req.Cursor, false); err != nil {
		return err
	}
	if err := checkName("member id", req.MemberID, true); err != nil {
		return err
	}
	if len(req.Positions) == 0 || len(req.Positions) > CommitPositionsMax {
		return errInvalid("a commit carries %d positions: at least 1, at most %d", len(req.Positions), CommitPositionsMax)
	}
	g := b.group(req.Cursor)
	var m *Member
	if req.MemberID != "" {
		var err error
		if m, err = checkMember(g, req.Cursor, req.MemberID, req.MemberEpoch); err != nil {
			return err
		}
	} else if g != nil && g.Live() {
		return errGroupNotEmpty(req.Cursor, len(g.Members))
	}
	fresh := 0
	for _, p := range req.Positions {
		if err := checkStream(p.Stream); err != nil {
			return err
		}
		if p.Range >= RangesMax {
			return errInvalid("range %d: at most %d ranges", p.Range, RangesMax)
		}
		if len(p.Metadata) > MetadataBytesMax {
			return errInvalid("metadata of %d bytes, over the maximum of %d", len(p.Metadata), MetadataBytesMax)
		}
		if m != nil && (p.Stream != g.Stream || !m.Owns(p.Range)) {
			return errNotAssigned(req.Cursor, req.MemberID, p.Stream, p.Range)
		}
		cur, held := b.position(req.Cursor, p.Stream, p.Range)
		if held && p.Generation < cur.Generation {
			return errStaleGeneration(req.Cursor, p.Stream, p.Range, p.Generation, cur.Generation)
		}
		if !held {
			fresh++
		}
	}
	if b.s.positions+b.newPositions+fresh > b.s.limits.PositionsMax {
		return errLimit("this cursor range holds %d positions, at most %d", b.s.positions+b.newPositions, b.s.limits.PositionsMax)
	}
	return nil
}

// checkMember returns the member a request names if it is a member of g
// in the incarnation epoch belongs to: at or after its join, not past its
// current epoch.
func checkMember(g *Group, group, member string, epoch uint64) (*Member, error) {
	if g == nil || g.Deleted {
		return nil, errUnknownMember(group, member)
	}
	m := g.Member(member)
	if m == nil {
		return nil, errUnknownMember(group, member)
	}
	if epoch < m.JoinEpoch || epoch > m.Epoch {
		return nil, errStaleMemberEpoch(group, member, epoch, m.Epoch)
	}
	return m, nil
}

// Reset moves a cursor's positions on a stream to targets (Range and
// Offset of each), in a new generation: one above the highest the cursor
// holds on the stream. Refused while the group has members.
func (b *Batch) Reset(cursor, stream string, targets []Position) ([]Position, error) {
	if err := checkName("cursor", cursor, false); err != nil {
		return nil, err
	}
	if err := checkStream(stream); err != nil {
		return nil, err
	}
	if len(targets) == 0 || len(targets) > RangesMax {
		return nil, errInvalid("a reset names %d ranges: at least 1, at most %d", len(targets), RangesMax)
	}
	if g := b.group(cursor); g != nil && g.Live() {
		return nil, errGroupNotEmpty(cursor, len(g.Members))
	}
	seen := map[uint32]bool{}
	for _, t := range targets {
		if t.Range >= RangesMax || seen[t.Range] {
			return nil, errInvalid("range %d named twice or out of bounds", t.Range)
		}
		seen[t.Range] = true
	}
	gen := uint64(0)
	for _, p := range b.cursorPositions(cursor) {
		if p.Stream == stream {
			gen = max(gen, p.Generation)
		}
	}
	out := make([]Position, 0, len(targets))
	for _, t := range targets {
		p := Position{Stream: stream, Range: t.Range, Generation: gen + 1, Offset: t.Offset, CommitTimeUnixNanos: b.nowUnixNanos}
		b.stagePosition(cursor, p)
		out = append(out, p)
	}
	return out, nil
}

// cursorPositions returns every position of a cursor as the batch sees
// it, sorted by stream and range.
func (b *Batch) cursorPositions(cursor string) []Position {
	var out []Position
	for _, p := range b.s.cursors[cursor] {
		if staged, ok := b.positions[posKey{cursor, p.Stream, p.Range}]; ok {
			p = staged
		}
		if !p.Deleted {
			out = append(out, p)
		}
	}
	for k, p := range b.positions {
		if _, held := b.s.Position(cursor, k.stream, k.rng); k.cursor == cursor && !held && !p.Deleted {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(x, y Position) int {
		if c := strings.Compare(x.Stream, y.Stream); c != 0 {
			return c
		}
		return int(x.Range) - int(y.Range)
	})
	return out
}

// Delete removes a group or cursor and its positions (each gets a
// tombstone; the group record, if any, is rewritten deleted, keeping
// its epoch). It returns how many positions it removed. Refused while the
// group has members. A commit arriving after the delete creates the
// cursor anew (doc.go, "Deletes").
func (b *Batch) Delete(name string) (int, error) {
	if err := checkName("group", name, false); err != nil {
		return 0, err
	}
	g := b.group(name)
	if g != nil && g.Live() {
		return 0, errGroupNotEmpty(name, len(g.Members))
	}
	ps := b.cursorPositions(name)
	for _, p := range ps {
		b.stagePosition(name, Position{Stream: p.Stream, Range: p.Range, Generation: p.Generation,
			CommitTimeUnixNanos: b.nowUnixNanos, Deleted: true})
	}
	deleted := len(ps)
	if g != nil && !g.Deleted {
		mg := b.mutGroup(name)
		mg.Deleted, mg.Members = true, nil
	} else if deleted == 0 {
		return 0, apiNotFound(name)
	}
	return deleted, nil
}
