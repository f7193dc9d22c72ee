package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// commandLine is one geologd command line found in a deployment file.
type commandLine struct {
	where string
	args  []string
}

// composeCommands returns the command lines of a compose file's geolog
// services (those whose image is geolog's), which are written as JSON
// arrays on one line.
func composeCommands(t *testing.T, file string) []commandLine {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []commandLine
	image := ""
	re := regexp.MustCompile(`^\s+command:\s*(\[.*\])\s*$`)
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "image:") {
			image = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "image:"))
		}
		m := re.FindStringSubmatch(line)
		if m == nil || !strings.HasPrefix(image, "geolog:") {
			continue
		}
		var args []string
		if err := json.Unmarshal([]byte(m[1]), &args); err != nil {
			t.Fatalf("%s:%d: command is not a JSON array of strings: %v", file, i+1, err)
		}
		out = append(out, commandLine{where: file + ":" + strings.TrimSpace(line[:min(len(line), 40)]), args: args})
	}
	return out
}

// unitCommand returns the ExecStart of a systemd unit, without the binary
// and without environment expansions.
func unitCommand(t *testing.T, file string) commandLine {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.ReplaceAll(string(data), "\\\n", " "), "\n") {
		if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
			f := strings.Fields(rest)
			if len(f) == 0 || filepath.Base(f[0]) != "geologd" {
				t.Fatalf("%s: ExecStart runs %v, not geologd", file, f)
			}
			var args []string
			for _, a := range f[1:] {
				if !strings.HasPrefix(a, "$") {
					args = append(args, a)
				}
			}
			return commandLine{where: file, args: args}
		}
	}
	t.Fatalf("%s: no ExecStart", file)
	return commandLine{}
}

// TestDeployFilesHaveValidFlags: every geologd command line in the compose
// files and the systemd unit is one geologd accepts (--check-flags), so
// that a renamed or removed flag cannot leave them broken.
func TestDeployFilesHaveValidFlags(t *testing.T) {
	var lines []commandLine
	for _, f := range []string{"single-node.yml", "three-regions.yml"} {
		cl := composeCommands(t, filepath.Join("..", "..", "deploy", "compose", f))
		if len(cl) == 0 {
			t.Fatalf("%s: no geolog service", f)
		}
		lines = append(lines, cl...)
	}
	lines = append(lines, unitCommand(t, filepath.Join("..", "..", "deploy", "systemd", "geologd.service")))
	if len(lines) != 5 {
		t.Fatalf("found %d geologd command lines, want 5 (1 + 3 + the unit)", len(lines))
	}
	for _, cl := range lines {
		code, stderr := geologd(t, append(cl.args, "--check-flags")...)
		if code != 0 {
			t.Errorf("%s: geologd %v: exit %d\n%s", cl.where, cl.args, code, stderr)
		}
	}
	// And the check fails where it should.
	if code, _ := geologd(t, "--data-dir", "x", "--no-such-flag", "--check-flags"); code != 2 {
		t.Errorf("an unknown flag passed --check-flags (exit %d)", code)
	}
	if code, stderr := geologd(t, "--data-dir", "x", "--tail-survey-timeout", "0s", "--check-flags"); code != 2 || !strings.Contains(stderr, "--tail-survey-timeout must be positive") {
		t.Errorf("--tail-survey-timeout 0s passed --check-flags (exit %d)\n%s", code, stderr)
	}
}
