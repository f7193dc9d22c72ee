package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain keeps the tests off the user's own config file.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "geolog-cli-test")
	if err != nil {
		panic(err)
	}
	os.Setenv("GEOLOG_CONFIG", filepath.Join(dir, "none", "config.toml"))
	os.Unsetenv("GEOLOG_CONTEXT")
	os.Unsetenv("GEOLOG_ADDR")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestContexts: a context added to the config file gives later commands
// their address; --context and GEOLOG_CONTEXT pick another; flags and the
// environment win over it; the file is 0600; a bad file or an unknown
// context is refused in plain words.
func TestContexts(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "geolog", "config.toml")
	t.Setenv("GEOLOG_CONFIG", cfg)
	up := startFake(t)
	up.MustCreateStream("here", 1)
	ctx := testCtx(t)
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(t, ctx, "", args...)
		if code != 0 {
			t.Fatalf("geolog %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	must("context", "add", "dev", "--addr", up.Addr(), "--timeout", "5s", "--description", "the fake")
	must("context", "add", "nowhere", "--addr", "127.0.0.1:1", "--retries", "0")
	if fi, err := os.Stat(cfg); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v, mode %v", err, fi.Mode())
	}
	if out := must("context", "list"); !strings.Contains(out, "*        dev") || !strings.Contains(out, "nowhere") {
		t.Fatalf("context list:\n%s", out)
	}
	// The first context added is the current one: no --addr needed.
	if out := must("streams", "list"); !strings.Contains(out, "here") {
		t.Fatalf("streams list through context dev: %q", out)
	}
	// --context (before or after the command) and GEOLOG_CONTEXT pick another.
	for _, args := range [][]string{{"--context", "nowhere", "streams", "list"}, {"streams", "list", "--context=nowhere"}} {
		if _, errOut, code := run(t, ctx, "", args...); code != 1 || !strings.Contains(errOut, "127.0.0.1:1") {
			t.Errorf("geolog %v: exit %d, %q; want a failure to reach 127.0.0.1:1", args, code, errOut)
		}
	}
	t.Setenv("GEOLOG_CONTEXT", "nowhere")
	if _, _, code := run(t, ctx, "", "streams", "list"); code != 1 {
		t.Errorf("GEOLOG_CONTEXT=nowhere: exit %d", code)
	}
	// A flag wins over the context; so does the environment.
	if out := must("--addr", up.Addr(), "streams", "list"); !strings.Contains(out, "here") {
		t.Errorf("--addr over the context: %q", out)
	}
	t.Setenv("GEOLOG_ADDR", up.Addr())
	if out := must("streams", "list"); !strings.Contains(out, "here") {
		t.Errorf("GEOLOG_ADDR over the context: %q", out)
	}
	t.Setenv("GEOLOG_ADDR", "")
	t.Setenv("GEOLOG_CONTEXT", "")
	must("context", "use", "nowhere")
	if _, _, code := run(t, ctx, "", "streams", "list"); code != 1 {
		t.Errorf("after context use nowhere: exit %d", code)
	}
	must("context", "remove", "nowhere")
	if _, errOut, code := run(t, ctx, "", "--context", "nowhere", "streams", "list"); code != 2 || !strings.Contains(errOut, `no context "nowhere"`) {
		t.Errorf("a removed context: exit %d, %q", code, errOut)
	}
	if _, _, code := run(t, ctx, "", "context", "add", "bad name", "--addr", up.Addr()); code != 2 {
		t.Errorf("a bad context name: exit %d", code)
	}
	os.WriteFile(cfg, []byte("current = \"dev\"\n[contexts.dev]\naddr = \"x:1\"\ncolour = \"red\"\n"), 0o600)
	if _, errOut, code := run(t, ctx, "", "context", "list"); code == 0 || !strings.Contains(errOut, "unknown setting") {
		t.Errorf("an unknown setting: exit %d, %q", code, errOut)
	}
}
