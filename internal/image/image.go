// Package image builds geolog's container image without a container
// engine, as ko does: the static binaries go into one layer on an empty
// base, with a non-root user and a data volume, and the image is written as
// a tarball that `docker load` or `podman load` read, or as an OCI image
// layout that registries' tools (crane, skopeo) push.
//
// The image holds /usr/local/bin/geologd (the entrypoint) and
// /usr/local/bin/geolog, /etc/passwd and /etc/group naming the user
// geolog (65532), /data (the default --data-dir, owned by geolog, 0700) and
// /tmp. It is reproducible: every file's time is Config.Created.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// UID and GID are the image's user, geolog (the distroless "nonroot" id).
const (
	UID = 65532
	GID = 65532
)

// DataDir is the image's data volume and geologd's default --data-dir in it.
const DataDir = "/data"

// Config is what Build puts in the image.
type Config struct {
	// Binaries maps a name under /usr/local/bin to the file to copy there
	// (static Linux executables: CGO_ENABLED=0). geologd is required.
	Binaries map[string]string
	// OS and Arch are the platform of the binaries (default linux/amd64).
	OS, Arch string
	// Version and Revision label the image (org.opencontainers.image.*).
	Version, Revision string
	// Created is the time of the image and of every file in it; the zero
	// time means the Unix epoch (reproducible builds).
	Created time.Time
}

// Build returns the image for cfg.
func Build(cfg Config) (v1.Image, error) {
	if _, ok := cfg.Binaries["geologd"]; !ok {
		return nil, fmt.Errorf("image: no geologd binary given")
	}
	if cfg.OS == "" {
		cfg.OS = "linux"
	}
	if cfg.Arch == "" {
		cfg.Arch = "amd64"
	}
	if cfg.Created.IsZero() {
		cfg.Created = time.Unix(0, 0)
	}
	layerTar, err := rootfs(cfg)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{CreatedBy: "geolog internal/image", Created: v1.Time{Time: cfg.Created}},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = cfg.OS, cfg.Arch
	cf.Created = v1.Time{Time: cfg.Created}
	cf.Config.Entrypoint = []string{"/usr/local/bin/geologd"}
	cf.Config.Cmd = []string{"--data-dir", DataDir, "--listen", "0.0.0.0:7400"}
	cf.Config.User = fmt.Sprintf("%d:%d", UID, GID)
	cf.Config.WorkingDir = DataDir
	cf.Config.Env = []string{"PATH=/usr/local/bin", "HOME=" + DataDir}
	cf.Config.Volumes = map[string]struct{}{DataDir: {}}
	cf.Config.ExposedPorts = map[string]struct{}{"7400/tcp": {}}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "geolog",
		"org.opencontainers.image.description": "geologd, the geo-distributed ordered log node, and the geolog tool",
		"org.opencontainers.image.version":     cfg.Version,
		"org.opencontainers.image.revision":    cfg.Revision,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	return mutate.CreatedAt(img, v1.Time{Time: cfg.Created})
}

// rootfs is the image's one layer, as a tar.
func rootfs(cfg Config) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64, uid, gid int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: gid, ModTime: cfg.Created, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: cfg.Created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"etc", "usr", "usr/local", "usr/local/bin"} {
		if err := dir(d, 0o755, 0, 0); err != nil {
			return nil, err
		}
	}
	if err := dir("tmp", 0o1777, 0, 0); err != nil {
		return nil, err
	}
	if err := dir(path.Clean(DataDir[1:]), 0o700, UID, GID); err != nil {
		return nil, err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\ngeolog:x:%d:%d:geolog:%s:/sbin/nologin\n", UID, GID, DataDir)
	group := fmt.Sprintf("root:x:0:\ngeolog:x:%d:\n", GID)
	if err := file("etc/passwd", 0o644, []byte(passwd)); err != nil {
		return nil, err
	}
	if err := file("etc/group", 0o644, []byte(group)); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(cfg.Binaries))
	for name := range cfg.Binaries {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if path.Base(name) != name || name == "." || name == ".." {
			return nil, fmt.Errorf("image: binary name %q must be a plain file name", name)
		}
		data, err := os.ReadFile(cfg.Binaries[name])
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		if len(data) < 4 || string(data[:4]) != "\x7fELF" {
			return nil, fmt.Errorf("image: %s is not an ELF executable", cfg.Binaries[name])
		}
		if err := file("usr/local/bin/"+name, 0o755, data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteTarball writes img as a tarball `docker load` and `podman load` read,
// tagged tag (e.g. "geolog:v0.1.0").
func WriteTarball(img v1.Image, tag, file string) error {
	ref, err := parseTag(tag)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(file, ref, img)
}
