package e2e

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestKeyringScopes(t *testing.T) {
	r := NewKeyring()
	stream1, stream2 := mustKey(t, "chat/1"), mustKey(t, "chat/2")
	own := mustKey(t, "room-1/1")
	if err := r.AddStream("chat", stream1); err != nil {
		t.Fatal(err)
	}
	if err := r.AddStream("chat", stream2); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("chat", []byte("room-1"), own); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stream, conv, wantCurrent string
	}{
		{"chat", "room-1", "room-1/1"},
		{"chat", "room-2", "chat/2"},
		{"chat", "", "chat/2"},
		{"other", "room-1", ""},
	} {
		k, err := r.CurrentKey(tc.stream, []byte(tc.conv))
		if tc.wantCurrent == "" {
			if !errors.Is(err, ErrUnknownKey) {
				t.Errorf("%s/%s: current %q, %v; want ErrUnknownKey", tc.stream, tc.conv, k.ID, err)
			}
			continue
		}
		if err != nil || k.ID != tc.wantCurrent {
			t.Errorf("%s/%s: current %q, %v; want %q", tc.stream, tc.conv, k.ID, err, tc.wantCurrent)
		}
	}
	// room-1 still opens records sealed under the stream keys before it
	// got its own; room-2 does not open room-1's.
	for _, id := range []string{"chat/1", "chat/2", "room-1/1"} {
		if _, err := r.Key("chat", []byte("room-1"), id); err != nil {
			t.Errorf("room-1 key %s: %v", id, err)
		}
	}
	if _, err := r.Key("chat", []byte("room-2"), "room-1/1"); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("room-2 opening with room-1's key: %v", err)
	}
	if _, err := r.Key("other", []byte("room-1"), "room-1/1"); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("another stream: %v", err)
	}
}

func TestKeyringRefusesBadKeys(t *testing.T) {
	r := NewKeyring()
	k := mustKey(t, "k")
	if err := r.Add("s", []byte("c"), k); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("s", []byte("c"), mustKey(t, "k")); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := r.Add("s", []byte("c2"), k); err != nil {
		t.Fatalf("the same key in another conversation: %v", err)
	}
	for _, bad := range []Key{
		{ID: "", Secret: make([]byte, 32)},
		{ID: strings.Repeat("x", 256), Secret: make([]byte, 32)},
		{ID: "k2", Secret: make([]byte, 31)},
		{ID: "k2"},
	} {
		if err := r.Add("s", []byte("c"), bad); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("key id %d bytes, secret %d bytes: %v", len(bad.ID), len(bad.Secret), err)
		}
	}
	// The keyring keeps its own copy of a secret.
	k3 := mustKey(t, "k3")
	r.Add("s", []byte("c"), k3)
	orig := bytes.Clone(k3.Secret)
	k3.Secret[0] ^= 0xff
	got, _ := r.CurrentKey("s", []byte("c"))
	if !bytes.Equal(got.Secret, orig) {
		t.Fatal("the keyring shares the caller's secret")
	}
}

func TestKeyFileRoundTrip(t *testing.T) {
	r := NewKeyring()
	keys := []Key{mustKey(t, "room-1/1"), mustKey(t, "room-1/2"), mustKey(t, "bin/1"), mustKey(t, "all/1")}
	r.Add("chat", []byte("room-1"), keys[0])
	r.Add("chat", []byte("room-1"), keys[1])
	r.Add("chat", []byte{0xff, 0x00, 0xfe}, keys[2]) // not UTF-8
	r.AddStream("chat", keys[3])
	path := filepath.Join(t.TempDir(), "keys.json")
	if err := WriteKeyFile(path, r); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	got, err := ReadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		conv    []byte
		current Key
	}{{[]byte("room-1"), keys[1]}, {[]byte{0xff, 0x00, 0xfe}, keys[2]}, {[]byte("room-7"), keys[3]}} {
		k, err := got.CurrentKey("chat", tc.conv)
		if err != nil || k.ID != tc.current.ID || !bytes.Equal(k.Secret, tc.current.Secret) {
			t.Errorf("conversation %q: current %q, %v; want %q with its secret", tc.conv, k.ID, err, tc.current.ID)
		}
	}
	if k, err := got.Key("chat", []byte("room-1"), "room-1/1"); err != nil || !bytes.Equal(k.Secret, keys[0].Secret) {
		t.Errorf("old key: %v", err)
	}
	b, _ := os.ReadFile(path)
	if !bytes.Contains(b, []byte(`"conversation_base64": "/wD+"`)) {
		t.Errorf("binary conversation not in base64:\n%s", b)
	}
}

