package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/geolog/geolog/atrest"
)

// TestKeysCommands drives geolog keys on a data directory: add-kek makes
// a KEK file (0600), the first list needs a keyring, rotate adds an
// active key, add-kek and rewrap move every key under the new KEK, and
// remove-kek then drops the old one, after which the keys still open.
func TestKeysCommands(t *testing.T) {
	ctx := context.Background()
	dataDir, kekFile := t.TempDir(), filepath.Join(t.TempDir(), "kek.json")
	if _, _, code := run(t, ctx, "", "keys", "add-kek", "--kek-file", kekFile); code != 0 {
		t.Fatal("add-kek failed")
	}
	if st, err := os.Stat(kekFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("KEK file: %v %v", st, err)
	}
	// No keyring yet: list fails and says so.
	if _, stderr, code := run(t, ctx, "", "keys", "list", "--data-dir", dataDir, "--kek-file", kekFile); code == 0 || !strings.Contains(stderr, "no keyring") {
		t.Fatalf("list without a keyring: code %d, %q", code, stderr)
	}
	// A node's first start creates the keyring; do what it does.
	kek, err := atrest.OpenKEKFile(kekFile)
	if err != nil {
		t.Fatal(err)
	}
	k, err := atrest.Open(ctx, atrest.Config{Dir: atrest.NodeKeysDir(dataDir), KEK: kek, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	first := k.Active()
	k.Close()

	list := func() []map[string]any {
		t.Helper()
		stdout, stderr, code := run(t, ctx, "", "keys", "list", "--data-dir", dataDir, "--kek-file", kekFile, "--json")
		if code != 0 {
			t.Fatalf("list: %s", stderr)
		}
		var keys []map[string]any
		if err := json.Unmarshal([]byte(stdout), &keys); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if _, stderr, code := run(t, ctx, "", "keys", "rotate", "--data-dir", dataDir, "--kek-file", kekFile); code != 0 {
		t.Fatalf("rotate: %s", stderr)
	}
	keys := list()
	if len(keys) != 2 || keys[0]["id"] != first.String() || keys[0]["active"] != false || keys[1]["active"] != true {
		t.Fatalf("after rotate: %v", keys)
	}
	oldKEK := keys[0]["kek"].(string)
	if _, _, code := run(t, ctx, "", "keys", "add-kek", "--kek-file", kekFile); code != 0 {
		t.Fatal("second add-kek failed")
	}
	// Rewrap moves every key under the new (current) KEK; only then may
	// the old one go.
	if stdout, stderr, code := run(t, ctx, "", "keys", "rewrap", "--data-dir", dataDir, "--kek-file", kekFile); code != 0 || !strings.Contains(stdout, "rewrapped 2") {
		t.Fatalf("rewrap: %q %q", stdout, stderr)
	}
	for _, key := range list() {
		if key["kek"] == oldKEK {
			t.Fatalf("key %v still under the old KEK", key["id"])
		}
	}
	if _, stderr, code := run(t, ctx, "", "keys", "remove-kek", "--kek-file", kekFile, "--kek", oldKEK); code != 0 {
		t.Fatalf("remove-kek: %s", stderr)
	}
	if keys := list(); len(keys) != 2 {
		t.Fatalf("after removing the old KEK: %v", keys)
	}
	// The current KEK cannot be removed.
	cur := list()[0]["kek"].(string)
	if _, _, code := run(t, ctx, "", "keys", "remove-kek", "--kek-file", kekFile, "--kek", cur); code == 0 {
		t.Fatal("removed the current KEK")
	}
}
