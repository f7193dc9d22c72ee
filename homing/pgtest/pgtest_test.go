package pgtest

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/portlock"
	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Run(m)) }

// TestPrivateServer: without GEOLOG_PG_URL, the server is this process's
// own: in a temporary folder that names this process as its owner, on a
// port of the portlock range (never the demo's GEOLOG_PG_PORT or 55432),
// and a database made for a test works.
func TestPrivateServer(t *testing.T) {
	if os.Getenv("GEOLOG_PG_URL") != "" {
		t.Skip("GEOLOG_PG_URL names the server")
	}
	dbURL := NewDatabase(t)
	if private == nil {
		t.Fatal("no private server was started")
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	r, err := portlock.DefaultRange()
	if err != nil {
		t.Fatal(err)
	}
	if port != private.port.Number() || port < r.Min || port > r.Max {
		t.Fatalf("server on port %d; want the held port %d within %s", port, private.port.Number(), r)
	}
	if demo := os.Getenv("GEOLOG_PG_PORT"); port == 55432 || demo == u.Port() {
		t.Fatalf("server on the demo's port %d", port)
	}
	if !strings.HasPrefix(private.dir, filepath.Join(os.TempDir(), "geolog-pgtest-")) {
		t.Fatalf("server folder %s", private.dir)
	}
	if b, err := os.ReadFile(filepath.Join(private.dir, ownerFile)); err != nil || string(b) != ownerOf(os.Getpid()) {
		t.Fatalf("owner file %q (%v), want %q", b, err, ownerOf(os.Getpid()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d %v", one, err)
	}
}

// TestReapOrphans: the folder of a server whose test process is gone is
// removed; a live owner's folder stays.
func TestReapOrphans(t *testing.T) {
	script, err := findScript()
	if err != nil {
		t.Fatal(err)
	}
	mk := func(owner string) string {
		dir, err := os.MkdirTemp("", "geolog-pgtest-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(owner), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	// A pid that is not running, and this process with a wrong start
	// time (its pid reused).
	dead := mk("2147483646 1")
	reused := mk(strconv.Itoa(os.Getpid()) + " 1")
	live := mk(ownerOf(os.Getpid()))
	reapOrphans(script)
	for _, dir := range []string{dead, reused} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("orphan %s not removed (%v)", dir, err)
		}
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live owner's folder was removed: %v", err)
	}
}
