// Package deploy holds the deployment files (compose, systemd, Prometheus,
// Grafana); its tests check them and the release they ship in.
package deploy

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRelease runs make release's script for one architecture and checks
// what it ships: the archive holds the three binaries, the docs and the
// deployment files; SHA256SUMS matches every file; the binaries in the
// archive say the release's version; two runs give the same archive.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release")
	}
	out := t.TempDir()
	release := func(dir string) {
		cmd := exec.Command("./scripts/release.sh")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "VERSION=v0.0.0-test", "ARCHES=amd64", "OUT="+dir, "IMAGE=0", "SOURCE_DATE_EPOCH=1700000000")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("release.sh: %v\n%s", err, b)
		}
	}
	release(out)
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(sums)), "\n")
	if len(lines) != 1 {
		t.Fatalf("SHA256SUMS: %q", sums)
	}
	for _, line := range lines {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		data, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		got := sha256.Sum256(data)
		if hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s", name, got, sum)
		}
	}
	archive := filepath.Join(out, "geolog-v0.0.0-test-linux-amd64.tar.gz")
	unpacked := t.TempDir()
	files := untar(t, archive, unpacked)
	for _, want := range []string{"geologd", "geolog", "geolog-wan", "README.md", "docs/design.md", "deploy/systemd/geologd.service", "deploy/compose/three-regions.yml"} {
		if !files["geolog-v0.0.0-test-linux-amd64/"+want] {
			t.Errorf("archive lacks %s", want)
		}
	}
	bin := filepath.Join(unpacked, "geolog-v0.0.0-test-linux-amd64")
	if b, err := exec.Command(filepath.Join(bin, "geologd"), "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(b), "geologd v0.0.0-test (commit ") {
		t.Errorf("geologd --version: %q, %v", b, err)
	}
	if b, err := exec.Command(filepath.Join(bin, "geolog"), "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(b), "geolog v0.0.0-test (commit ") {
		t.Errorf("geolog version: %q, %v", b, err)
	}
	again := t.TempDir()
	release(again)
	if a, b := readFile(t, filepath.Join(out, "SHA256SUMS")), readFile(t, filepath.Join(again, "SHA256SUMS")); a != b {
		t.Errorf("two releases of one commit differ:\n%s\n%s", a, b)
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// untar unpacks a .tar.gz into dir and returns the names of its regular
// files.
func untar(t *testing.T, archive, dir string) map[string]bool {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if strings.Contains(h.Name, "..") || filepath.IsAbs(h.Name) {
			t.Fatalf("archive entry %q escapes its folder", h.Name)
		}
		files[h.Name] = true
		p := filepath.Join(dir, h.Name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(w, tr); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
}
