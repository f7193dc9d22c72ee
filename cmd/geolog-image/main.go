// Command geolog-image builds geolog's container image from static binaries
// without a container engine (internal/image): a tarball for docker/podman
// load, or an OCI image layout to push.
//
//	geolog-image --bin-dir bin/linux-amd64 --tag geolog:v0.1.0 --out geolog.tar [--layout dir]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/geolog/geolog/internal/image"
	"github.com/geolog/geolog/internal/version"
)

func main() {
	fs := flag.NewFlagSet("geolog-image", flag.ContinueOnError)
	binDir := fs.String("bin-dir", "", "folder holding static (CGO_ENABLED=0) Linux binaries geologd and geolog (required)")
	tag := fs.String("tag", "geolog:"+version.Version, "the image's name and tag")
	out := fs.String("out", "", "write a tarball that docker load / podman load read")
	layoutDir := fs.String("layout", "", "write (or add to) an OCI image layout in this folder")
	arch := fs.String("arch", "amd64", "the binaries' architecture")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *binDir == "" || (*out == "" && *layoutDir == "") {
		fmt.Fprintln(os.Stderr, "geolog-image: --bin-dir and one of --out or --layout are required")
		os.Exit(2)
	}
	created := time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "geolog-image: SOURCE_DATE_EPOCH %q: %v\n", s, err)
			os.Exit(2)
		}
		created = time.Unix(n, 0)
	}
	info := version.Get()
	img, err := image.Build(image.Config{
		Binaries: map[string]string{"geologd": filepath.Join(*binDir, "geologd"), "geolog": filepath.Join(*binDir, "geolog")},
		Arch:     *arch, Version: info.Version, Revision: info.Commit, Created: created,
	})
	if err == nil && *out != "" {
		err = image.WriteTarball(img, *tag, *out)
	}
	if err == nil && *layoutDir != "" {
		err = image.WriteLayout(img, *tag, *layoutDir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "geolog-image: %v\n", err)
		os.Exit(1)
	}
	d, _ := img.Digest()
	fmt.Printf("geolog-image: %s %s\n", *tag, d)
}