func TestReadKeyFileRefuses(t *testing.T) {
	dir := t.TempDir()
	secret := `"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="`
	for _, tc := range []struct {
		name, body string
		mode       os.FileMode
		want       error
	}{
		{"group readable", `{"version":1,"keys":[]}`, 0o640, ErrKeyFilePermissions},
		{"world readable", `{"version":1,"keys":[]}`, 0o604, ErrKeyFilePermissions},
		{"version 2", `{"version":2,"keys":[]}`, 0o600, ErrUnsupported},
		{"short secret", `{"version":1,"keys":[{"stream":"s","id":"k","secret":"AAAA"}]}`, 0o600, ErrInvalidKey},
		{"bad base64", `{"version":1,"keys":[{"stream":"s","id":"k","secret":"!!"}]}`, 0o600, ErrInvalidKey},
		{"duplicate", `{"version":1,"keys":[{"stream":"s","id":"k","secret":` + secret + `},{"stream":"s","id":"k","secret":` + secret + `}]}`, 0o600, ErrDuplicateKey},
		{"both conversations", `{"version":1,"keys":[{"stream":"s","conversation":"a","conversation_base64":"YQ==","id":"k","secret":` + secret + `}]}`, 0o600, nil},
		{"stream-wide with a conversation", `{"version":1,"keys":[{"stream":"s","conversation":"a","all_conversations":true,"id":"k","secret":` + secret + `}]}`, 0o600, nil},
		{"not JSON", `version = 1`, 0o600, nil},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		if err := os.WriteFile(path, []byte(tc.body), tc.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, tc.mode) // past the umask
		r, err := ReadKeyFile(path)
		if err == nil || r != nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want an error wrapping %v", tc.name, err, tc.want)
		}
	}
	if _, err := ReadKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestKeyFileReloadsOnUnknownID: a consumer's KeyFile picks up a key that
// another process added to the file when a record names it.
func TestKeyFileReloadsOnUnknownID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	writer := NewKeyring()
	k1, k2 := mustKey(t, "room-1/1"), mustKey(t, "room-1/2")
	writer.Add("chat", []byte("room-1"), k1)
	if err := WriteKeyFile(path, writer); err != nil {
		t.Fatal(err)
	}
	kf, err := OpenKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kf.reloadInterval = 0
	writer.Add("chat", []byte("room-1"), k2)
	if err := WriteKeyFile(path, writer); err != nil {
		t.Fatal(err)
	}
	// The current key moves only on a reload; the lookup of k2 reloads.
	if cur, _ := kf.CurrentKey("chat", []byte("room-1")); cur.ID != "room-1/1" {
		t.Fatalf("current before a reload: %q", cur.ID)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if k, err := kf.Key("chat", []byte("room-1"), "room-1/2"); err != nil || !bytes.Equal(k.Secret, k2.Secret) {
				t.Errorf("new key after the file changed: %v", err)
			}
		}()
	}
	wg.Wait()
	if cur, _ := kf.CurrentKey("chat", []byte("room-1")); cur.ID != "room-1/2" {
		t.Fatalf("current after the reload: %q", cur.ID)
	}
	// A broken file keeps the keys loaded before.
	os.WriteFile(path, []byte("garbage"), 0o600)
	if err := kf.Reload(); err == nil {
		t.Fatal("reload of a broken file succeeded")
	}
	if _, err := kf.Key("chat", []byte("room-1"), "room-1/1"); err != nil {
		t.Fatalf("keys lost after a failed reload: %v", err)
	}
	// Within the interval an unknown id does not reread the file (an hour
	// here, so that a stalled test cannot pass it).
	kf.reloadInterval = time.Hour
	writer.Add("chat", []byte("room-1"), mustKey(t, "room-1/3"))
	WriteKeyFile(path, writer)
	kf.Reload()
	writer.Add("chat", []byte("room-1"), mustKey(t, "room-1/4"))
	WriteKeyFile(path, writer)
	if _, err := kf.Key("chat", []byte("room-1"), "room-1/4"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("reloaded within the interval: %v", err)
	}
}
