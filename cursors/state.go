package cursors

import (
	"cmp"
	"slices"
	"strings"
)

// Limits bound a State (one range of the cursor stream).
type Limits struct {
	// PositionsMax bounds the positions held, default 4,000,000 (about
	// 100 bytes each in memory): a commit that would add more fails with
	// LIMIT_EXCEEDED.
	PositionsMax int
	// GroupsMax bounds the groups held, default 100,000.
	GroupsMax int
}

func (l Limits) withDefaults() Limits {
	if l.PositionsMax <= 0 {
		l.PositionsMax = 4_000_000
	}
	if l.GroupsMax <= 0 {
		l.GroupsMax = 100_000
	}
	return l
}

// State is the applied state of one range of the cursor stream: every
// cursor's positions and every group, as the range's log says. Apply is
// deterministic, so every replica of the range, in every region, holds the
// same State for the same log prefix. Not safe for concurrent use.
type State struct {
	limits Limits
	// cursors holds each cursor's positions sorted by (stream, range).
	cursors   map[string][]Position
	positions int
	groups    map[string]*Group
	// live are the groups with members (the coordinator's session scan).
	live map[string]*Group
}

// NewState returns an empty state.
func NewState(l Limits) *State {
	return &State{limits: l.withDefaults(), cursors: map[string][]Position{}, groups: map[string]*Group{}, live: map[string]*Group{}}
}

// Apply applies one record of the log. Positions merge as max-registers:
// a record not above the held position changes nothing, which makes
// applying a record again, or a position stranded in an orphan log, a
// no-op at worst. Group records replace the group (the coordinator writes
// each as the whole new state). A record that does not decode changes
// nothing and is returned as an error; limits do not apply (what the log
// holds is the state). Applying a position of a cursor already held
// allocates nothing unless its member id or metadata changed.
func (s *State) Apply(r Record) error {
	if len(r.Key) > 0 && r.Key[0] == kindPosition {
		v, err := decodePositionRecord(r)
		if err != nil {
			return err
		}
		s.applyPosition(&v)
		return nil
	}
	d, err := Decode(r)
	if err != nil {
		return err
	}
	s.setGroup(d.Group)
	return nil
}

// applyPosition merges a decoded position record: a tombstone removes the
// position; else it raises the position if above it.
func (s *State) applyPosition(v *positionRecord) {
	ps := s.cursors[string(v.cursor)]
	i, found := findPositionBytes(ps, v.stream, v.p.Range)
	if v.p.Deleted {
		if found {
			s.removeAt(string(v.cursor), ps, i)
		}
		return
	}
	if found {
		if v.p.after(ps[i]) {
			ps[i] = v.position(ps[i])
		}
		return
	}
	// A new position: its stream's name is shared with a neighbour's on
	// the same stream, if any.
	p := v.position(Position{})
	for _, j := range []int{i - 1, i} {
		if j >= 0 && j < len(ps) && string(v.stream) == ps[j].Stream {
			p.Stream = ps[j].Stream
		}
	}
	if p.Stream == "" {
		p.Stream = string(v.stream)
	}
	s.cursors[string(v.cursor)] = slices.Insert(ps, i, p)
	s.positions++
}

// position is the record's position, replacing old: the strings and
// metadata of old are kept where equal (they are never changed in place).
func (v *positionRecord) position(old Position) Position {
	p := v.p
	p.Stream = old.Stream
	p.MemberID = old.MemberID
	if string(v.memberID) != old.MemberID {
		p.MemberID = string(v.memberID)
	}
	switch {
	case len(v.metadata) == 0:
		p.Metadata = nil
	case string(v.metadata) == string(old.Metadata):
		p.Metadata = old.Metadata
	default:
		p.Metadata = slices.Clone(v.metadata)
	}
	return p
}

// removePosition drops cursor's position in (stream, rng), if held.
func (s *State) removePosition(cursor, stream string, rng uint32) {
	ps := s.cursors[cursor]
	if i, found := findPosition(ps, stream, rng); found {
		s.removeAt(cursor, ps, i)
	}
}

// removeAt drops the position at i of cursor's positions ps.
func (s *State) removeAt(cursor string, ps []Position, i int) {
	ps = slices.Delete(ps, i, i+1)
	s.positions--
	if len(ps) == 0 {
		delete(s.cursors, cursor)
	} else {
		s.cursors[cursor] = ps
	}
}

func (s *State) setGroup(g *Group) {
	s.groups[g.Name] = g
	if g.Live() {
		s.live[g.Name] = g
	} else {
		delete(s.live, g.Name)
	}
}

// findPosition finds (stream, rng) in ps, sorted by (stream, range).
func findPosition(ps []Position, stream string, rng uint32) (int, bool) {
	lo, hi := 0, len(ps)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if comparePosition(stream, rng, &ps[m]) > 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(ps) && comparePosition(stream, rng, &ps[lo]) == 0
}

// findPositionBytes is findPosition for a stream name in bytes.
func findPositionBytes(ps []Position, stream []byte, rng uint32) (int, bool) {
	lo, hi := 0, len(ps)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if comparePositionBytes(stream, rng, &ps[m]) > 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(ps) && comparePositionBytes(stream, rng, &ps[lo]) == 0
}

// comparePosition orders (stream, rng) against p by stream, then range.
func comparePosition(stream string, rng uint32, p *Position) int {
	if stream != p.Stream {
		return strings.Compare(stream, p.Stream)
	}
	return cmp.Compare(rng, p.Range)
}

// comparePositionBytes is comparePosition for a stream name in bytes
// (the conversions in comparisons allocate nothing).
func comparePositionBytes(stream []byte, rng uint32, p *Position) int {
	switch {
	case string(stream) < p.Stream:
		return -1
	case string(stream) > p.Stream:
		return 1
	}
	return cmp.Compare(rng, p.Range)
}

// Position returns cursor's position in (stream, rng).
func (s *State) Position(cursor, stream string, rng uint32) (Position, bool) {
	ps := s.cursors[cursor]
	if i, ok := findPosition(ps, stream, rng); ok {
		return ps[i], true
	}
	return Position{}, false
}

// Positions returns a copy of cursor's positions, sorted by stream and
// range; on one stream only if stream is set.
func (s *State) Positions(cursor, stream string) []Position {
	var out []Position
	for _, p := range s.cursors[cursor] {
		if stream == "" || p.Stream == stream {
			out = append(out, p)
		}
	}
	return out
}

// Group returns the named group (deleted ones included), or nil. The
// caller must not modify it.
func (s *State) Group(name string) *Group { return s.groups[name] }

// Groups returns the names of the groups that are not deleted, sorted.
func (s *State) Groups() []string {
	var out []string
	for name, g := range s.groups {
		if !g.Deleted {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// LiveGroups returns the names of the groups with members, sorted.
func (s *State) LiveGroups() []string {
	out := make([]string, 0, len(s.live))
	for name := range s.live {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Counts returns how many positions and groups the state holds.
func (s *State) Counts() (positions, groups int) { return s.positions, len(s.groups) }
