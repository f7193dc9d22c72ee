package homing

import (
	"testing"

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
