package regionsvc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/vfs"
)

// catalogFile is the name of the applied stream catalogue inside the data
// directory (the catalogue itself is the meta range's log).
const catalogFile = "streams.json"

// catalogVersion is the on-disk version of the catalogue file.
const catalogVersion = 1

// Bounds on stream definitions.
const (
	streamNameBytesMax = 128
	rangeCountMax      = 4096
	regionsMax         = 16
	// retentionAgeMillisMax bounds a retention age: 100 years.
	retentionAgeMillisMax = 100 * 365 * 24 * 3600 * 1000
	// retentionBytesMax bounds a range's retained bytes: 1 EiB.
	retentionBytesMax = 1 << 60
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
	// MirrorHoldBytes and MirrorHoldAgeMillis bound how far behind a
	// mirror region may fall and still hold the home's retention back
	// (mirrorhold.go): 0 the default (twice the retention), -1 none.
	MirrorHoldBytes     int64 `json:"mirror_hold_bytes,omitempty"`
	MirrorHoldAgeMillis int64 `json:"mirror_hold_age_ms,omitempty"`
	// AlteredAt is, in a replicated region, the catalogue offset of the
	// last "alter" record this node applied to the stream (alter.go):
	// the catalogue group replaying an older one after a restart does not
	// put its values back over the saved newer ones. Per region.
	AlteredAt uint64 `json:"altered_at,omitempty"`
	// Homes[i] is the region range i is homed in; empty (catalogues written
	// before multi-region) means every range in Regions[0].
	Homes []string `json:"homes,omitempty"`
	// MetaOffset is, in a replicated region, the catalogue offset of the
	// stream's creation record (its ranges' Raft groups derive from it).
	MetaOffset uint64 `json:"meta_offset,omitempty"`
	// Cleanup is the cleanup policy (unset in catalogues written before
	// compaction by key: delete); the compaction settings are in
	// milliseconds, 0 the default, -1 none (see compaction.go).
	Cleanup                geologv1.CleanupPolicy `json:"cleanup,omitempty"`
	DeleteRetentionMillis  int64                  `json:"delete_retention_ms,omitempty"`
	MinCompactionLagMillis int64                  `json:"min_compaction_lag_ms,omitempty"`
	// ReplicationFactor is the replicas of each range in each region (1,
	// 3 or 5); 0 the region's default (Config.ReplicationFactor).
	ReplicationFactor uint32 `json:"replication_factor,omitempty"`
	// Replicas[r] is, in a replicated region, range r's first voters as
	// the creating node placed them (members.go placeRanges); empty in a
	// stream created before placement (the region's first ids). Per
	// region: never compared nor propagated.
	Replicas [][]uint64 `json:"replicas,omitempty"`
	// RangeMap is the stream's range map once a range has split (nil: the
	// map as created, keyspace.NewRangeMap(RangeCount)); split.go.
	RangeMap *keyspace.RangeMap `json:"range_map,omitempty"`
	// SplitReserved is the split a "split-reserve" record reserved; it
	// stands until its map version is the map's (split_reserve.go).
	SplitReserved *batch.Split `json:"split_reserved,omitempty"`
}

// replicasOf is range r's placed voters, nil if the spec has none (or not
// a valid set: 1 to 5 distinct non-zero ids).
func (s streamSpec) replicasOf(r uint32) []uint64 {
	if int(r) >= len(s.Replicas) {
		return nil
	}
	reps := s.Replicas[r]
	if len(reps) == 0 || len(reps) > 5 {
		return nil
	}
	for i, id := range reps {
		if id == 0 || slices.Contains(reps[:i], id) {
			return nil
		}
	}
	return slices.Clone(reps)
}

// validReplicationFactors are the replication factors a stream may ask for
// (0: the region's default).
var validReplicationFactors = []uint32{0, 1, 3, 5}

func (s streamSpec) info() *geologv1.StreamInfo {
	cleanup, compaction := s.cleanupInfo()
	return &geologv1.StreamInfo{
		Cleanup:           cleanup,
		Compaction:        compaction,
		Name:              s.Name,
		RangeCount:        s.RangeCount,
		Regions:           append([]string(nil), s.Regions...),
		Retention:         s.retentionInfo(),
		CreatedUnixNanos:  s.CreatedUnixNanos,
		RangeHomes:        s.homes(),
		ReplicationFactor: s.ReplicationFactor,
	}
}

