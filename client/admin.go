package client

import (
	"context"
	"fmt"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// StreamConfig is what CreateStream needs.
type StreamConfig struct {
	Name string
	// RangeCount is the number of hash ranges; must be positive.
	RangeCount uint32
	// Regions lists the stream's regions; empty means the server's default.
	Regions []string
	// RetentionAge deletes segments whose newest record is older; 0 keeps
	// records for ever.
	RetentionAge time.Duration
	// RetentionBytes bounds each range's size; 0 means no bound.
	RetentionBytes int64
	// MirrorHoldBytes and MirrorHoldAge bound how far behind its home a
	// mirror region may fall and still hold the home's retention back
	// (docs/operator-guide.md): 0 means the server's default, twice the
	// retention of the kind; a negative value no bound.
	MirrorHoldBytes int64
	MirrorHoldAge   time.Duration
	// HomeRegion is where the ranges are homed: one of Regions, or
	// "spread" (range i in Regions[i % len(Regions)]). Default: the region
	// of the node that takes the request if listed, else Regions[0].
	HomeRegion string
	// Cleanup is how the stream sheds records: CleanupDelete (retention
	// only, the default), CleanupCompact (compaction by key: each range
	// keeps the newest record of each key, and every record needs a key)
	// or CleanupCompactDelete (both).
	Cleanup Cleanup
	// DeleteRetention is how long a tombstone stays readable in a
	// compacted stream before compaction removes it; 0 means the server's
	// default (24 h), a negative value none.
	DeleteRetention time.Duration
	// MinCompactionLag: compaction never removes a record younger than
	// this; 0 means the server's default (1 min), a negative value none.
	MinCompactionLag time.Duration
	// ReplicationFactor is the replicas of each range in each region of
	// the stream: 1, 3 or 5; 0 (the default) the region's default.
	ReplicationFactor uint32
}

// Cleanup is a stream's cleanup policy (see StreamConfig.Cleanup).
type Cleanup = geologv1.CleanupPolicy

// The cleanup policies.
const (
	CleanupDelete        = geologv1.CleanupPolicy_CLEANUP_POLICY_DELETE
	CleanupCompact       = geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT
	CleanupCompactDelete = geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT_DELETE
)

// compactionMillis is a StreamConfig duration as the API takes it: 0 the
// default, -1 none.
func compactionMillis(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// StreamInfo describes a stream.
type StreamInfo struct {
	Name           string
	RangeCount     uint32
	Regions        []string
	RetentionAge   time.Duration
	RetentionBytes int64
	// MirrorHoldBytes and MirrorHoldAge are as set (0 the default,
	// negative none; see StreamConfig).
	MirrorHoldBytes int64
	MirrorHoldAge   time.Duration
	Created         time.Time
	// RangeHomes[i] is the region range i was homed in at creation.
	RangeHomes []string
	// Cleanup, DeleteRetention and MinCompactionLag are as created (the
	// durations 0 for the server's defaults, negative for none).
	Cleanup                           Cleanup
	DeleteRetention, MinCompactionLag time.Duration
}

// RangeInfo describes one range of a stream.
type RangeInfo struct {
	Range uint32
	// HashStart and HashEnd bound the key hashes the range owns (inclusive).
	HashStart, HashEnd uint64
	// StartOffset is the first retained offset; TailOffset the offset the
	// next append gets.
	StartOffset, TailOffset uint64
	SizeBytes               int64
	HomeRegion              string
	Epoch                   uint64
	// Leader is the advertised address of the range's leader in the
	// answering node's region; HomeLeader that of its leader in the home
	// region (where appends go), when the node knows it.
	Leader     string
	HomeLeader string
	// Epochs is the range's epoch history, oldest first (see the API's
	// RangeInfo.epochs): an acknowledgement under an epoch at an offset
	// at or past a later epoch's start is not in the log.
	Epochs []EpochStart
	// Status is "ok" or why the range is not served.
	Status string
	// Replication is how far each mirror is, as the answering node knows:
	// all of them when it leads the range in its home region, its own
	// region's when it leads a mirror.
	Replication []RegionProgress
	// Parent is the range this one split from (keyspace.NoRange: a range
	// of the stream as created); Children the two it split into (none: it
	// has not split) and SplitOffset where its log ends (docs/split.md).
	Parent      uint32
	Children    []uint32
	SplitOffset uint64
}

// EpochStart is where one homing epoch of a range starts.
type EpochStart struct {
	Epoch       uint64 `json:"epoch"`
	StartOffset uint64 `json:"start_offset"`
	HomeRegion  string `json:"home_region"`
	// Kind is how the epoch began: "create", "takeover" (an unplanned
	// failover) or "rehome" (a planned move); "" if unknown.
	Kind string `json:"kind,omitempty"`
}

// RegionProgress is one mirror's position and lag (see the API's
// RegionProgress: lag never reads zero over a stalled link).
type RegionProgress struct {
	Region       string
	AppliedEnd   uint64
	OffsetLag    uint64
	TimeLag      time.Duration
	HeartbeatAge time.Duration
	State        string
	LastError    string
}

// StreamDescription is a stream and its ranges.
type StreamDescription struct {
	Stream StreamInfo
	Ranges []RangeInfo
	// EpochsUnavailable is empty when every range's Epochs is complete,
	// else why it is not (the lease store did not answer).
	EpochsUnavailable string
	// RangeMapVersion counts the stream's range splits (0: never split);
	// Ranges then lists split ranges and their children too.
	RangeMapVersion uint64
}

// CreateStream creates a stream, or returns it if it exists with the
// definition sc asks for (fields left to their default, Regions and
// HomeRegion, match whatever the stream has). The server makes creation
// idempotent, so retriable errors are retried, at another node
// (RetriesMax): a retry completes what an earlier attempt left undone
// (regions not yet holding the stream, homes not yet registered). A stream
// of the name with another definition fails with CodeStreamExists, whose
// message names the difference.
func (c *Client) CreateStream(ctx context.Context, sc StreamConfig) (*StreamInfo, error) {
	if sc.Name == "" || sc.RangeCount == 0 {
		return nil, apierr.New(apierr.InvalidArgument, "stream name and a positive range count are required")
	}
	if sc.RetentionAge < 0 || sc.RetentionBytes < 0 {
		return nil, apierr.New(apierr.InvalidArgument, "retention must not be negative")
	}
	req := &geologv1.CreateStreamRequest{
		Name:              sc.Name,
		RangeCount:        sc.RangeCount,
		Regions:           sc.Regions,
		HomeRegion:        sc.HomeRegion,
		ReplicationFactor: sc.ReplicationFactor,
		Retention: &geologv1.RetentionPolicy{
			MaxAgeMs:           sc.RetentionAge.Milliseconds(),
			MaxBytes:           sc.RetentionBytes,
			MirrorHoldMaxBytes: holdBytes(sc.MirrorHoldBytes),
			MirrorHoldMaxMs:    compactionMillis(sc.MirrorHoldAge),
		},
		Cleanup: sc.Cleanup,
	}
	if sc.DeleteRetention != 0 || sc.MinCompactionLag != 0 {
		req.Compaction = &geologv1.CompactionPolicy{DeleteRetentionMs: compactionMillis(sc.DeleteRetention),
			MinLagMs: compactionMillis(sc.MinCompactionLag)}
	}
	var resp *geologv1.CreateStreamResponse
	err := c.call(ctx, true, func(ctx context.Context, api geologv1.LogClient) (err error) {
		resp, err = api.CreateStream(ctx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %q: %w", sc.Name, err)
	}
	info := streamInfoFromProto(resp.GetStream())
	return &info, nil
}

// ListStreams lists all streams. Retriable errors are retried, at another
// node (RetriesMax).
func (c *Client) ListStreams(ctx context.Context) ([]StreamInfo, error) {
	var resp *geologv1.ListStreamsResponse
	err := c.call(ctx, true, func(ctx context.Context, api geologv1.LogClient) (err error) {
		resp, err = api.ListStreams(ctx, &geologv1.ListStreamsRequest{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	out := make([]StreamInfo, 0, len(resp.GetStreams()))
	for _, s := range resp.GetStreams() {
		out = append(out, streamInfoFromProto(s))
	}
	return out, nil
}

// DeleteStream deletes a stream in every region of it: its data is
// removed and the name is free again. Retriable errors are retried, at
// another node (RetriesMax); a deletion that a retry finds done answers
// STREAM_NOT_FOUND.
func (c *Client) DeleteStream(ctx context.Context, name string) error {
	if name == "" {
		return apierr.New(apierr.InvalidArgument, "stream name is required")
	}
	err := c.call(ctx, false, func(ctx context.Context, api geologv1.LogClient) error {
		_, err := api.DeleteStream(ctx, &geologv1.DeleteStreamRequest{Name: name})
		return err
	})
	if err != nil {
		return fmt.Errorf("delete stream %q: %w", name, err)
	}
	return nil
}

// StreamChange is what AlterStream changes of a stream; a nil field keeps
// the stream's value.
type StreamChange struct {
	// RetentionAge bounds records by age (0: no bound), at most 100 years.
	RetentionAge *time.Duration
	// RetentionBytes bounds each range's size (0: no bound).
	RetentionBytes *int64
	// MirrorHoldBytes and MirrorHoldAge: see StreamConfig.
	MirrorHoldBytes *int64
	MirrorHoldAge   *time.Duration
}

// holdBytes is a mirror hold in bytes as the API takes it: 0 the
// default, -1 none.
func holdBytes(b int64) int64 { return max(b, -1) }

// AlterStream changes a stream's retention in every region of it and
// returns the stream as it is now; its ranges apply the new retention at
// their next maintenance round. An alter sets values, so retriable errors
// are retried (RetriesMax), at another node.
func (c *Client) AlterStream(ctx context.Context, name string, change StreamChange) (StreamInfo, error) {
	if name == "" {
		return StreamInfo{}, apierr.New(apierr.InvalidArgument, "stream name is required")
	}
	req := &geologv1.AlterStreamRequest{Name: name, RetentionMaxBytes: change.RetentionBytes}
	if change.RetentionAge != nil {
		ms := change.RetentionAge.Milliseconds()
		req.RetentionMaxAgeMs = &ms
	}
	if change.MirrorHoldBytes != nil {
		b := holdBytes(*change.MirrorHoldBytes)
		req.MirrorHoldMaxBytes = &b
	}
	if change.MirrorHoldAge != nil {
		ms := compactionMillis(*change.MirrorHoldAge)
		req.MirrorHoldMaxMs = &ms
	}
	var resp *geologv1.AlterStreamResponse
	err := c.call(ctx, true, func(ctx context.Context, api geologv1.LogClient) (err error) {
		resp, err = api.AlterStream(ctx, req)
		return err
	})
	if err != nil {
		return StreamInfo{}, fmt.Errorf("alter stream %q: %w", name, err)
	}
	return streamInfoFromProto(resp.GetStream()), nil
}

// DescribeStream returns a stream and the state of its ranges. Retriable
// errors are retried, at another node (RetriesMax).
func (c *Client) DescribeStream(ctx context.Context, name string) (*StreamDescription, error) {
	var resp *geologv1.DescribeStreamResponse
	err := c.call(ctx, true, func(ctx context.Context, api geologv1.LogClient) (err error) {
		resp, err = api.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: name})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("describe stream %q: %w", name, err)
	}
	d := &StreamDescription{Stream: streamInfoFromProto(resp.GetStream()), EpochsUnavailable: resp.GetEpochsUnavailable(), RangeMapVersion: resp.GetRangeMapVersion()}
	for _, r := range resp.GetRanges() {
		var repl []RegionProgress
		for _, p := range r.GetReplication() {
			repl = append(repl, RegionProgress{Region: p.GetRegion(), AppliedEnd: p.GetAppliedEndOffset(), OffsetLag: p.GetOffsetLag(),
				TimeLag: time.Duration(p.GetTimeLagMillis()) * time.Millisecond, HeartbeatAge: time.Duration(p.GetHeartbeatAgeMillis()) * time.Millisecond,
				State: p.GetState(), LastError: p.GetLastError()})
		}
		d.Ranges = append(d.Ranges, RangeInfo{
			Replication: repl,
			Range:       r.GetRange(),
			HashStart:   r.GetHashStart(),
			HashEnd:     r.GetHashEnd(),
			StartOffset: r.GetStartOffset(),
			TailOffset:  r.GetTailOffset(),
			SizeBytes:   r.GetSizeBytes(),
			HomeRegion:  r.GetHomeRegion(),
			Epoch:       r.GetEpoch(),
			Leader:      r.GetLeader(),
			HomeLeader:  r.GetHomeLeader(),
			Epochs:      epochsFromProto(r.GetEpochs()),
			Status:      r.GetStatus(),
			Parent:      keyspace.NoRange,
			Children:    r.GetChildren(),
			SplitOffset: r.GetSplitOffset(),
		})
		if r.Parent != nil {
			d.Ranges[len(d.Ranges)-1].Parent = r.GetParent()
		}
	}
	if d.Stream.RangeCount == 0 {
		return nil, fmt.Errorf("describe stream %q: %w", name,
			apierr.New(apierr.Internal, "server described the stream with zero ranges"))
	}
	return d, nil
}

// epochKindNames names the API's epoch kinds.
var epochKindNames = map[geologv1.EpochKind]string{
	geologv1.EpochKind_EPOCH_KIND_CREATE:   "create",
	geologv1.EpochKind_EPOCH_KIND_TAKEOVER: "takeover",
	geologv1.EpochKind_EPOCH_KIND_REHOME:   "rehome",
}

func epochsFromProto(es []*geologv1.EpochStart) []EpochStart {
	out := make([]EpochStart, 0, len(es))
	for _, e := range es {
		out = append(out, EpochStart{Epoch: e.GetEpoch(), StartOffset: e.GetStartOffset(), HomeRegion: e.GetHomeRegion(), Kind: epochKindNames[e.GetKind()]})
	}
	return out
}

func streamInfoFromProto(s *geologv1.StreamInfo) StreamInfo {
	info := StreamInfo{
		Name:            s.GetName(),
		RangeCount:      s.GetRangeCount(),
		Regions:         s.GetRegions(),
		RetentionAge:    time.Duration(s.GetRetention().GetMaxAgeMs()) * time.Millisecond,
		RetentionBytes:  s.GetRetention().GetMaxBytes(),
		MirrorHoldBytes: s.GetRetention().GetMirrorHoldMaxBytes(),
		MirrorHoldAge:   time.Duration(s.GetRetention().GetMirrorHoldMaxMs()) * time.Millisecond,
		RangeHomes:      s.GetRangeHomes(),
		Cleanup:         s.GetCleanup(),
	}
	if cp := s.GetCompaction(); cp != nil {
		info.DeleteRetention = time.Duration(cp.GetDeleteRetentionMs()) * time.Millisecond
		info.MinCompactionLag = time.Duration(cp.GetMinLagMs()) * time.Millisecond
	}
	if ns := s.GetCreatedUnixNanos(); ns != 0 {
		info.Created = time.Unix(0, ns)
	}
	return info
}
