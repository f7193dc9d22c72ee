package cli_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/pki"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
)

// TestACLCommands: root (superuser) adds, lists (table and JSON) and
// removes rules; alice may produce while her rule is in force and not
// after (a producer needs describe too, to learn the ranges); alice
// may not change rules; a bad permission is refused; with
// --token (or GEOLOG_TOKEN) alice's calls are the token's principal's,
// and a token without TLS is a usage error.
func TestACLCommands(t *testing.T) {
	ctx := testCtx(t)
	caDir, nodeDir, rootDir := makePKI(t, "root")
	aliceDir := filepath.Join(t.TempDir(), "alice")
	if out, errOut, code := run(t, ctx, "", "certs", "create-client", "--certs-dir", aliceDir,
		"--ca-cert", filepath.Join(caDir, "ca.crt"), "--ca-key", filepath.Join(caDir, "ca.key"), "alice"); code != 0 {
		t.Fatalf("create-client: %d %s%s", code, out, errOut)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	tokens, err := authz.NewTokenVerifier(authz.TokenConfig{KeysPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})})
	if err != nil {
		t.Fatal(err)
	}
	files, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(nodeDir, "ca.crt"),
		CertFile: filepath.Join(nodeDir, "node.crt"), KeyFile: filepath.Join(nodeDir, "node.key")})
	if err != nil {
		t.Fatal(err)
	}
	n, err := regionsvc.New(regionsvc.Config{DataDir: t.TempDir(), ListenAddr: "127.0.0.1:0", Fsync: segment.FsyncNever,
		TLS: files.ServerTLS(), Authz: &authz.Policy{Superusers: []string{"root"}}, Tokens: tokens,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: tWriter{t}})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	as := func(dir string, args ...string) (string, string, int) {
		return run(t, ctx, "", append([]string{"--addr", n.Addr(), "--certs-dir", dir, "--retries", "0", "--timeout", "10s"}, args...)...)
	}
	must := func(dir string, args ...string) string {
		t.Helper()
		out, errOut, code := as(dir, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	must(rootDir, "streams", "create", "orders")
	if _, errOut, code := as(aliceDir, "produce", "orders", "--value", "a"); code == 0 || !strings.Contains(errOut, "PERMISSION_DENIED") {
		t.Fatalf("alice produced without a rule: %d %s", code, errOut)
	}
	var added []map[string]any
	if err := json.Unmarshal([]byte(must(rootDir, "acl", "add", "alice", "orders", "produce,consume,describe", "--json")), &added); err != nil {
		t.Fatal(err)
	}
	if len(added) != 1 || added[0]["principal"] != "alice" || added[0]["changed_in_region"] == "" {
		t.Fatalf("add --json: %v", added)
	}
	must(rootDir, "acl", "add", "jwt:ci-*", "ord*", "produce,describe")
	table := must(rootDir, "acl", "list")
	if !strings.Contains(table, "PRINCIPAL") || !hasRow(table, "alice", "orders", "produce,consume,describe") || !hasRow(table, "jwt:ci-*", "ord*", "produce,describe") {
		t.Fatalf("list:\n%s", table)
	}
	must(aliceDir, "produce", "orders", "--value", "a")
	if _, errOut, code := as(aliceDir, "acl", "add", "alice", "orders", "admin"); code == 0 || !strings.Contains(errOut, "PERMISSION_DENIED") {
		t.Fatalf("alice changed a rule: %d %s", code, errOut)
	}
	if _, errOut, code := as(rootDir, "acl", "add", "alice", "orders", "write"); code == 0 || !strings.Contains(errOut, "INVALID_ARGUMENT") {
		t.Fatalf("a bad permission: %d %s", code, errOut)
	}
	if out := must(rootDir, "acl", "remove", "alice", "orders"); !strings.Contains(out, "removed") {
		t.Fatalf("remove: %s", out)
	}
	if _, errOut, code := as(aliceDir, "produce", "orders", "--value", "b"); code == 0 || !strings.Contains(errOut, "PERMISSION_DENIED") {
		t.Fatalf("alice produced after her rule was removed: %d %s", code, errOut)
	}
	var listed []map[string]any
	if err := json.Unmarshal([]byte(must(rootDir, "acl", "list", "--resource", "ord*", "--json")), &listed); err != nil || len(listed) != 1 {
		t.Fatalf("list --json after the removal: %v %v", listed, err)
	}

	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": "ci-1", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	must(aliceDir, "--token", tok, "produce", "orders", "--value", "by ci-1")
	t.Setenv("GEOLOG_TOKEN", tok)
	must(aliceDir, "produce", "orders", "--value", "by ci-1 again")
	if _, errOut, code := as(aliceDir, "--token", tok+"x", "produce", "orders", "--value", "forged"); code == 0 || !strings.Contains(errOut, "UNAUTHENTICATED") {
		t.Fatalf("a forged token: %d %s", code, errOut)
	}
	if _, _, code := run(t, ctx, "", "--addr", n.Addr(), "--token", tok, "acl", "list"); code != 2 {
		t.Fatalf("--token without TLS: exit %d, want 2", code)
	}
}

// hasRow reports whether a line of out begins with the fields.
func hasRow(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= len(fields) && equalPrefix(f, fields) {
			return true
		}
	}
	return false
}

func equalPrefix(have, want []string) bool {
	for i := range want {
		if have[i] != want[i] {
			return false
		}
	}
	return true
}