// home is the region range r is homed in.
func (s streamSpec) home(r uint32) string {
	if s.RangeMap != nil && r >= s.RangeCount {
		// A split's child is homed where the range it split from was
		// created (docs/split.md; the lease store's rows are not built).
		if a := s.RangeMap.Ancestors(r); len(a) > 0 {
			r = a[len(a)-1]
		}
	}
	if int(r) < len(s.Homes) {
		return s.Homes[r]
	}
	return s.Regions[0]
}

// homes lists every range's home region.
func (s streamSpec) homes() []string {
	out := make([]string, s.RangeCount)
	for r := range out {
		out[r] = s.home(uint32(r))
	}
	return out
}

// hasRegion reports whether the stream is placed in region.
func (s streamSpec) hasRegion(region string) bool {
	return slices.Contains(s.Regions, region)
}

// createWant is what a CreateStream asks for: the definition as the node
// taking it resolved the request, and whether the request set the fields
// whose defaults depend on that node (regions; home_region and
// range_homes). A retry that another node takes resolves those
// differently; they are compared with an existing stream only when set.
type createWant struct {
	spec                 streamSpec
	regionsSet, homesSet bool
}

// wantFromRequest is what req asks for, resolved as spec.
func wantFromRequest(req *geologv1.CreateStreamRequest, spec streamSpec) createWant {
	return createWant{spec: spec, regionsSet: len(req.GetRegions()) > 0,
		homesSet: req.GetHomeRegion() != "" || len(req.GetRangeHomes()) > 0}
}

// wantExactly asks for spec in every field (a definition already fixed:
// an existing stream's, or one a node propagates).
func wantExactly(spec streamSpec) createWant {
	return createWant{spec: spec, regionsSet: true, homesSet: true}
}

// diff names the fields in which existing differs from what w asks for,
// "" if it does not (the creation time and catalogue offset, which are
// per region, never count).
func (w createWant) diff(existing streamSpec) string {
	var d []string
	if w.spec.Name != existing.Name {
		d = append(d, fmt.Sprintf("name %q (the stream is %q)", w.spec.Name, existing.Name))
	}
	if w.spec.RangeCount != existing.RangeCount {
		d = append(d, fmt.Sprintf("range_count %d (the stream has %d)", w.spec.RangeCount, existing.RangeCount))
	}
	if w.regionsSet && !slices.Equal(w.spec.Regions, existing.Regions) {
		d = append(d, fmt.Sprintf("regions %v (the stream has %v)", w.spec.Regions, existing.Regions))
	}
	if w.spec.RetentionAgeMillis != existing.RetentionAgeMillis {
		d = append(d, fmt.Sprintf("retention max_age_ms %d (the stream has %d)", w.spec.RetentionAgeMillis, existing.RetentionAgeMillis))
	}
	if w.spec.RetentionBytes != existing.RetentionBytes {
		d = append(d, fmt.Sprintf("retention max_bytes %d (the stream has %d)", w.spec.RetentionBytes, existing.RetentionBytes))
	}
	if w.spec.MirrorHoldBytes != existing.MirrorHoldBytes || w.spec.MirrorHoldAgeMillis != existing.MirrorHoldAgeMillis {
		d = append(d, fmt.Sprintf("mirror hold max_bytes %d, max_ms %d (the stream has %d, %d)", w.spec.MirrorHoldBytes, w.spec.MirrorHoldAgeMillis,
			existing.MirrorHoldBytes, existing.MirrorHoldAgeMillis))
	}
	if w.spec.ReplicationFactor != existing.ReplicationFactor {
		d = append(d, fmt.Sprintf("replication_factor %d (the stream has %d)", w.spec.ReplicationFactor, existing.ReplicationFactor))
	}
	if !w.spec.sameCleanup(existing) {
		d = append(d, fmt.Sprintf("cleanup %s (the stream has %s)", w.spec.cleanupString(), existing.cleanupString()))
	}
	if w.homesSet && w.spec.RangeCount == existing.RangeCount {
		want, have := w.spec.homes(), existing.homes()
		for r := range want {
			if want[r] != have[r] {
				d = append(d, fmt.Sprintf("range %d homed in %s (the stream's is homed in %s)", r, want[r], have[r]))
				break
			}
		}
	}
	return strings.Join(d, "; ")
}

