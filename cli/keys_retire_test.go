package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
)

// TestKeysRetire: geolog keys retire refuses a data key that a segment
// log of the data directory still holds a frame under, and the active
// key; once no file does, it removes the key from the keyring.
func TestKeysRetire(t *testing.T) {
	ctx := context.Background()
	dataDir, kekFile := t.TempDir(), filepath.Join(t.TempDir(), "kek.json")
	if _, _, code := run(t, ctx, "", "keys", "add-kek", "--kek-file", kekFile); code != 0 {
		t.Fatal("add-kek failed")
	}
	kek, err := atrest.OpenKEKFile(kekFile)
	if err != nil {
		t.Fatal(err)
	}
	k, err := atrest.Open(ctx, atrest.Config{Dir: atrest.NodeKeysDir(dataDir), KEK: kek, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	first := k.Active()
	frame := batch.Encode(nil, batch.Header{BaseOffset: 0, Epoch: 1}, []batch.Record{{Value: []byte("v")}})
	log := filepath.Join(dataDir, "streams", "s", "00000", "00000000000000000000.log")
	if err := os.MkdirAll(filepath.Dir(log), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(log, append(k.Seal(nil, frame), k.Seal(nil, frame)...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	second := k.Active()
	k.Close()
	retire := func(id atrest.KeyID) (string, string, int) {
		return run(t, ctx, "", "keys", "retire", "--data-dir", dataDir, "--kek-file", kekFile, "--key", id.String())
	}
	if _, stderr, code := retire(first); code == 0 || !strings.Contains(stderr, "still seals") || !strings.Contains(stderr, "2 frames") {
		t.Fatalf("retire of a key in use: code %d, %q", code, stderr)
	}
	if _, stderr, code := retire(second); code == 0 || !strings.Contains(stderr, "active") {
		t.Fatalf("retire of the active key: code %d, %q", code, stderr)
	}
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := retire(first); code != 0 || !strings.Contains(stdout, "retired data key "+first.String()) {
		t.Fatalf("retire: code %d, %q %q", code, stdout, stderr)
	}
	stdout, _, code := run(t, ctx, "", "keys", "list", "--data-dir", dataDir, "--kek-file", kekFile)
	if code != 0 || strings.Contains(stdout, first.String()) || !strings.Contains(stdout, second.String()) {
		t.Fatalf("list after retire: %q", stdout)
	}
}
