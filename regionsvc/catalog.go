package regionsvc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// catalogFile is the name of the stream catalogue inside the data directory.
const catalogFile = "streams.json"

// catalogVersion is the on-disk version of the catalogue file.
const catalogVersion = 1

// Bounds on stream definitions.
const (
	streamNameBytesMax = 128
	rangeCountMax      = 4096
	regionsMax         = 16
)

var streamNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// streamSpec is the durable definition of a stream.
type streamSpec struct {
	Name               string   `json:"name"`
	RangeCount         uint32   `json:"range_count"`
	Regions            []string `json:"regions"`
	RetentionAgeMillis int64    `json:"retention_age_ms"`
	RetentionBytes     int64    `json:"retention_bytes"`
	CreatedUnixNanos   int64    `json:"created_unix_nanos"`
	// MetaOffset is, in a replicated region, the catalogue offset of the
	// stream's creation record (its ranges' Raft groups derive from it).
	MetaOffset uint64 `json:"meta_offset,omitempty"`
}

func (s streamSpec) info() *geologv1.StreamInfo {
	return &geologv1.StreamInfo{
		Name:       s.Name,
		RangeCount: s.RangeCount,
		Regions:    append([]string(nil), s.Regions...),
		Retention: &geologv1.RetentionPolicy{
			MaxAgeMs: s.RetentionAgeMillis,
			MaxBytes: s.RetentionBytes,
		},
		CreatedUnixNanos: s.CreatedUnixNanos,
	}
}

// validateStreamName returns an InvalidArgument error for a bad name.
func validateStreamName(name string) error {
	if name == "" {
		return apierr.New(apierr.InvalidArgument, "stream name is empty")
	}
	if len(name) > streamNameBytesMax {
		return apierr.New(apierr.InvalidArgument, "stream name is %d bytes, over the maximum of %d", len(name), streamNameBytesMax)
	}
	if !streamNameRE.MatchString(name) {
		return apierr.New(apierr.InvalidArgument, "stream name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// specFromRequest validates a CreateStream request and returns its spec.
func specFromRequest(req *geologv1.CreateStreamRequest, defaultRegion string, nowUnixNanos int64) (streamSpec, error) {
	if err := validateStreamName(req.GetName()); err != nil {
		return streamSpec{}, err
	}
	if req.GetRangeCount() == 0 || req.GetRangeCount() > rangeCountMax {
		return streamSpec{}, apierr.New(apierr.InvalidArgument, "range_count %d: must be in [1, %d]", req.GetRangeCount(), rangeCountMax)
	}
	regions := req.GetRegions()
	if len(regions) == 0 {
		regions = []string{defaultRegion}
	}
	if len(regions) > regionsMax {
		return streamSpec{}, apierr.New(apierr.InvalidArgument, "%d regions: at most %d", len(regions), regionsMax)
	}
	seen := map[string]bool{}
	for _, r := range regions {
		if r == "" || len(r) > 64 || !streamNameRE.MatchString(r) {
			return streamSpec{}, apierr.New(apierr.InvalidArgument, "region name %q is not valid", r)
		}
		if seen[r] {
			return streamSpec{}, apierr.New(apierr.InvalidArgument, "region %q listed twice", r)
		}
		seen[r] = true
	}
	ret := req.GetRetention()
	if ret.GetMaxAgeMs() < 0 || ret.GetMaxBytes() < 0 {
		return streamSpec{}, apierr.New(apierr.InvalidArgument, "retention must not be negative")
	}
	return streamSpec{
		Name:               req.GetName(),
		RangeCount:         req.GetRangeCount(),
		Regions:            append([]string(nil), regions...),
		RetentionAgeMillis: ret.GetMaxAgeMs(),
		RetentionBytes:     ret.GetMaxBytes(),
		CreatedUnixNanos:   nowUnixNanos,
	}, nil
}

type catalogDisk struct {
	Version int          `json:"version"`
	Streams []streamSpec `json:"streams"`
}

// loadCatalog reads the catalogue; a missing file is an empty catalogue.
func loadCatalog(dataDir string) ([]streamSpec, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, catalogFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("regionsvc: read catalogue: %w", err)
	}
	var c catalogDisk
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("regionsvc: catalogue %s is corrupt: %w", catalogFile, err)
	}
	if c.Version != catalogVersion {
		return nil, fmt.Errorf("regionsvc: catalogue version %d, this build reads %d", c.Version, catalogVersion)
	}
	for _, s := range c.Streams {
		if err := validateStreamName(s.Name); err != nil || s.RangeCount == 0 || s.RangeCount > rangeCountMax {
			return nil, fmt.Errorf("regionsvc: catalogue holds an invalid stream %q", s.Name)
		}
	}
	return c.Streams, nil
}

// saveCatalog replaces the catalogue atomically: write a temporary file,
// fsync it, rename it over the old one, fsync the directory.
func saveCatalog(dataDir string, specs []streamSpec) error {
	sorted := append([]streamSpec(nil), specs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	b, err := json.MarshalIndent(catalogDisk{Version: catalogVersion, Streams: sorted}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(dataDir, catalogFile, b)
}

// writeFileAtomic replaces dir/name with data durably.
func writeFileAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
