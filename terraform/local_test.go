package terraform

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/portlock"
)

// localPortCount is the size of TestLocalApplyDestroy's port plan: 2
// regions x 1 node use base .. base+7 (WAN control, PostgreSQL, 2 nodes, 2
// debug listeners, 2 WAN links).
const localPortCount = 8

// localPortBlock holds localPortCount consecutive free ports for the rest of
// t (internal/portlock: no other run, of this clone or another, takes them)
// and returns the first. The module wants base_port <= 65000.
func localPortBlock(t *testing.T) int {
	t.Helper()
	r, err := portlock.DefaultRange()
	if err != nil {
		t.Fatal(err)
	}
	r.Max = min(r.Max, 65000+localPortCount-1)
	ports, err := portlock.TakeBlock(r, localPortCount)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range ports {
			p.Release()
		}
	})
	return ports[0].Number()
}

// TestLocalApplyDestroy runs terraform/local for real: init, apply a
// 2-region x 1-node cluster, use it through bin/geolog, apply again (no
// change), destroy, and checks that no process or port is left.
func TestLocalApplyDestroy(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the terraform apply/destroy cycle is not run")
	}
	tf := terraformBinary()
	if tf == "" {
		t.Skip("terraform is not installed (make terraform installs it): the apply/destroy cycle is not run")
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"geologd", "geolog", "geolog-wan"} {
		if _, err := os.Stat(filepath.Join(repo, "bin", b)); err != nil {
			t.Skipf("bin/%s missing (make build): the apply/destroy cycle is not run", b)
		}
	}
	localBasePort := localPortBlock(t)

	tmp := t.TempDir()
	// PostgreSQL runs as the postgres user when the test runs as root: it
	// must be able to reach its folder under the temporary directory.
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	runDir := filepath.Join(tmp, "run")
	state := filepath.Join(tmp, "terraform.tfstate")
	vars := filepath.Join(tmp, "test.tfvars.json")
	writeJSON(t, vars, map[string]any{
		"regions":               []string{"us", "eu"},
		"nodes_per_region":      1,
		"base_port":             localBasePort,
		"data_dir":              runDir,
		"latencies":             map[string]string{"us-eu": "20ms"},
		"start_timeout_seconds": 60,
		"stop_timeout_seconds":  10,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	terraform := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, tf, append([]string{"-chdir=" + filepath.Join(repo, "terraform", "local")}, args...)...)
		// The module's own .terraform and state stay untouched: a user's
		// `make tf-up` cluster is not this one.
		cmd.Env = append(os.Environ(), "TF_DATA_DIR="+filepath.Join(tmp, ".terraform"), "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		t.Logf("terraform %s (%s)", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("terraform %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
		}
		return string(out)
	}
	destroyed := false
	destroy := func() {
		terraform("destroy", "-auto-approve", "-input=false", "-no-color", "-state="+state, "-var-file="+vars)
		destroyed = true
	}
	t.Cleanup(func() {
		if !destroyed {
			// After a failure: stop what the apply started, whatever it got to.
			cmd := exec.Command(tf, "-chdir="+filepath.Join(repo, "terraform", "local"), "destroy", "-auto-approve", "-input=false", "-no-color", "-state="+state, "-var-file="+vars)
			cmd.Env = append(os.Environ(), "TF_DATA_DIR="+filepath.Join(tmp, ".terraform"))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Logf("cleanup destroy: %v\n%s", err, out)
			}
		}
	})

	terraform("init", "-input=false", "-no-color")
	terraform("apply", "-auto-approve", "-input=false", "-no-color", "-state="+state, "-var-file="+vars)

	var outputs struct {
		RegionEndpoints struct{ Value map[string]string } `json:"region_endpoints"`
		AllEndpoints    struct{ Value string }            `json:"all_endpoints"`
		WANControlURL   struct{ Value string }            `json:"wan_control_url"`
		PostgresURL     struct{ Value string }            `json:"postgres_url"`
		EnvFile         struct{ Value string }            `json:"env_file"`
	}
	if err := json.Unmarshal([]byte(terraform("output", "-json", "-state="+state)), &outputs); err != nil {
		t.Fatal(err)
	}
	us, eu := outputs.RegionEndpoints.Value["us"], outputs.RegionEndpoints.Value["eu"]
	if us != fmt.Sprintf("127.0.0.1:%d", localBasePort+2) || eu != fmt.Sprintf("127.0.0.1:%d", localBasePort+3) {
		t.Fatalf("region_endpoints = %v", outputs.RegionEndpoints.Value)
	}
	// The lease store is reached with verify-full, against pg.sh's own CA.
	if u, err := url.Parse(outputs.PostgresURL.Value); err != nil || u.Host != fmt.Sprintf("127.0.0.1:%d", localBasePort+1) ||
		u.Query().Get("sslmode") != "verify-full" || u.Query().Get("sslrootcert") != filepath.Join(runDir, "pg", "tls", "ca.crt") {
		t.Errorf("postgres_url = %q, want 127.0.0.1:%d with sslmode=verify-full and sslrootcert under %s", outputs.PostgresURL.Value, localBasePort+1, runDir)
	}
	if !listening(localBasePort + 1) {
		t.Errorf("PostgreSQL does not listen on %d", localBasePort+1)
	}
	env, err := os.ReadFile(outputs.EnvFile.Value)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"GEOLOG_ADDR_US=" + us, "GEOLOG_ADDR_EU=" + eu, "GEOLOG_ADDR_ALL=" + us + "," + eu, "GEOLOG_WAN_CONTROL=127.0.0.1:" + strconv.Itoa(localBasePort), "GEOLOG_LEASE_STORE=",
		"GEOLOG_CERTS_DIR='" + filepath.Join(runDir, "certs", "client") + "'"} {
		if !strings.Contains(string(env), want) {
			t.Errorf("env file lacks %q:\n%s", want, env)
		}
	}
	resp, err := http.Get(outputs.WANControlURL.Value + "/links")
	if err != nil {
		t.Fatal(err)
	}
	var links struct{ Links []struct{ Name string } }
	err = json.NewDecoder(resp.Body).Decode(&links)
	resp.Body.Close()
	if err != nil || len(links.Links) != 2 {
		t.Fatalf("WAN links: %v %+v", err, links)
	}

	// Use the cluster: a stream in both regions, produce through eu (the
	// home is us: redirected across the WAN), read eu's own copy.
	// The nodes serve TLS: the CLI dials with the cluster's client
	// certificate, and is refused without.
	geologWith := func(certs, addr, stdin string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(repo, "bin", "geolog"), append([]string{"--addr", addr}, args...)...)
		cmd.Env = append(os.Environ(), "GEOLOG_CERTS_DIR="+certs)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	geolog := func(addr, stdin string, args ...string) string {
		t.Helper()
		out, err := geologWith(filepath.Join(runDir, "certs", "client"), addr, stdin, args...)
		if err != nil {
			t.Fatalf("geolog %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	if out, err := geologWith("", us, "", "--timeout", "5s", "--retries", "0", "streams", "list"); err == nil {
		t.Fatalf("a plaintext client reached a node:\n%s", out)
	}
	geolog(us, "", "streams", "create", "tf", "--ranges", "2", "--regions", "us,eu", "--home", "us")
	geolog(eu, "k1\thello\nk2\tworld\n", "produce", "tf", "--tab")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := geolog(eu, "", "consume", "tf", "--from-offset", "0")
		if strings.Contains(out, "k1\thello") && strings.Contains(out, "k2\tworld") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu's copy did not get both records in 30s:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}

	checkAtRest(t, runDir, []string{"us-n1", "eu-n1"}, func(marker string) {
		geolog(eu, "k3\t"+marker+"\n", "produce", "tf", "--tab")
		// Both copies hold it before the data directories are read.
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(geolog(eu, "", "consume", "tf", "--from-offset", "0"), marker) {
			if time.Now().After(deadline) {
				t.Fatal("eu's copy did not get the marker record in 30s")
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	// apply twice is fine: nothing changes.
	if out := terraform("apply", "-auto-approve", "-input=false", "-no-color", "-state="+state, "-var-file="+vars); !strings.Contains(out, "0 added, 0 changed, 0 destroyed") {
		t.Errorf("second apply changed something:\n%s", out)
	}

	pids := clusterPids(t, runDir)
	if len(pids) != 4 { // wan, 2 nodes, postgres
		t.Fatalf("pids before destroy: %v, want 4", pids)
	}
	destroy()
	// Each process is gone, or a zombie (exited, not yet reaped: init may
	// reap late on a busy machine, and kill(pid, 0) still finds it), within
	// a minute of the destroy.
	for name, pid := range pids {
		deadline := time.Now().Add(time.Minute)
		for running(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if running(pid) {
			t.Errorf("%s (pid %d) still runs a minute after destroy", name, pid)
		}
	}
	for p := localBasePort; p < localBasePort+localPortCount; p++ {
		if listening(p) {
			t.Errorf("port %d still held after destroy", p)
		}
	}
	if _, err := os.Stat(runDir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after destroy (%v)", runDir, err)
	}
}

// clusterPids reads the pid files of proc.sh and PostgreSQL's postmaster.pid.
func clusterPids(t *testing.T, runDir string) map[string]int {
	t.Helper()
	pids := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(runDir, "pids", "*.pid"))
	files = append(files, filepath.Join(runDir, "pg", "data", "postmaster.pid"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.Fields(string(data))[0])
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		pids[strings.TrimSuffix(filepath.Base(f), ".pid")] = pid
	}
	return pids
}

// running reports whether pid is a live process: one that exists and is
// not a zombie.
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

func listening(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkAtRest checks encryption at rest (variable atrest, default true) on
// the nodes named: each has its KEK file under runDir/keks, mode 0600 and
// outside its data directory, and a keyring in its data directory; and a
// record value that produce writes (acked: on disk, --fsync always) is
// found in clear in no file under the data directories.
func checkAtRest(t *testing.T, runDir string, nodes []string, produce func(marker string)) {
	t.Helper()
	for _, n := range nodes {
		st, err := os.Stat(filepath.Join(runDir, "keks", n+".json"))
		if err != nil {
			t.Fatalf("%s: no KEK file: %v", n, err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: KEK file mode %v, want 0600", n, st.Mode().Perm())
		}
		if _, err := os.Stat(filepath.Join(runDir, "data", n, "keys", "keyring.json")); err != nil {
			t.Errorf("%s: its data directory holds no keyring (is --kek-file on?): %v", n, err)
		}
	}
	marker := fmt.Sprintf("atrest-marker-%d-%d", os.Getpid(), time.Now().UnixNano())
	produce(marker)
	dataDir := filepath.Join(runDir, "data")
	files := 0
	err := filepath.WalkDir(dataDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		if strings.Contains(string(b), marker) {
			t.Errorf("%s holds the produced value in clear", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatalf("no file under %s", dataDir)
	}
}
