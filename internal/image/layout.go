package image

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

func parseTag(tag string) (name.Tag, error) {
	t, err := name.NewTag(tag, name.WithDefaultRegistry("local"))
	if err != nil {
		return name.Tag{}, fmt.Errorf("image: tag %q: %w", tag, err)
	}
	return t, nil
}

// WriteLayout writes img into an OCI image layout at dir (made if missing),
// annotated with tag as its ref name.
func WriteLayout(img v1.Image, tag, dir string) error {
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, emptyIndex()); err != nil {
			return fmt.Errorf("image: layout %s: %w", dir, err)
		}
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
}

func emptyIndex() v1.ImageIndex { return empty.Index }
