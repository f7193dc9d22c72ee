package image

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// buildStatic builds the static binaries the image holds.
func buildStatic(t *testing.T, dir string) {
	t.Helper()
	// -trimpath and CGO_ENABLED=0, as make release builds: the two tests
	// share one compilation.
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "github.com/geolog/geolog/cmd/geologd", "github.com/geolog/geolog/cmd/geolog")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

// TestImageRuns builds the image, writes it as a tarball and as an OCI
// layout, reads the tarball back as docker load would, unpacks its file
// system, checks the files, the user and the entrypoint, and runs the
// unpacked geologd and geolog.
func TestImageRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := t.TempDir()
	buildStatic(t, bin)
	img, err := Build(Config{Binaries: map[string]string{"geologd": bin + "/geologd", "geolog": bin + "/geolog"}, Version: "v0.0.0-test", Revision: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(Config{Binaries: map[string]string{"geologd": bin + "/geologd", "geolog": bin + "/geolog"}, Version: "v0.0.0-test", Revision: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := digestOf(t, img), digestOf(t, again); a != b {
		t.Fatalf("two builds of the same binaries differ: %s, %s", a, b)
	}
	out := filepath.Join(t.TempDir(), "geolog.tar")
	if err := WriteTarball(img, "geolog:test", out); err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(t.TempDir(), "oci")
	if err := WriteLayout(img, "geolog:test", lay); err != nil {
		t.Fatal(err)
	}
	if p, err := layout.FromPath(lay); err != nil {
		t.Fatal(err)
	} else if idx, err := p.ImageIndex(); err != nil {
		t.Fatal(err)
	} else if m, err := idx.IndexManifest(); err != nil || len(m.Manifests) != 1 {
		t.Fatalf("layout index: %v, %+v", err, m)
	}

	loaded, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A docker tarball keeps the config and the layers (its manifest is
	// the loader's): those are what must match.
	want, _ := img.ConfigName()
	if got, err := loaded.ConfigName(); err != nil || got != want {
		t.Fatalf("tarball config %v (%v), built %v", got, err, want)
	}
	wl, _ := img.Layers()
	ll, err := loaded.Layers()
	if err != nil || len(ll) != 1 || len(wl) != 1 {
		t.Fatalf("layers: %d loaded (%v), %d built", len(ll), err, len(wl))
	}
	if a, _ := wl[0].DiffID(); true {
		if b, _ := ll[0].DiffID(); a != b {
			t.Fatalf("layer %v loaded, %v built", b, a)
		}
	}
	cf, err := loaded.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/usr/local/bin/geologd" ||
		cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.Labels["org.opencontainers.image.version"] != "v0.0.0-test" {
		t.Fatalf("config %+v", cf)
	}
	if _, ok := cf.Config.Volumes[DataDir]; !ok {
		t.Fatalf("no %s volume: %+v", DataDir, cf.Config.Volumes)
	}

	root := t.TempDir()
	modes := map[string]int64{}
	owners := map[string]int{}
	tr := tar.NewReader(mutate.Extract(loaded))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		modes[name], owners[name] = h.Mode, h.Uid
		if h.Typeflag == tar.TypeReg {
			p := filepath.Join(root, name)
			os.MkdirAll(filepath.Dir(p), 0o755)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	for name, mode := range map[string]int64{"usr/local/bin/geologd": 0o755, "usr/local/bin/geolog": 0o755, "data": 0o700, "etc/passwd": 0o644, "tmp": 0o1777} {
		if modes[name] != mode {
			t.Errorf("%s: mode %o, want %o", name, modes[name], mode)
		}
	}
	if owners["data"] != UID {
		t.Errorf("/data owned by %d, want %d", owners["data"], UID)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "geolog:x:65532:65532:") {
		t.Errorf("/etc/passwd: %q", passwd)
	}
	for _, b := range []string{"geologd", "geolog"} {
		out, err := exec.Command(filepath.Join(root, "usr/local/bin", b), "--version").CombinedOutput()
		if b == "geolog" {
			out, err = exec.Command(filepath.Join(root, "usr/local/bin", b), "version").CombinedOutput()
		}
		if err != nil || !strings.HasPrefix(string(out), b+" ") {
			t.Errorf("unpacked %s: %q, %v", b, out, err)
		}
	}
	// The unpacked node starts on the image's own default arguments
	// (Cmd), with a data folder standing in for the volume.
	args := append([]string(nil), cf.Config.Cmd...)
	for i := range args {
		if args[i] == DataDir {
			args[i] = t.TempDir()
		}
		if args[i] == "0.0.0.0:7400" {
			args[i] = "127.0.0.1:0"
		}
	}
	node := exec.Command(filepath.Join(root, "usr/local/bin/geologd"), append(args, "--insecure")...)
	stderr, _ := node.StderrPipe()
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	defer node.Process.Kill()
	buf := make([]byte, 64<<10)
	var log strings.Builder
	for !strings.Contains(log.String(), "node opened") {
		n, err := stderr.Read(buf)
		log.Write(buf[:n])
		if err != nil {
			t.Fatalf("the unpacked geologd ended before it opened: %v\n%s", err, log.String())
		}
	}
}

// TestBuildRefusesBadInput: a missing geologd, a file that is not an
// executable, or a name with a path is refused.
func TestBuildRefusesBadInput(t *testing.T) {
	notELF := filepath.Join(t.TempDir(), "x")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	for _, bins := range []map[string]string{
		{"geolog": notELF},
		{"geologd": notELF},
		{"geologd": "/nonexistent"},
		{"geologd": os.Args[0], "../x": os.Args[0]},
	} {
		if _, err := Build(Config{Binaries: bins}); err == nil {
			t.Errorf("Build(%v): no error", bins)
		}
	}
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
