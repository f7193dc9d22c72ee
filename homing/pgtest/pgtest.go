// Package pgtest gives tests a private PostgreSQL 15: the project's own
// instance, started with scripts/pg.sh (data in run/pg, port 55432 or
// GEOLOG_PG_PORT) unless GEOLOG_PG_URL names a server, and a fresh database
// per test.
//
// It never skips: when no server is configured and the script cannot start
// one, the test fails with the script's output. Use Run from TestMain so
// that a server this process started is stopped at the end (set
// GEOLOG_PG_KEEP=1 to keep it running between runs).
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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	once        sync.Once
	adminURL    string
	startErr    error
	startedHere atomic.Bool
	scriptPath  string
	dbSeq       atomic.Int64
	createMu    sync.Mutex
)

// startTimeout bounds scripts/pg.sh start, which may have to apt-get
// install PostgreSQL on a fresh machine.
const startTimeout = 10 * time.Minute

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
	scriptPath = script
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if exec.CommandContext(ctx, script, "status").Run() != nil {
		startedHere.Store(true)
	}
	out, err := exec.CommandContext(ctx, script, "start").CombinedOutput()
	if err != nil {
		startErr = fmt.Errorf("pgtest: %s start failed: %v\n%s", script, err, out)
		return
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	adminURL = strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(adminURL, "postgres://") {
		startErr = fmt.Errorf("pgtest: %s start printed no URL:\n%s", script, out)
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

// Run is for TestMain: it runs the tests, then stops the server if this
// process started it (unless GEOLOG_PG_KEEP=1), and returns the exit code.
func Run(m *testing.M) int {
	code := m.Run()
	if startedHere.Load() && scriptPath != "" && os.Getenv("GEOLOG_PG_KEEP") != "1" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, scriptPath, "stop").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %s stop: %v\n%s", scriptPath, err, out)
		}
	}
	return code
}
