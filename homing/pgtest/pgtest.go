// Package pgtest gives tests a PostgreSQL 15 of their own and a fresh
// database per test.
//
// Unless GEOLOG_PG_URL names a server, each test process starts a private
// one with the project's scripts/pg.sh: its data in a new temporary folder
// (geolog-pgtest-* under os.TempDir()), on a free port held with
// internal/portlock for as long as the process runs, never the instance
// the demo and the local cluster use (run/pg, GEOLOG_PG_PORT). Two test
// processes, of one clone or of two, never share a server or a port. Run,
// from TestMain, stops the server and removes its folder; a server left
// behind by a test process that was killed is stopped and removed by the
// next test process that starts one.
//
// It never skips: when no server is configured and the script cannot start
// one, the test fails with the script's output.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/portlock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	once     sync.Once
	adminURL string
	startErr error
	private  *server // the server this process started, if any
	dbSeq    atomic.Int64
	createMu sync.Mutex
)

// startTimeout bounds scripts/pg.sh start, which may have to apt-get
// install PostgreSQL on a fresh machine.
const startTimeout = 10 * time.Minute

// startAttempts bounds the ports tried: a start fails when a program that
// does not use portlock took the port after it was probed.
const startAttempts = 3

// server is a private PostgreSQL: its folder, its port, the script.
type server struct {
	script string
	dir    string
	port   *portlock.Port
}

func start() {
	if u := os.Getenv("GEOLOG_PG_URL"); u != "" {
		adminURL = u
		return
	}
	script, err := findScript()
	if err != nil {
		startErr = err
		return
	}
	reapOrphans(script)
	for attempt := 1; attempt <= startAttempts; attempt++ {
		var s *server
		s, adminURL, err = startServer(script)
		if err == nil {
			private = s
			return
		}
		startErr = err
	}
}

// startServer starts a server in a new folder on a port of its own.
func startServer(script string) (*server, string, error) {
	r, err := portlock.DefaultRange()
	if err != nil {
		return nil, "", err
	}
	port, err := portlock.Take(r)
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "geolog-pgtest-")
	if err != nil {
		port.Release()
		return nil, "", err
	}
	s := &server{script: script, dir: dir, port: port}
	// As root, the server runs as the postgres user, which must reach
	// its folder (pg.sh gives it data/ and sock/).
	if err := os.Chmod(dir, 0o755); err == nil {
		err = os.WriteFile(filepath.Join(dir, ownerFile), []byte(ownerOf(os.Getpid())), 0o644)
	}
	if err != nil {
		s.remove()
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	out, err := s.run(ctx, "start")
	if err != nil {
		s.remove()
		return nil, "", fmt.Errorf("pgtest: %s start (port %d, folder %s) failed: %v\n%s", script, port.Number(), dir, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	u := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(u, "postgres://") {
		s.remove()
		return nil, "", fmt.Errorf("pgtest: %s start printed no URL:\n%s", script, out)
	}
	return s, u, nil
}

// run runs the script with action for s's folder and port.
func (s *server) run(ctx context.Context, action string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, s.script, action)
	cmd.Env = append(os.Environ(), "GEOLOG_PG_DIR="+s.dir)
	if s.port != nil {
		cmd.Env = append(cmd.Env, "GEOLOG_PG_PORT="+strconv.Itoa(s.port.Number()))
	}
	return cmd.CombinedOutput()
}

// remove stops the server (if it runs), deletes its folder and gives its
// port back.
func (s *server) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := s.run(ctx, "stop"); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %s stop (%s): %v\n%s", s.script, s.dir, err, out)
	}
	if err := os.RemoveAll(s.dir); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
	}
	if s.port != nil {
		s.port.Release()
	}
}

// ownerFile, in a server's folder, names the test process that owns it:
// "PID STARTTIME" (the start time tells a reused pid apart).
const ownerFile = "owner"

// ownerOf is pid's owner line; "" if the process does not exist.
func ownerOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// Field 22 is the start time; the command name (field 2) may hold
	// spaces, so count from the parenthesis that closes it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return fmt.Sprintf("%d %s", pid, f[19])
}

// reapOrphans stops and removes the servers of test processes that are
// gone (killed by a timeout, say, before Run could stop their server).
func reapOrphans(script string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "geolog-pgtest-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being set up, or not ours
		}
		owner := strings.TrimSpace(string(b))
		pid, _, _ := strings.Cut(owner, " ")
		n, err := strconv.Atoi(pid)
		if err != nil || ownerOf(n) == owner {
			continue // its owner lives
		}
		(&server{script: script, dir: dir}).remove()
	}
}

// findScript walks up from the working directory to the module root.
func findScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			script := filepath.Join(dir, "scripts", "pg.sh")
			if _, err := os.Stat(script); err != nil {
				return "", fmt.Errorf("pgtest: %s not found (set GEOLOG_PG_URL to use another server)", script)
			}
			return script, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("pgtest: no go.mod above the working directory (set GEOLOG_PG_URL)")
		}
		dir = parent
	}
}

// AdminURL returns the server's URL (its postgres database), starting the
// server on first use. It fails t if no server can be had.
func AdminURL(t testing.TB) string {
	t.Helper()
	once.Do(start)
	if startErr != nil {
		t.Fatalf("PostgreSQL is needed for this test and could not be started: %v", startErr)
	}
	return adminURL
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// NewDatabase creates an empty database for t, dropped when t ends, and
// returns its URL.
func NewDatabase(t testing.TB) string {
	t.Helper()
	admin := AdminURL(t)
	u, err := url.Parse(admin)
	if err != nil || u.Scheme == "" {
		t.Fatalf("pgtest: GEOLOG_PG_URL must be a postgres:// URL: %q", admin)
	}
	base := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 30 {
		base = base[:30]
	}
	name := fmt.Sprintf("t_%s_%d_%d", base, os.Getpid(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adminExec(ctx, admin, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// adminExec runs one statement on the admin database. CREATE DATABASE
// copies a template and fails while another copy is in progress, so
// creations are serialized in this process and retried across processes.
func adminExec(ctx context.Context, admin, sql string) error {
	createMu.Lock()
	defer createMu.Unlock()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		var conn *pgx.Conn
		conn, err = pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, sql)
		conn.Close(ctx)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object in use
			return err
		}
		select {
		case <-time.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// Run is for TestMain: it runs the tests, then stops and removes the
// server this process started, and returns the exit code.
func Run(m *testing.M) int {
	code := m.Run()
	if private != nil {
		private.remove()
	}
	return code
}
