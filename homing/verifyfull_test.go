package homing

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/geolog/geolog/homing/pgtest"
	"github.com/geolog/geolog/pki"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestVerifiesServer(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want bool
	}{
		{"disable", false}, {"allow", false}, {"prefer", false}, {"require", false}, {"verify-ca", false}, {"verify-full", true},
	} {
		cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:5432/db?sslmode=" + tc.mode)
		if err != nil {
			t.Fatal(err)
		}
		if got := verifiesServer(&cfg.ConnConfig.Config); got != tc.want {
			t.Errorf("sslmode=%s: verifiesServer %v, want %v", tc.mode, got, tc.want)
		}
	}
	// Without sslmode pgx prefers TLS and falls back to plaintext.
	cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:5432/db")
	if err != nil {
		t.Fatal(err)
	}
	if verifiesServer(&cfg.ConnConfig.Config) {
		t.Error("a URL without sslmode passes")
	}
}

// TestLeaseStoreTLS: the test PostgreSQL (scripts/pg.sh) serves TLS; the
// lease store is reached with sslmode=verify-full, refused with a CA that
// did not sign the server's certificate, refused in plaintext by the
// server, and a URL that would allow plaintext is refused before any
// connection when verify-full is required.
func TestLeaseStoreTLS(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if q := u.Query(); q.Get("sslmode") != "verify-full" || q.Get("sslrootcert") == "" {
		t.Fatalf("the test PostgreSQL's URL %s does not ask for sslmode=verify-full with a CA (scripts/pg.sh serves TLS; a GEOLOG_PG_URL must too)", dbURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	with := func(mut func(url.Values)) string {
		v := u.Query()
		mut(v)
		c := *u
		c.RawQuery = v.Encode()
		return c.String()
	}
	open := func(url string, require bool) error {
		s, err := OpenSQL(ctx, SQLConfig{URL: url, RequireVerifyFull: require, ConnectTimeout: 10 * time.Second})
		if err == nil {
			s.Close()
		}
		return err
	}
	if err := open(dbURL, true); err != nil {
		t.Fatalf("verify-full: %v", err)
	}
	ca, err := pki.CreateCA("another CA", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(otherCA, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open(with(func(v url.Values) { v.Set("sslrootcert", otherCA) }), true); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("a CA that did not sign the server: %v, want ErrStoreUnavailable", err)
	}
	plain := with(func(v url.Values) { v.Set("sslmode", "disable"); v.Del("sslrootcert") })
	if err := open(plain, false); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("plaintext: %v, want the server's refusal", err)
	}
	for _, mode := range []string{"disable", "prefer", "require", "verify-ca"} {
		err := open(with(func(v url.Values) { v.Set("sslmode", mode) }), true)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("sslmode=%s with verify-full required: %v, want ErrInvalidArgument", mode, err)
		}
	}
}