// sameDefinition reports whether two specs define the same stream (all
// but the creation time and the catalogue offset, which are per region).
func (s streamSpec) sameDefinition(o streamSpec) bool { return wantExactly(s).diff(o) == "" }

// streamExistsDiff is the STREAM_EXISTS a create gets for a stream that
// exists with another definition.
func streamExistsDiff(name, diff string) error {
	return apierr.New(apierr.StreamExists, "stream %q already exists with another definition: %s", name, diff)
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
	// The age becomes a time.Duration (nanoseconds in an int64): past
	// about 9.2e12 ms it would wrap negative and the ranges never open.
	if ret.GetMaxAgeMs() > retentionAgeMillisMax {
		return streamSpec{}, apierr.New(apierr.InvalidArgument, "retention max_age_ms %d is over the maximum of %d (100 years)", ret.GetMaxAgeMs(), int64(retentionAgeMillisMax))
	}
	if ret.GetMaxBytes() > retentionBytesMax {
		return streamSpec{}, apierr.New(apierr.InvalidArgument, "retention max_bytes %d is over the maximum of %d", ret.GetMaxBytes(), int64(retentionBytesMax))
	}
	if err := checkMirrorHold(ret.GetMirrorHoldMaxBytes(), ret.GetMirrorHoldMaxMs()); err != nil {
		return streamSpec{}, err
	}
	if !slices.Contains(validReplicationFactors, req.GetReplicationFactor()) {
		return streamSpec{}, apierr.New(apierr.InvalidArgument, "replication_factor %d: must be 1, 3 or 5 (0: the region's default)", req.GetReplicationFactor())
	}
	homes, err := rangeHomes(req, regions, defaultRegion)
	if err != nil {
		return streamSpec{}, err
	}
	spec := streamSpec{
		Homes:              homes,
		Name:               req.GetName(),
		RangeCount:         req.GetRangeCount(),
		Regions:            append([]string(nil), regions...),
		RetentionAgeMillis: ret.GetMaxAgeMs(),
		RetentionBytes:     ret.GetMaxBytes(),
		CreatedUnixNanos:   nowUnixNanos,
		ReplicationFactor:  req.GetReplicationFactor(),
	}
	spec.MirrorHoldBytes, spec.MirrorHoldAgeMillis = ret.GetMirrorHoldMaxBytes(), ret.GetMirrorHoldMaxMs()
	if err := cleanupFromRequest(req, &spec); err != nil {
		return streamSpec{}, err
	}
	return spec, nil
}

// homeSpread places range i in regions[i % len(regions)].
const homeSpread = "spread"

// rangeHomes resolves a request's homes: range_homes if given, else
// home_region ("spread", a listed region, or by default the taking node's
// region if listed, else the first).
func rangeHomes(req *geologv1.CreateStreamRequest, regions []string, nodeRegion string) ([]string, error) {
	n := int(req.GetRangeCount())
	if rh := req.GetRangeHomes(); len(rh) > 0 {
		if len(rh) != n {
			return nil, apierr.New(apierr.InvalidArgument, "range_homes lists %d homes for %d ranges", len(rh), n)
		}
		for i, h := range rh {
			if !slices.Contains(regions, h) {
				return nil, apierr.New(apierr.InvalidArgument, "range %d: home region %q is not one of the stream's regions %v", i, h, regions)
			}
		}
		return append([]string(nil), rh...), nil
	}
	home := req.GetHomeRegion()
	switch {
	case home == homeSpread:
		out := make([]string, n)
		for i := range out {
			out[i] = regions[i%len(regions)]
		}
		return out, nil
	case home == "" && slices.Contains(regions, nodeRegion):
		home = nodeRegion
	case home == "":
		home = regions[0]
	case !slices.Contains(regions, home):
		return nil, apierr.New(apierr.InvalidArgument, "home region %q is not one of the stream's regions %v", home, regions)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = home
	}
	return out, nil
}

