package authz

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestRuleSetConvergesInAnyOrder: two sets that apply the same changes in
// different orders (as two regions may) hold the same rules, and they are
// those of a model that keeps, per pair, the change of greatest version.
func TestRuleSetConvergesInAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		var changes []Change
		for i := range 30 {
			c := Change{
				Rule:    Rule{Principal: []string{"alice", "bob", "jwt:carol"}[r.IntN(3)], Resource: []string{"orders", "chat.*", "*"}[r.IntN(3)]},
				Version: Version{UnixNanos: int64(r.IntN(10)), Region: []string{"us", "eu"}[r.IntN(2)], Nonce: uint64(i)},
			}
			if r.IntN(3) > 0 {
				c.Rule.Perms = Set(r.IntN(31)+1) << 1
			}
			changes = append(changes, c)
		}
		model := map[ruleKey]Change{}
		for _, c := range changes {
			k := ruleKey{c.Rule.Principal, c.Rule.Resource}
			if old, ok := model[k]; !ok || c.Version.Compare(old.Version) > 0 {
				model[k] = c
			}
		}
		var want []Change
		for _, c := range model {
			if !c.Removed() {
				want = append(want, c)
			}
		}
		sortChanges(want)
		var a, b RuleSet
		for _, c := range changes {
			a.Apply(c)
		}
		shuffled := slices.Clone(changes)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		for _, c := range shuffled {
			b.Apply(c)
			b.Apply(c) // applying a change twice changes nothing
		}
		if !slices.Equal(a.Rules(), want) || !slices.Equal(b.Rules(), want) {
			t.Fatalf("round %d: in order %v, shuffled %v, model %v", round, a.Rules(), b.Rules(), want)
		}
		if a.Len() != len(want) {
			t.Fatalf("round %d: Len %d, %d rules", round, a.Len(), len(want))
		}
	}
}

// TestRuleSetRemovalOvertakesCreation: a removal applied before the older
// creation it removes (it overtook it on its way) still wins.
func TestRuleSetRemovalOvertakesCreation(t *testing.T) {
	var s RuleSet
	rule := Rule{Principal: "alice", Resource: "orders", Perms: Of(Produce)}
	s.Apply(Change{Rule: Rule{Principal: "alice", Resource: "orders"}, Version: Version{UnixNanos: 2, Region: "eu"}})
	if s.Apply(Change{Rule: rule, Version: Version{UnixNanos: 1, Region: "us"}}) {
		t.Fatal("an older creation applied over a newer removal")
	}
	if s.Policy(nil).Allows("alice", Produce, "orders") {
		t.Fatal("the removed rule grants")
	}
	if !s.Apply(Change{Rule: rule, Version: Version{UnixNanos: 3, Region: "us"}}) || !s.Policy(nil).Allows("alice", Produce, "orders") {
		t.Fatal("a newer creation after the removal does not grant")
	}
}

// TestRuleSetForgetsOldestTombstones: removals are remembered up to
// TombstonesMax, the oldest forgotten first; rules in force are kept.
func TestRuleSetForgetsOldestTombstones(t *testing.T) {
	var s RuleSet
	s.Apply(Change{Rule: Rule{Principal: "kept", Resource: "x", Perms: Of(Consume)}, Version: Version{UnixNanos: 0}})
	for i := range TombstonesMax + 10 {
		s.Apply(Change{Rule: Rule{Principal: "p" + strings.Repeat("x", i%7), Resource: string(rune('a'+i%26)) + strings.Repeat("y", i/26)},
			Version: Version{UnixNanos: int64(i + 1)}})
	}
	if got := len(s.Changes()) - s.Len(); got != TombstonesMax {
		t.Fatalf("%d tombstones remembered, want %d", got, TombstonesMax)
	}
	if s.Len() != 1 || !s.Policy(nil).Allows("kept", Consume, "x") {
		t.Fatalf("the rule in force was lost: %v", s.Rules())
	}
	// The newest removal is remembered: an older creation of it loses.
	last := TombstonesMax + 9
	pair := Rule{Principal: "p" + strings.Repeat("x", last%7), Resource: string(rune('a'+last%26)) + strings.Repeat("y", last/26), Perms: Of(Admin)}
	if s.Apply(Change{Rule: pair, Version: Version{UnixNanos: 1}}) {
		t.Fatal("the newest tombstone was forgotten")
	}
}

