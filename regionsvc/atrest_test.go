package regionsvc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/atrest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// atRestMarker is a record value that must never lie in the clear under
// a data directory with encryption at rest on.
const atRestMarker = "CARD-4111-1111-1111-1111"

// newKEKFile makes a KEK file in a directory of its own (never the data
// directory) and returns its path and provider.
func newKEKFile(t *testing.T) (string, atrest.KEKProvider) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kek.json")
	if _, err := atrest.AddKEK(path); err != nil {
		t.Fatal(err)
	}
	kek, err := atrest.OpenKEKFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, kek
}

// grepTree fails t if a file under dir holds one of needles, and if a
// file or directory is open to group or others.
func grepTree(t *testing.T, dir string, needles ...[]byte) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if info.Mode().Perm()&0o077 != 0 && filepath.Base(p) != "LOCK" {
			t.Errorf("%s is mode %v", p, info.Mode().Perm())
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, needle := range needles {
			if bytes.Contains(b, needle) {
				t.Errorf("%s holds the plaintext %q", p, needle)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAtRestNode runs a node with encryption at rest on: records written
// through appends, segment rolls and compaction by key are nowhere in the
// clear under the data directory and read back whole after a restart;
// and a restart with the wrong KEK, without one, or with a keyring that
// lacks the data keys refuses to start with an error that says so.
func TestAtRestNode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, kek := newKEKFile(t)
	withKEK := func(k atrest.KEKProvider) func(*Config) {
		return func(cfg *Config) {
			compactingNode()(cfg)
			cfg.KEK = k
		}
	}
	n, c := testNode(t, dir, withKEK(kek))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "kv", RangeCount: 1,
		Cleanup:    geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT,
		Compaction: &geologv1.CompactionPolicy{DeleteRetentionMs: -1, MinLagMs: -1}})
	if err != nil {
		t.Fatal(err)
	}
	createStream(t, c, "s", 1) // one range: every key belongs to range 0
	for i := range 60 {
		var rs []*geologv1.Record
		for j := range 5 {
			rs = append(rs, &geologv1.Record{Key: fmt.Appendf(nil, "k%d", j),
				Value: fmt.Appendf(nil, "%s-%d-%d-%s", atRestMarker, i, j, bytes.Repeat([]byte("x"), 100))})
		}
		for _, stream := range []string{"kv", "s"} {
			if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: stream, Range: 0, Records: rs}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Compaction by key rewrites sealed segments: wait until it has.
	deadline := time.Now().Add(time.Minute)
	for len(readRange(t, ctx, c, "kv", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0)) > 100 {
		if time.Now().After(deadline) {
			t.Fatal("compaction did not run within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := readRange(t, ctx, c, "s", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0)
	if len(want) != 300 {
		t.Fatalf("%d records in s", len(want))
	}
	// The frame form sends the frames opened.
	if got := readRangeForm(t, ctx, c, "s", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0, true); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("frame form: %d records, records form %d", len(got), len(want))
	}
	n.Close()
	grepTree(t, dir, []byte(atRestMarker))

	// Refusals: each is an error from New, and changes nothing.
	_, otherKEK := newKEKFile(t)
	for _, tc := range []struct {
		name string
		kek  atrest.KEKProvider
		want error
	}{
		{"another KEK file", otherKEK, atrest.ErrKEKUnavailable},
		{"no KEK", nil, ErrKEKRequired},
	} {
		_, err := New(Config{DataDir: dir, ListenAddr: "127.0.0.1:0", KEK: tc.kek, Logger: hclog.NewNullLogger()})
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: New = %v, want %v", tc.name, err, tc.want)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	// A keyring that lacks the data keys (the old one set aside, a new one
	// made): the first range sealed under a lost key stops startup.
	keys := KeysDir(dir)
	if err := os.Rename(keys, keys+".aside"); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{DataDir: dir, ListenAddr: "127.0.0.1:0", KEK: kek, Logger: hclog.NewNullLogger()})
	if !errors.Is(err, atrest.ErrKeyUnavailable) {
		t.Fatalf("lost keyring: New = %v", err)
	}
	t.Logf("lost keyring: %v", err)
	if err := os.RemoveAll(keys); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(keys+".aside", keys); err != nil {
		t.Fatal(err)
	}

	_, c = testNode(t, dir, withKEK(kek))
	if got := readRange(t, ctx, c, "s", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after restart s reads %d records, want %d", len(got), len(want))
	}
	if got := readRange(t, ctx, c, "kv", 0, geologv1.Consistency_CONSISTENCY_LOCAL, 0); len(got) == 0 || len(got) > 100 {
		t.Fatalf("after restart kv reads %d records", len(got))
	}
}
