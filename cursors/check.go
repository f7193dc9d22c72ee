package cursors

import (
	"fmt"
)

// Violation is a record of a cursor-stream log that breaks what the
// coordinator promises (CheckLog).
type Violation struct {
	// Index is the record's place in the log given to CheckLog.
	Index  int
	Cursor string
	Reason string
}

func (v Violation) String() string {
	return fmt.Sprintf("record %d (cursor %q): %s", v.Index, v.Cursor, v.Reason)
}

// CheckLog replays one range's log of the cursor stream (in offset order)
// and returns the records that break the coordinator's promises, for
// tests and checkers:
//
//   - every position record raises its register: a commit or reset is
//     above the position held when it was written (a cursor never moves
//     backwards, and nothing is written for a commit that does not raise);
//   - every position a group member committed was owned by that member, in
//     the incarnation its epoch belongs to, when it was written (no commit
//     from an old generation, nor of a range given away);
//   - every group record's epoch is at least the one before it.
//
// Records that do not decode are reported too. Orphan merges and resets
// are position records like the others: they too must raise.
//
// The log must be whole (not compacted by key): compaction drops the
// group records a commit was validated against.
func CheckLog(recs []Record) []Violation {
	s := NewState(Limits{PositionsMax: 1 << 62, GroupsMax: 1 << 62})
	var out []Violation
	for i, r := range recs {
		d, err := Decode(r)
		if err != nil {
			out = append(out, Violation{Index: i, Reason: err.Error()})
			continue
		}
		if v := checkRecord(s, d); v != "" {
			out = append(out, Violation{Index: i, Cursor: d.Cursor + groupName(d), Reason: v})
		}
		_ = s.Apply(r)
	}
	return out
}

func groupName(d Decoded) string {
	if d.Group != nil {
		return d.Group.Name
	}
	return ""
}

// checkRecord judges one record against the state before it.
func checkRecord(s *State, d Decoded) string {
	if g := d.Group; g != nil {
		if held := s.Group(g.Name); held != nil && g.Epoch < held.Epoch {
			return fmt.Sprintf("group epoch went back from %s to %s", EpochString(held.Epoch), EpochString(g.Epoch))
		}
		return ""
	}
	p := *d.Position
	if p.Deleted {
		return ""
	}
	if held, ok := s.Position(d.Cursor, p.Stream, p.Range); ok && !p.after(held) {
		return fmt.Sprintf("%s/%d: (generation %d, offset %d) does not raise the held (%d, %d)", p.Stream, p.Range,
			p.Generation, p.Offset, held.Generation, held.Offset)
	}
	if p.MemberID == "" {
		return ""
	}
	g := s.Group(d.Cursor)
	if g == nil || g.Deleted {
		return fmt.Sprintf("committed by member %q of a group that does not exist", p.MemberID)
	}
	m := g.Member(p.MemberID)
	switch {
	case m == nil:
		return fmt.Sprintf("committed by %q, not a member", p.MemberID)
	case p.MemberEpoch < m.JoinEpoch || p.MemberEpoch > m.Epoch:
		return fmt.Sprintf("committed by %q at epoch %s, outside its incarnation [%s, %s]", p.MemberID,
			EpochString(p.MemberEpoch), EpochString(m.JoinEpoch), EpochString(m.Epoch))
	case p.Stream != g.Stream || !m.Owns(p.Range):
		return fmt.Sprintf("committed by %q for %s/%d, which it does not own", p.MemberID, p.Stream, p.Range)
	}
	return ""
}
