package authz

import (
	"fmt"
	"strings"
)

// Permission is one right on a resource.
type Permission uint8

// The permissions. Admin on a stream does not imply the others: a rule
// names each right it grants.
const (
	Produce  Permission = iota + 1 // append to a stream
	Consume                        // read and subscribe to a stream
	Describe                       // see a stream's spec, replicas, groups
	Admin                          // create, rehome, change replicas, orphans
	Group                          // join, commit, reset, delete a group or cursor
)

var permNames = [...]string{Produce: "produce", Consume: "consume", Describe: "describe", Admin: "admin", Group: "group"}

func (p Permission) String() string {
	if int(p) < len(permNames) && permNames[p] != "" {
		return permNames[p]
	}
	return fmt.Sprintf("permission(%d)", uint8(p))
}

// ParsePermission reads a permission's name.
func ParsePermission(s string) (Permission, error) {
	for p, n := range permNames {
		if n != "" && strings.EqualFold(s, n) {
			return Permission(p), nil
		}
	}
	return 0, fmt.Errorf("unknown permission %q (want produce, consume, describe, admin or group)", s)
}

// Set is a set of permissions.
type Set uint8

// Of returns the set of perms.
func Of(perms ...Permission) Set {
	var s Set
	for _, p := range perms {
		s |= 1 << p
	}
	return s
}

// Has reports whether p is in s.
func (s Set) Has(p Permission) bool { return s&(1<<p) != 0 }

// Match reports whether pattern matches name: "*" matches every name, a
// pattern ending in "*" every name with the prefix before it, any other
// pattern only itself.
func Match(pattern, name string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return pattern == name
}

// PatternBytesMax bounds a pattern.
const PatternBytesMax = 256

// ValidatePattern checks a pattern: 1 to PatternBytesMax printable ASCII
// characters other than space, "*" only at its end.
func ValidatePattern(pattern string) error {
	switch {
	case pattern == "":
		return fmt.Errorf("empty pattern")
	case len(pattern) > PatternBytesMax:
		return fmt.Errorf("pattern of %d bytes (at most %d)", len(pattern), PatternBytesMax)
	case strings.Contains(strings.TrimSuffix(pattern, "*"), "*"):
		return fmt.Errorf("pattern %q: '*' is allowed only at the end", pattern)
	}
	for i := 0; i < len(pattern); i++ {
		if c := pattern[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("pattern %q: byte %#x at %d (printable ASCII other than space only)", pattern, c, i)
		}
	}
	return nil
}

// Rule grants Perms on the resources Resource matches to the principals
// Principal matches.
type Rule struct {
	Principal string
	Resource  string
	Perms     Set
}

// Validate checks a rule's patterns and that it grants something.
func (r Rule) Validate() error {
	if err := ValidatePattern(r.Principal); err != nil {
		return fmt.Errorf("principal: %w", err)
	}
	if err := ValidatePattern(r.Resource); err != nil {
		return fmt.Errorf("resource: %w", err)
	}
	if r.Perms == 0 {
		return fmt.Errorf("a rule must grant at least one permission")
	}
	return r.Perms.valid()
}

// Allows reports whether the rule grants perm on resource to principal.
func (r Rule) Allows(principal string, perm Permission, resource string) bool {
	return r.Perms.Has(perm) && Match(r.Principal, principal) && Match(r.Resource, resource)
}

// Policy is the rules a node decides by: superusers (patterns) hold every
// permission on every resource; anyone else holds what a rule grants.
// Rules only grant: there is no deny rule, so their order is irrelevant.
type Policy struct {
	Superusers []string
	Rules      []Rule

	// Set by Index: the rules whose principal is an exact name, by name,
	// and the others.
	exact     map[string][]Rule
	patterned []Rule
}

// Index prepares p for many decisions: a decision then reads the rules of
// the principal's exact name and the rules with a principal pattern only,
// instead of every rule. p must not change afterwards. It returns p.
func (p *Policy) Index() *Policy {
	p.exact, p.patterned = map[string][]Rule{}, nil
	for _, r := range p.Rules {
		if strings.HasSuffix(r.Principal, "*") {
			p.patterned = append(p.patterned, r)
		} else {
			p.exact[r.Principal] = append(p.exact[r.Principal], r)
		}
	}
	return p
}

// Allows reports whether principal holds perm on resource. The empty
// principal (no identity) holds nothing.
func (p *Policy) Allows(principal string, perm Permission, resource string) bool {
	if principal == "" {
		return false
	}
	for _, s := range p.Superusers {
		if Match(s, principal) {
			return true
		}
	}
	rules := p.Rules
	if p.exact != nil {
		for _, r := range p.exact[principal] {
			if r.Allows(principal, perm, resource) {
				return true
			}
		}
		rules = p.patterned
	}
	for _, r := range rules {
		if r.Allows(principal, perm, resource) {
			return true
		}
	}
	return false
}