type catalogDisk struct {
	Version int `json:"version"`
	// AppliedTo is the catalogue offset after the last stream record
	// (create, delete, alter, split, split-reserve) the file reflects: the
	// catalogue group replays its whole log after a restart, and the
	// stream records below it are not applied again (applyMetaRecord);
	// 0 in files written before it, which replay everything.
	AppliedTo uint64       `json:"applied_to,omitempty"`
	Streams   []streamSpec `json:"streams"`
}

// catalogBytesMax bounds the applied catalogue file read at start: a
// stream's definition is well under 4 KiB.
const catalogBytesMax = 256 << 20

// ErrSingleNodeDataDir is New's refusal of a data directory written by a
// build from before a region of one node was a Raft group of one: it holds
// the single-node catalogue (streams.json) and no catalogue range (meta/).
// docs/operator-guide.md ("Upgrading a single-node data directory") has
// the upgrade step.
var ErrSingleNodeDataDir = errors.New("regionsvc: the data directory was written by a single-node build of an older release")

// checkNotSingleNodeDir refuses (ErrSingleNodeDataDir) a data directory of
// the old single-node layout; nothing in it is changed.
func checkNotSingleNodeDir(fsys vfs.FS, dataDir string) error {
	if _, err := fsys.Stat(filepath.Join(dataDir, catalogFile)); err != nil {
		return nil // no catalogue: nothing to lose (or a fresh directory)
	}
	if _, err := fsys.Stat(metaDir(dataDir)); err == nil {
		return nil // the applied catalogue of a replicated node
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("regionsvc: data directory %s: %w", dataDir, err)
	}
	return fmt.Errorf("%w: %s holds %s and no catalogue range (%s); export its streams with that release and import them into a fresh data directory (see the operator guide, \"Upgrading a single-node data directory\")",
		ErrSingleNodeDataDir, dataDir, catalogFile, metaDir(dataDir))
}

// loadCatalog reads the applied catalogue (the stream definitions this
// node applied before it stopped, see applyMetaRecord) and the catalogue
// offset it reflects (catalogDisk.AppliedTo); a missing file is an empty
// catalogue.
func loadCatalog(fsys vfs.FS, dataDir string) ([]streamSpec, uint64, error) {
	b, err := vfs.ReadFile(fsys, filepath.Join(dataDir, catalogFile), catalogBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("regionsvc: read catalogue: %w", err)
	}
	var c catalogDisk
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, 0, fmt.Errorf("regionsvc: catalogue %s is corrupt: %w", catalogFile, err)
	}
	if c.Version != catalogVersion {
		return nil, 0, fmt.Errorf("regionsvc: catalogue version %d, this build reads %d", c.Version, catalogVersion)
	}
	for _, s := range c.Streams {
		if err := validateStreamNameOrInternal(s.Name); err != nil || s.RangeCount == 0 || s.RangeCount > rangeCountMax {
			return nil, 0, fmt.Errorf("regionsvc: catalogue holds an invalid stream %q", s.Name)
		}
		if m := s.RangeMap; m != nil && (m.Initial != s.RangeCount || m.Validate() != nil) {
			return nil, 0, fmt.Errorf("regionsvc: catalogue holds stream %q with an invalid range map", s.Name)
		}
	}
	return c.Streams, c.AppliedTo, nil
}

// saveCatalog replaces the applied catalogue atomically and durably
// (vfs.WriteFileAtomic): specs as the stream record at catalogue offset
// at left them.
func saveCatalog(fsys vfs.FS, dataDir string, specs []streamSpec, at uint64) error {
	sorted := append([]streamSpec(nil), specs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	b, err := json.MarshalIndent(catalogDisk{Version: catalogVersion, AppliedTo: at + 1, Streams: sorted}, "", "  ")
	if err != nil {
		return err
	}
	return vfs.WriteFileAtomic(fsys, filepath.Join(dataDir, catalogFile), b, 0o600)
}
