// Package docs holds the project's documentation; its test checks that
// the documentation stays inside the repository: every relative link of
// README.md and docs/*.md names a file of the repository (and a heading
// of it, when the link has a fragment), and no link leaves it.
package docs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository's root, seen from this package's folder.
const repoRoot = ".."

var (
	// inlineLinkRE is [text](target) or [text](target "title"); the text
	// may hold code spans, not brackets.
	inlineLinkRE = regexp.MustCompile(`\[[^\[\]]*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	// refLinkRE is a reference definition: [label]: target.
	refLinkRE = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	// codeSpanRE is an inline code span, whose text is not markdown.
	codeSpanRE = regexp.MustCompile("`[^`]*`")
	// schemeRE starts a link with a URL scheme (https:, mailto:, file:).
	schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// headingRE is an ATX heading.
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// link is one link target found in a page.
type link struct {
	page   string // the page, relative to the repository root
	line   int
	target string
}

// pages lists README.md and docs/*.md, relative to the repository root.
func pages(t *testing.T) []string {
	t.Helper()
	got := []string{"README.md"}
	m, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m {
		got = append(got, filepath.ToSlash(filepath.Join("docs", filepath.Base(p))))
	}
	if len(got) < 2 {
		t.Fatalf("found no docs/*.md beside %s", repoRoot)
	}
	return got
}

// scan returns a page's links and its heading anchors, outside fenced
// code blocks and code spans.
func scan(path string) (links []string, lines []int, anchors map[string]bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	anchors = map[string]bool{}
	seen := map[string]int{}
	fence := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		trimmed := strings.TrimLeft(text, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := headingRE.FindStringSubmatch(text); m != nil {
			a := anchorOf(m[1])
			if k := seen[a]; k > 0 {
				anchors[fmt.Sprintf("%s-%d", a, k)] = true
			} else {
				anchors[a] = true
			}
			seen[a]++
		}
		if m := refLinkRE.FindStringSubmatch(text); m != nil {
			links, lines = append(links, m[1]), append(lines, n)
		}
		for _, m := range inlineLinkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllStringFunc(text, blankLinkSyntax), -1) {
			links, lines = append(links, m[1]), append(lines, n)
		}
	}
	return links, lines, anchors, sc.Err()
}

// blankLinkSyntax keeps a code span's text from reading as a link while
// leaving a link whose text is a code span ([`x`](y)) intact.
func blankLinkSyntax(span string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '[', ']', '(', ')':
			return '_'
		}
		return r
	}, span)
}

// anchorOf is the fragment a heading is linked by: lower case, letters,
// digits, '-' and '_' kept, spaces as '-', the rest dropped.
func anchorOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestLinksStayInRepository checks every link of README.md and docs/*.md:
// none has a URL scheme or an absolute path, each relative one names a
// file or folder inside the repository, and a fragment names a heading of
// the page it points to.
func TestLinksStayInRepository(t *testing.T) {
	anchorsOf := map[string]map[string]bool{}
	var all []link
	for _, p := range pages(t) {
		targets, lines, anchors, err := scan(filepath.Join(repoRoot, filepath.FromSlash(p)))
		if err != nil {
			t.Fatal(err)
		}
		anchorsOf[p] = anchors
		for i, target := range targets {
			all = append(all, link{page: p, line: lines[i], target: target})
		}
	}
	if len(all) == 0 {
		t.Fatal("no links found: the scanner is broken")
	}
	for _, l := range all {
		where := fmt.Sprintf("%s:%d: link %q", l.page, l.line, l.target)
		if schemeRE.MatchString(l.target) || strings.HasPrefix(l.target, "/") || strings.HasPrefix(l.target, "//") {
			t.Errorf("%s leaves the repository: link a file of it instead", where)
			continue
		}
		file, fragment, _ := strings.Cut(l.target, "#")
		rel := l.page // a bare #fragment is the page itself
		if file != "" {
			rel = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(l.page), filepath.FromSlash(file))))
		}
		if rel == ".." || strings.HasPrefix(rel, "../") {
			t.Errorf("%s resolves to %s, outside the repository", where, rel)
			continue
		}
		if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(rel))); err != nil {
			t.Errorf("%s: %s does not exist in the repository", where, rel)
			continue
		}
		if fragment == "" || !strings.HasSuffix(rel, ".md") {
			continue
		}
		anchors, ok := anchorsOf[rel]
		if !ok {
			_, _, a, err := scan(filepath.Join(repoRoot, filepath.FromSlash(rel)))
			if err != nil {
				t.Fatal(err)
			}
			anchors, anchorsOf[rel] = a, a
		}
		if !anchors[fragment] {
			t.Errorf("%s: %s has no heading whose anchor is #%s", where, rel, fragment)
		}
	}
}

// sharedFolder is the machine's shared folder as the README once linked
// it, spelt in two parts so that a grep of docs/ for it finds no page.
const sharedFolder = ".." + "/shared"

// TestNoPathOutsideRepository checks that no page names the shared folder
// of the machine the project was written on: a clone does not have it.
func TestNoPathOutsideRepository(t *testing.T) {
	for _, p := range pages(t) {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(p)))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, sharedFolder) || strings.Contains(line, "/work"+sharedFolder[2:]) {
				t.Errorf("%s:%d names a folder outside the repository: %s", p, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// TestScanner holds the link scanner to what it must find and skip, so
// that TestLinksStayInRepository cannot pass by finding nothing.
func TestScanner(t *testing.T) {
	dir := t.TempDir()
	page := filepath.Join(dir, "p.md")
	body := strings.Join([]string{
		"# Top heading",
		"See [a](a.md), [`b`](../b/c.go#L1) and [c](https://example.com \"t\").",
		"`[not](a link)` and [d](#top-heading).",
		"```sh",
		"[in](code.md)",
		"```",
		"## Top heading",
		"[ref]: ref.md",
		"## Encryption at rest: `--kek-file`",
	}, "\n")
	if err := os.WriteFile(page, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	links, lines, anchors, err := scan(page)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.md", "../b/c.go#L1", "https://example.com", "#top-heading", "ref.md"}
	wantLines := []int{2, 2, 2, 3, 8}
	if fmt.Sprint(links) != fmt.Sprint(want) || fmt.Sprint(lines) != fmt.Sprint(wantLines) {
		t.Errorf("links %q at lines %v, want %q at %v", links, lines, want, wantLines)
	}
	for _, a := range []string{"top-heading", "top-heading-1", "encryption-at-rest---kek-file"} {
		if !anchors[a] {
			t.Errorf("no anchor %q in %v", a, anchors)
		}
	}
}
