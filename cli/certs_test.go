package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/geolog/geolog/client/clienttest"
	"github.com/geolog/geolog/pki"
)

// makePKI runs geolog certs to make a CA, a node folder for 127.0.0.1 and
// a client folder for principal; it returns the three folders.
func makePKI(t *testing.T, principal string) (caDir, nodeDir, clientDir string) {
	t.Helper()
	ctx := testCtx(t)
	root := t.TempDir()
	caDir, nodeDir, clientDir = filepath.Join(root, "ca"), filepath.Join(root, "node"), filepath.Join(root, "client")
	caFlags := []string{"--ca-cert", filepath.Join(caDir, "ca.crt"), "--ca-key", filepath.Join(caDir, "ca.key")}
	for _, args := range [][]string{
		{"certs", "create-ca", "--certs-dir", caDir},
		append(append([]string{"certs", "create-node", "--certs-dir", nodeDir, "--region", "us", "--node-id", "1"}, caFlags...), "127.0.0.1", "localhost"),
		append(append([]string{"certs", "create-client", "--certs-dir", clientDir}, caFlags...), principal),
	} {
		if out, errOut, code := run(t, ctx, "", args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	return caDir, nodeDir, clientDir
}

func TestCertsFiles(t *testing.T) {
	caDir, nodeDir, clientDir := makePKI(t, "alice")
	for _, f := range []string{
		filepath.Join(caDir, "ca.crt"), filepath.Join(caDir, "ca.key"),
		filepath.Join(nodeDir, "ca.crt"), filepath.Join(nodeDir, "node.crt"), filepath.Join(nodeDir, "node.key"),
		filepath.Join(clientDir, "ca.crt"), filepath.Join(clientDir, "client.crt"), filepath.Join(clientDir, "client.key"),
	} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	node, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(nodeDir, "ca.crt"),
		CertFile: filepath.Join(nodeDir, "node.crt"), KeyFile: filepath.Join(nodeDir, "node.key")})
	if err != nil {
		t.Fatal(err)
	}
	if node.Identity() != pki.NodeIdentity("us", 1) {
		t.Fatalf("node identity %v", node.Identity())
	}
	cl, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(clientDir, "ca.crt"),
		CertFile: filepath.Join(clientDir, "client.crt"), KeyFile: filepath.Join(clientDir, "client.key")})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Identity() != pki.ClientIdentity("alice") {
		t.Fatalf("client identity %v", cl.Identity())
	}

	// Nothing is overwritten without --overwrite.
	ctx := testCtx(t)
	before, _ := os.ReadFile(filepath.Join(caDir, "ca.key"))
	if _, errOut, code := run(t, ctx, "", "certs", "create-ca", "--certs-dir", caDir); code == 0 || !strings.Contains(errOut, "--overwrite") {
		t.Fatalf("create-ca over an existing CA: exit %d, %q", code, errOut)
	}
	if after, _ := os.ReadFile(filepath.Join(caDir, "ca.key")); string(after) != string(before) {
		t.Fatal("a refused create-ca changed the CA key")
	}
	caFlags := []string{"--ca-cert", filepath.Join(caDir, "ca.crt"), "--ca-key", filepath.Join(caDir, "ca.key")}
	args := append(append([]string{"certs", "create-client", "--certs-dir", clientDir}, caFlags...), "bob")
	if _, _, code := run(t, ctx, "", args...); code == 0 {
		t.Fatal("create-client over an existing client certificate succeeded")
	}
	args = append(append([]string{"certs", "create-client", "--overwrite", "--certs-dir", clientDir}, caFlags...), "bob")
	if out, errOut, code := run(t, ctx, "", args...); code != 0 || !strings.Contains(out, "geolog://client/bob") {
		t.Fatalf("create-client --overwrite: exit %d\n%s%s", code, out, errOut)
	}

	// Bad input is a usage error.
	for _, bad := range [][]string{
		{"certs", "create-node", "--certs-dir", t.TempDir(), "--region", "us", "--node-id", "x", "localhost"},
		{"certs", "create-node", "--certs-dir", t.TempDir(), "--region", "us", "--node-id", "1"},
		{"certs", "create-client", "--certs-dir", t.TempDir()},
		{"certs", "create-ca"},
		{"certs", "rotate"},
	} {
		if _, _, code := run(t, ctx, "", bad...); code != 2 {
			t.Errorf("%v: exit %d, want 2", bad, code)
		}
	}
}

// TestCLIDialsWithCertsDir: a node that requires client certificates is
// reached with --certs-dir or GEOLOG_CERTS_DIR, and refused without, or
// with a client certificate of another CA.
func TestCLIDialsWithCertsDir(t *testing.T) {
	_, nodeDir, clientDir := makePKI(t, "alice")
	_, _, otherClient := makePKI(t, "alice")
	node, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(nodeDir, "ca.crt"),
		CertFile: filepath.Join(nodeDir, "node.crt"), KeyFile: filepath.Join(nodeDir, "node.key")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := clienttest.Start(clienttest.Config{TLS: node.ServerTLS()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := testCtx(t)
	list := func(extra ...string) (string, int) {
		args := append([]string{"--addr", s.Addr(), "--retries", "0", "--timeout", "5s"}, extra...)
		_, errOut, code := run(t, ctx, "", append(args, "streams", "list")...)
		return errOut, code
	}
	if errOut, code := list("--certs-dir", clientDir); code != 0 {
		t.Fatalf("with --certs-dir: exit %d: %s", code, errOut)
	}
	if _, code := list(); code == 0 {
		t.Fatal("plaintext reached a TLS node")
	}
	if _, code := list("--certs-dir", otherClient); code == 0 {
		t.Fatal("a client of another CA was accepted")
	}
	// Only the CA: the node wants a client certificate.
	if _, code := list("--tls-ca", filepath.Join(clientDir, "ca.crt")); code == 0 {
		t.Fatal("a client without a certificate was accepted")
	}
	// The server name is checked: the node's certificate does not carry
	// this one.
	if _, code := list("--certs-dir", clientDir, "--tls-server-name", "elsewhere.example"); code == 0 {
		t.Fatal("a wrong server name was accepted")
	}
	t.Setenv("GEOLOG_CERTS_DIR", clientDir)
	if errOut, code := list(); code != 0 {
		t.Fatalf("with GEOLOG_CERTS_DIR: exit %d: %s", code, errOut)
	}
}
