package cursors

import (
	"slices"
	"sort"
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
// holds is the state).
func (s *State) Apply(r Record) error {
	d, err := Decode(r)
	if err != nil {
		return err
	}
	if d.Position != nil && d.Position.Deleted {
		s.removePosition(d.Cursor, d.Position.Stream, d.Position.Range)
		return nil
	}
	if d.Position != nil {
		s.mergePosition(d.Cursor, *d.Position)
		return nil
	}
	s.setGroup(d.Group)
	return nil
}

// mergePosition raises cursor's position to p if p is above it.
func (s *State) mergePosition(cursor string, p Position) bool {
	ps := s.cursors[cursor]
	i, found := findPosition(ps, p.Stream, p.Range)
	if found {
		if !p.after(ps[i]) {
			return false
		}
		ps[i] = p
		return true
	}
	s.cursors[cursor] = slices.Insert(ps, i, p)
	s.positions++
	return true
}

// removePosition drops cursor's position in (stream, rng), if held.
func (s *State) removePosition(cursor, stream string, rng uint32) {
	ps := s.cursors[cursor]
	i, found := findPosition(ps, stream, rng)
	if !found {
		return
	}
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
	return sort.Find(len(ps), func(i int) int {
		if c := strings.Compare(stream, ps[i].Stream); c != 0 {
			return c
		}
		switch {
		case rng < ps[i].Range:
			return -1
		case rng > ps[i].Range:
			return 1
		}
		return 0
	})
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
