package main

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/geolog/geolog/regionsvc"
)

// TestMain lets the tests run the test binary as geologd itself: with
// GEOLOGD_TEST_ARGS set (a JSON list), it is run() with those arguments.
func TestMain(m *testing.M) {
	if a := os.Getenv("GEOLOGD_TEST_ARGS"); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			panic(err)
		}
		os.Args = append([]string{"geologd"}, args...)
		os.Exit(run())
	}
	os.Exit(m.Run())
}

// geologd runs geologd with args to its end and returns its exit code and
// standard error.
func geologd(t *testing.T, args ...string) (int, string) {
	t.Helper()
	enc, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GEOLOGD_TEST_ARGS="+string(enc))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stderr.String()
}

// TestRefusesToStart: geologd refuses to start, with one clear line and a
// non-zero exit, on a bad flag value, a data directory another node holds,
// and addresses it cannot listen on (each used to be accepted: --log-level
// bogus silently, a locked directory with a warning per range and then
// serving without them).
func TestRefusesToStart(t *testing.T) {
	held := t.TempDir()
	n, err := regionsvc.New(regionsvc.Config{DataDir: held, ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"log level", []string{"--data-dir", t.TempDir(), "--insecure", "--log-level", "bogus"}, 2, "--log-level must be"},
		{"locked data dir", []string{"--data-dir", held, "--insecure", "--listen", "127.0.0.1:0"}, 1, "in use by another geologd"},
		{"listen address in use", []string{"--data-dir", t.TempDir(), "--insecure", "--listen", busy.Addr().String()}, 1, "cannot start the node"},
		{"debug address in use", []string{"--data-dir", t.TempDir(), "--insecure", "--listen", "127.0.0.1:0", "--debug-addr", busy.Addr().String()}, 1, "--debug-addr"},
		{"http address in use", []string{"--data-dir", t.TempDir(), "--insecure", "--listen", "127.0.0.1:0", "--http-addr", busy.Addr().String()}, 1, "--http-addr"},
		{"otlp endpoint", []string{"--data-dir", t.TempDir(), "--insecure", "--listen", "127.0.0.1:0", "--otlp-endpoint", "collector:4317"}, 2, "--otlp-endpoint"},
		{"bearer tokens over plaintext", []string{"--data-dir", t.TempDir(), "--insecure", "--jwt-keys", "keys.pem"}, 2, "--jwt-keys needs TLS"},
		{"token issuer without keys", []string{"--data-dir", t.TempDir(), "--insecure", "--jwt-issuer", "idp"}, 2, "need --jwt-keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := geologd(t, tc.args...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			if code != tc.code || !strings.Contains(last, tc.want) || !strings.HasPrefix(last, "geologd: ") {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and a last line \"geologd: ...%s...\"", code, stderr, tc.code, tc.want)
			}
		})
	}
}

// TestVersion: geologd --version prints one line with its version.
func TestVersion(t *testing.T) {
	enc, _ := json.Marshal([]string{"--version"})
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GEOLOGD_TEST_ARGS="+string(enc))
	out, err := cmd.Output()
	if err != nil || !strings.HasPrefix(string(out), "geologd dev (") {
		t.Fatalf("--version: %q, %v", out, err)
	}
}