func TestValidateRule(t *testing.T) {
	ok := Rule{Principal: "jwt:ci-*", Resource: "chat.*", Perms: Of(Produce, Group)}
	if err := ok.Validate(); err != nil {
		t.Fatalf("%+v: %v", ok, err)
	}
	for _, bad := range []Rule{
		{Principal: "", Resource: "x", Perms: Of(Produce)},
		{Principal: "a", Resource: "", Perms: Of(Produce)},
		{Principal: "a*b", Resource: "x", Perms: Of(Produce)},
		{Principal: "a", Resource: "*x*", Perms: Of(Produce)},
		{Principal: "a b", Resource: "x", Perms: Of(Produce)},
		{Principal: "a", Resource: "x\n", Perms: Of(Produce)},
		{Principal: "a", Resource: "é", Perms: Of(Produce)},
		{Principal: strings.Repeat("a", PatternBytesMax+1), Resource: "x", Perms: Of(Produce)},
		{Principal: "a", Resource: "x"},
		{Principal: "a", Resource: "x", Perms: 1},   // bit 0 is no permission
		{Principal: "a", Resource: "x", Perms: 128}, // nor bit 7
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

func TestParseSet(t *testing.T) {
	s, err := ParseSet("produce, Consume,group")
	if err != nil || s != Of(Produce, Consume, Group) || s.String() != "produce,consume,group" {
		t.Fatalf("ParseSet: %v %v %q", s, err, s.String())
	}
	if _, err := ParseSet("produce,write"); err == nil {
		t.Fatal("an unknown permission parsed")
	}
}

// TestPatternCoversPattern: granting on a resource pattern takes admin on
// it, decided by matching the caller's patterns against the rule's
// pattern as a name; a caller's pattern then matches it only if it
// matches every name the rule's pattern does.
func TestPatternCoversPattern(t *testing.T) {
	p := &Policy{Rules: []Rule{{Principal: "ops", Resource: "chat.*", Perms: Of(Admin)}, {Principal: "ops", Resource: "orders", Perms: Of(Admin)}}}
	for _, c := range []struct {
		resource string
		want     bool
	}{{"chat.*", true}, {"chat.eu.*", true}, {"chat.x", true}, {"chat*", false}, {"*", false}, {"orders", true}, {"orders*", false}} {
		if got := p.Allows("ops", Admin, c.resource); got != c.want {
			t.Errorf("admin on %q: %v, want %v", c.resource, got, c.want)
		}
	}
}

// BenchmarkPolicyAllows is one decision against RulesMax rules (half of
// them exact names, half prefix patterns), the principal's own rule last:
//
//	go test -run '^$' -bench PolicyAllows ./authz/
func BenchmarkPolicyAllows(b *testing.B) {
	var s RuleSet
	for i := range RulesMax {
		r := Rule{Principal: fmt.Sprintf("app-%04d", i), Resource: fmt.Sprintf("stream-%04d", i), Perms: Of(Produce, Consume)}
		if i%2 == 1 {
			r.Principal += "*"
			r.Resource += "*"
		}
		s.Apply(Change{Rule: r, Version: Version{UnixNanos: int64(i)}})
	}
	for _, indexed := range []bool{false, true} {
		p := s.Policy([]string{"root"})
		name := "scan"
		if indexed {
			p.Index()
			name = "indexed"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if !p.Allows("app-1022", Produce, "stream-1022") || p.Allows("nobody", Produce, "stream-0001") {
					b.Fatal("wrong decision")
				}
			}
		})
	}
}

// TestIndexedPolicyDecidesAlike: an indexed policy decides as the plain
// one, on random rules and questions.
func TestIndexedPolicyDecidesAlike(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	names := []string{"a", "ab", "a*", "ab*", "b", "*", "jwt:x", "jwt:*"}
	for round := range 200 {
		plain := &Policy{}
		for range 20 {
			plain.Rules = append(plain.Rules, Rule{Principal: names[r.IntN(len(names))], Resource: names[r.IntN(len(names))], Perms: Set(r.IntN(31)+1) << 1})
		}
		indexed := (&Policy{Rules: plain.Rules}).Index()
		for range 50 {
			who, what, perm := names[r.IntN(len(names))], names[r.IntN(len(names))], Permission(r.IntN(5)+1)
			if plain.Allows(who, perm, what) != indexed.Allows(who, perm, what) {
				t.Fatalf("round %d: %s %s %s: plain %v, indexed %v", round, who, perm, what, plain.Allows(who, perm, what), indexed.Allows(who, perm, what))
			}
		}
	}
}
