package authz

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Bounds on the access rules a cluster keeps (docs/authz.md).
const (
	// RulesMax bounds the rules in force: a PutAcl that would add one more
	// is refused. Each is at most two patterns of PatternBytesMax.
	RulesMax = 1024
	// TombstonesMax bounds the removed rules a RuleSet remembers (so that
	// a removal that overtakes the rule's creation on its way to another
	// region still wins there); past it the oldest is forgotten.
	TombstonesMax = 1024
)

// Version orders the changes of one rule, in every region alike: the
// wall-clock time the change was made at, then the region that took it,
// then a random nonce. The change with the greater version wins
// (last writer wins), whatever order regions apply changes in.
type Version struct {
	UnixNanos int64  `json:"unix_nanos"`
	Region    string `json:"region"`
	Nonce     uint64 `json:"nonce"`
}

// Compare orders versions: -1 if v is older than o, 0 if equal, +1.
func (v Version) Compare(o Version) int {
	if c := cmp.Compare(v.UnixNanos, o.UnixNanos); c != 0 {
		return c
	}
	if c := cmp.Compare(v.Region, o.Region); c != 0 {
		return c
	}
	return cmp.Compare(v.Nonce, o.Nonce)
}

// Change is one change of the rule for a (principal, resource) pair: it
// sets its permissions, or with Perms 0 removes it.
type Change struct {
	Rule    Rule
	Version Version
}

// Removed reports whether the change removes its rule.
func (c Change) Removed() bool { return c.Rule.Perms == 0 }

type ruleKey struct{ principal, resource string }

// RuleSet is the rules in force, one per (principal, resource) pair,
// built from changes applied in any order (a last-writer-wins map: two
// sets that applied the same changes hold the same rules). It remembers
// removals as tombstones, up to TombstonesMax. Not safe for concurrent
// use.
type RuleSet struct {
	entries map[ruleKey]Change
	removed int
}

// Apply applies c, and reports whether it changed the rules in force or
// the versions remembered (false: an older or equal change, ignored).
func (s *RuleSet) Apply(c Change) bool {
	if s.entries == nil {
		s.entries = map[ruleKey]Change{}
	}
	k := ruleKey{c.Rule.Principal, c.Rule.Resource}
	old, ok := s.entries[k]
	if ok && c.Version.Compare(old.Version) <= 0 {
		return false
	}
	if ok && old.Removed() {
		s.removed--
	}
	s.entries[k] = c
	if c.Removed() {
		s.removed++
		s.forgetOldTombstones()
	}
	return true
}

// forgetOldTombstones drops the oldest removals past TombstonesMax.
func (s *RuleSet) forgetOldTombstones() {
	for s.removed > TombstonesMax {
		var oldest ruleKey
		var found *Change
		for k, c := range s.entries {
			if c.Removed() && (found == nil || c.Version.Compare(found.Version) < 0) {
				oldest, found = k, &c
			}
		}
		delete(s.entries, oldest)
		s.removed--
	}
}

// Len is the count of rules in force.
func (s *RuleSet) Len() int { return len(s.entries) - s.removed }

// Get returns the change in force for the pair, if any (removals too).
func (s *RuleSet) Get(principal, resource string) (Change, bool) {
	c, ok := s.entries[ruleKey{principal, resource}]
	return c, ok
}

// Rules returns the rules in force, sorted by resource then principal;
// the caller owns the slice.
func (s *RuleSet) Rules() []Change {
	out := make([]Change, 0, s.Len())
	for _, c := range s.entries {
		if !c.Removed() {
			out = append(out, c)
		}
	}
	sortChanges(out)
	return out
}

// Changes returns every change remembered, removals too, sorted as Rules
// (what a node saves and loads again).
func (s *RuleSet) Changes() []Change {
	out := make([]Change, 0, len(s.entries))
	for _, c := range s.entries {
		out = append(out, c)
	}
	sortChanges(out)
	return out
}

func sortChanges(cs []Change) {
	slices.SortFunc(cs, func(a, b Change) int {
		if c := cmp.Compare(a.Rule.Resource, b.Rule.Resource); c != 0 {
			return c
		}
		return cmp.Compare(a.Rule.Principal, b.Rule.Principal)
	})
}

// Policy is superusers and the rules in force.
func (s *RuleSet) Policy(superusers []string) *Policy {
	p := &Policy{Superusers: superusers}
	for _, c := range s.Rules() {
		p.Rules = append(p.Rules, c.Rule)
	}
	return p
}

// Perms lists the permissions of s in their order.
func (s Set) Perms() []Permission {
	var out []Permission
	for p := Produce; p <= Group; p++ {
		if s.Has(p) {
			out = append(out, p)
		}
	}
	return out
}

// valid reports whether s holds only known permissions.
func (s Set) valid() error {
	if s&^Of(Produce, Consume, Describe, Admin, Group) != 0 {
		return fmt.Errorf("unknown permission bits %#x", uint8(s))
	}
	return nil
}

// String names the permissions of s, comma-separated ("" for none).
func (s Set) String() string {
	var names []string
	for _, p := range s.Perms() {
		names = append(names, p.String())
	}
	return strings.Join(names, ",")
}

// ParseSet reads permission names, comma-separated.
func ParseSet(list string) (Set, error) {
	var s Set
	for _, name := range strings.Split(list, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		p, err := ParsePermission(name)
		if err != nil {
			return 0, err
		}
		s |= Of(p)
	}
	return s, nil
}
