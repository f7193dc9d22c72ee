package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestComplete: __complete offers commands, subcommands, a command's flags
// and the node's stream names, filtered by the word typed.
func TestComplete(t *testing.T) {
	fake := startFake(t)
	fake.MustCreateStream("chat", 1)
	fake.MustCreateStream("audit", 1)
	ctx := testCtx(t)
	for _, tc := range []struct {
		words []string
		want  []string
		not   string
	}{
		{[]string{""}, []string{"consume", "produce", "streams", "groups", "context"}, ""},
		{[]string{"con"}, []string{"consume", "context"}, "produce"},
		{[]string{"streams", ""}, []string{"create", "delete", "describe", "list"}, "consume"},
		{[]string{"keys", "r"}, []string{"rewrap", "rotate"}, "list"},
		{[]string{"consume", "--f"}, []string{"--follow", "--from"}, "--ranges"},
		{[]string{"streams", "create", "x", "--r"}, []string{"--ranges", "--retention-age"}, ""},
		{[]string{"--addr", fake.Addr(), "consume", ""}, []string{"audit", "chat"}, "consume"},
		{[]string{"--addr", fake.Addr(), "streams", "describe", "c"}, []string{"chat"}, "audit"},
		{[]string{"completion", ""}, []string{"bash", "fish", "zsh"}, ""},
	} {
		out, errOut, code := run(t, ctx, "", append([]string{"__complete"}, tc.words...)...)
		got := strings.Fields(out)
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("__complete %q: %v lacks %q (exit %d, %s)", tc.words, got, w, code, errOut)
			}
		}
		if tc.not != "" && slices.Contains(got, tc.not) {
			t.Errorf("__complete %q: %v offers %q", tc.words, got, tc.not)
		}
	}
}

// TestBashCompletion sources `geolog completion bash` in a real bash and
// completes "geolog str" and "geolog streams de" through it.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", bin+"/", "github.com/geolog/geolog/cmd/geolog").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	script := `source <(geolog completion bash)
COMP_WORDS=(geolog str); COMP_CWORD=1; _geolog; echo "1:${COMPREPLY[*]}"
COMP_WORDS=(geolog streams de); COMP_CWORD=2; _geolog; echo "2:${COMPREPLY[*]}"`
	cmd := exec.Command(bash, "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(filepath.ListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "1:streams") || !strings.Contains(string(out), "2:delete describe") {
		t.Fatalf("bash completion gave:\n%s", out)
	}
}
