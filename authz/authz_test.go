package authz

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// modelMatch is the matching rule written another way: a pattern is a
// regular expression that is the quoted pattern, its trailing '*' turned
// into ".*".
func modelMatch(pattern, name string) bool {
	re := regexp.QuoteMeta(pattern)
	if len(pattern) > 0 && pattern[len(pattern)-1] == '*' {
		re = regexp.QuoteMeta(pattern[:len(pattern)-1]) + ".*"
	}
	return regexp.MustCompile("^" + re + "$").MatchString(name)
}

// TestMatchModel checks Match against the model on random names and
// patterns over a small alphabet, so prefixes, equal names and the
// wildcard collide often.
func TestMatchModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		const alpha = "ab.:*"
		b := make([]byte, r.IntN(n+1))
		for i := range b {
			b[i] = alpha[r.IntN(len(alpha))]
		}
		return string(b)
	}
	matched := 0
	for range 20000 {
		pattern, name := word(4), word(5)
		if r.IntN(4) == 0 {
			pattern = name
		}
		if ValidatePattern(pattern) != nil {
			continue
		}
		got, want := Match(pattern, name), modelMatch(pattern, name)
		if got != want {
			t.Fatalf("Match(%q, %q) = %v, the model says %v", pattern, name, got, want)
		}
		if got {
			matched++
		}
	}
	if matched < 1000 {
		t.Fatalf("only %d matches: the generator does not exercise matching", matched)
	}
}

func TestMatchExamples(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"*", "", true},
		{"*", "anything", true},
		{"user:*", "user:alice", true},
		{"user:*", "user:", true},
		{"user:*", "users:alice", false},
		{"chat.*", "chat.room1", true},
		{"chat.*", "chat", false},
		{"chat.*", "chatter", false},
		{"orders", "orders", true},
		{"orders", "orders2", false},
		{"", "", true},
	} {
		if got := Match(c.pattern, c.name); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

func TestValidatePattern(t *testing.T) {
	for _, bad := range []string{"", "a*b", "**", "*a"} {
		if ValidatePattern(bad) == nil {
			t.Errorf("ValidatePattern(%q) accepted it", bad)
		}
	}
	for _, good := range []string{"*", "a*", "chat.*", "alice"} {
		if err := ValidatePattern(good); err != nil {
			t.Errorf("ValidatePattern(%q): %v", good, err)
		}
	}
}

func TestPolicy(t *testing.T) {
	p := &Policy{
		Superusers: []string{"operator"},
		Rules: []Rule{
			{Principal: "user:*", Resource: "chat.*", Perms: Of(Produce, Consume)},
			{Principal: "auditor", Resource: "*", Perms: Of(Describe)},
			{Principal: "app", Resource: "app-group", Perms: Of(Group)},
		},
	}
	for _, c := range []struct {
		principal string
		perm      Permission
		resource  string
		want      bool
	}{
		{"operator", Admin, "anything", true},
		{"operator", Describe, "", true},
		{"user:bob", Produce, "chat.r1", true},
		{"user:bob", Consume, "chat.r1", true},
		{"user:bob", Describe, "chat.r1", false},
		{"user:bob", Produce, "orders", false},
		{"bob", Produce, "chat.r1", false},
		{"auditor", Describe, "orders", true},
		{"auditor", Describe, "", true},
		{"auditor", Consume, "orders", false},
		{"app", Group, "app-group", true},
		{"app", Group, "other", false},
		{"", Describe, "orders", false},
	} {
		if got := p.Allows(c.principal, c.perm, c.resource); got != c.want {
			t.Errorf("Allows(%q, %v, %q) = %v, want %v", c.principal, c.perm, c.resource, got, c.want)
		}
	}
}

func TestParsePermission(t *testing.T) {
	for p := Produce; p <= Group; p++ {
		got, err := ParsePermission(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePermission(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := ParsePermission("write"); err == nil {
		t.Error("ParsePermission(write) succeeded")
	}
}
