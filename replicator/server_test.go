package replicator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// refusalOf returns the refusal in resp, or fails.
func refusalOf(t *testing.T, resp *geologinternalv1.ReplicateResponse) *Refusal {
	t.Helper()
	if resp.GetError() == nil {
		t.Fatalf("request accepted (applied end %d), want a refusal", resp.GetAppliedEndOffset())
	}
	return fromDetail(resp.GetError())
}

// expectEnd checks that the server ended the stream.
func expectEnd(t *testing.T, c *rawClient) {
	t.Helper()
	if resp, err := c.stream.Recv(); err != io.EOF {
		t.Fatalf("stream goes on after a final refusal: %v, %v", resp, err)
	}
}

// TestServerGapOverlapDuplicate walks the mirror's contract on one stream:
// a gap is refused with the expected offset and the stream goes on; an
// exact extension applies; a resend of applied frames (a lost ack) is
// acknowledged without applying; a batch across the applied end applies
// its new part; different data below the applied end is refused and ends
// the stream.
func TestServerGapOverlapDuplicate(t *testing.T) {
	g := newLogGen(20, 200)
	frames := make([][]byte, 8)
	for i := range frames {
		frames[i] = g.frame(3)
	}
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	c := dialRaw(t, node.addr)
	if resp := c.mustAnswer(openReq(1)); resp.GetError() != nil || resp.GetAppliedEndOffset() != 0 {
		t.Fatalf("open answered %v", resp)
	}

	// Gap: frames 2..3 before 0..1.
	r := refusalOf(t, c.mustAnswer(batchReq(1, CompressionNone, frames[2:4]...)))
	if !errors.Is(r, ErrGap) || r.ExpectedOffset() != 0 || r.API.Code != apierr.OffsetOutOfRange {
		t.Fatalf("gap refused with %v (expected offset %d)", r, r.ExpectedOffset())
	}
	// The stream goes on: the exact extension applies.
	resp := c.mustAnswer(batchReq(1, CompressionZstd, frames[0:4]...))
	if resp.GetError() != nil || resp.GetAppliedEndOffset() != frameNext(frames[3]) {
		t.Fatalf("extension answered %v", resp)
	}
	applies := m.Applies()

	// A resend of applied frames: acknowledged, nothing applied.
	resp = c.mustAnswer(batchReq(1, CompressionNone, frames[1:3]...))
	if resp.GetError() != nil || resp.GetAppliedEndOffset() != frameNext(frames[3]) {
		t.Fatalf("resend answered %v", resp)
	}
	if m.Applies() != applies || node.srv.Stats().Duplicates != 1 {
		t.Fatalf("resend applied something (applies %d -> %d)", applies, m.Applies())
	}

	// Across the applied end: frames 2..5, of which 4..5 are new.
	resp = c.mustAnswer(batchReq(1, CompressionZstd, frames[2:6]...))
	if resp.GetError() != nil || resp.GetAppliedEndOffset() != frameNext(frames[5]) {
		t.Fatalf("overlapping extension answered %v", resp)
	}
	got := m.Frames()
	if len(got) != 6 {
		t.Fatalf("mirror holds %d frames, want 6", len(got))
	}
	for i := range got {
		if !SameData(got[i], frames[i]) {
			t.Fatalf("mirror frame %d differs", i)
		}
		if h, _ := batch.DecodeHeader(got[i]); h.Term != memTerm {
			t.Fatalf("mirror frame %d has term %d: the twin should stamp its own", i, h.Term)
		}
	}

	// Different data at applied offsets: the same offsets from another
	// producer (a divergent tail).
	other := newLogGen(21, 200)
	other.next, other.appendTime = frameBase(frames[4]), g.appendTime
	r = refusalOf(t, c.mustAnswer(batchReq(1, CompressionNone, other.frame(3))))
	if !errors.Is(r, ErrDiverged) || r.API.Code != apierr.Corruption {
		t.Fatalf("divergent overlap refused with %v", r)
	}
	expectEnd(t, c)
	if len(m.Frames()) != 6 {
		t.Fatal("a refused batch changed the mirror")
	}
}

// TestServerOverlapBoundaries: an overlap whose frame boundaries differ
// from the mirror's is a divergence, even if it starts at a boundary.
func TestServerOverlapBoundaries(t *testing.T) {
	g := newLogGen(22, 100)
	f0, f1 := g.frame(2), g.frame(4) // [0,2) [2,6)
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(f0, f1); err != nil {
		t.Fatal(err)
	}
	// [2,4) then [4,6): the first straddles nothing but differs from [2,6).
	alt := newLogGen(22, 100)
	alt.frame(2)
	a1 := alt.frame(2)
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))
	r := refusalOf(t, c.mustAnswer(batchReq(1, CompressionNone, a1)))
	if !errors.Is(r, ErrDiverged) {
		t.Fatalf("refused with %v, want ErrDiverged", r)
	}
}

// TestServerStaleEpoch: a lower epoch than the mirror has seen is refused
// at the open; a newer home's open fences the older one's stream.
func TestServerStaleEpoch(t *testing.T) {
	g := newLogGen(23, 100)
	g.epoch = 2
	f := g.frame(2)
	node := startMirror(t, NewMemMirrorStore(), nil)

	old := dialRaw(t, node.addr)
	if resp := old.mustAnswer(openReq(2)); resp.GetError() != nil {
		t.Fatal(resp.GetError())
	}
	newer := dialRaw(t, node.addr)
	if resp := newer.mustAnswer(openReq(3)); resp.GetError() != nil || resp.GetHighestEpoch() != 3 {
		t.Fatalf("newer home's open answered %v", resp)
	}
	r := refusalOf(t, old.mustAnswer(batchReq(2, CompressionNone, f)))
	if !errors.Is(r, ErrStaleEpoch) || r.API.Code != apierr.StaleEpoch {
		t.Fatalf("stale home's batch refused with %v", r)
	}
	expectEnd(t, old)
	again := dialRaw(t, node.addr)
	if r := refusalOf(t, again.mustAnswer(openReq(2))); !errors.Is(r, ErrStaleEpoch) {
		t.Fatalf("stale open refused with %v", r)
	}
	expectEnd(t, again)
	// The newer home's frames (of epoch 2, shipped by epoch 3) apply.
	if resp := newer.mustAnswer(batchReq(3, CompressionNone, f)); resp.GetError() != nil {
		t.Fatal(resp.GetError())
	}
}

// TestServerNotLeader: a follower refuses the open with the leader's
// address.
func TestServerNotLeader(t *testing.T) {
	node := startMirror(t, NewMemMirrorStore(), nil)
	node.store.SetNotLeader("10.0.0.9:7000")
	c := dialRaw(t, node.addr)
	r := refusalOf(t, c.mustAnswer(openReq(1)))
	if !errors.Is(r, ErrNotLeader) || r.API.LeaderHint != "10.0.0.9:7000" || !r.API.Retriable {
		t.Fatalf("refused with %v (hint %q)", r, r.API.LeaderHint)
	}
	expectEnd(t, c)
}

// TestServerMalformed sends every kind of malformed request: each is
// refused with INVALID_ARGUMENT, the stream ends, nothing is applied, and
// the server goes on serving.
func TestServerMalformed(t *testing.T) {
	g := newLogGen(24, 300)
	f0, f1, f2 := g.frame(2), g.frame(3), g.frame(1)
	good := func() *geologinternalv1.ReplicateRequest { return batchReq(1, CompressionNone, f0, f1) }
	mod := func(edit func(r *geologinternalv1.ReplicateRequest)) *geologinternalv1.ReplicateRequest {
		r := good()
		edit(r)
		return r
	}
	corrupt := append([]byte(nil), f1...)
	corrupt[len(corrupt)-3] ^= 0x40
	control := batch.EncodeControl(nil, batch.Header{Type: batch.TypeNoop, BaseOffset: 2}, nil)
	futureEpoch := newLogGen(24, 300)
	futureEpoch.epoch = 9

	openCases := []struct {
		name string
		req  *geologinternalv1.ReplicateRequest
	}{
		{"no open", good()},
		{"open with batch", func() *geologinternalv1.ReplicateRequest { r := openReq(1); r.Batch = good().Batch; return r }()},
		{"empty stream", func() *geologinternalv1.ReplicateRequest { r := openReq(1); r.Open.Stream = ""; return r }()},
		{"wrong region", func() *geologinternalv1.ReplicateRequest {
			r := openReq(1)
			r.Open.DestinationRegion = "ap"
			return r
		}()},
		{"from own region", func() *geologinternalv1.ReplicateRequest { r := openReq(1); r.Open.SourceRegion = dstRegion; return r }()},
		{"epoch 0", openReq(0)},
		{"no heartbeat", func() *geologinternalv1.ReplicateRequest { r := openReq(1); r.Heartbeat = nil; return r }()},
		{"heartbeat epoch", func() *geologinternalv1.ReplicateRequest { r := openReq(1); r.Heartbeat.HomeEpoch = 2; return r }()},
	}
	batchCases := []struct {
		name string
		req  *geologinternalv1.ReplicateRequest
	}{
		{"repeated open", openReq(1)},
		{"no heartbeat", mod(func(r *geologinternalv1.ReplicateRequest) { r.Heartbeat = nil })},
		{"compression unspecified", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.Compression = 0 })},
		{"unknown compression", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.Compression = 7 })},
		{"zstd garbage", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.Compression = CompressionZstd })},
		{"zstd short", func() *geologinternalv1.ReplicateRequest {
			r := batchReq(1, CompressionZstd, f0, f1)
			r.Batch.UncompressedBytes--
			return r
		}()},
		{"zstd long", func() *geologinternalv1.ReplicateRequest {
			r := batchReq(1, CompressionZstd, f0, f1)
			r.Batch.UncompressedBytes++
			return r
		}()},
		{"size mismatch", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.UncompressedBytes++ })},
		{"too large", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.UncompressedBytes = 1 << 40 })},
		{"corrupt frame", batchReq(1, CompressionNone, f0, corrupt)},
		{"truncated frame", mod(func(r *geologinternalv1.ReplicateRequest) {
			r.Batch.Payload = r.Batch.Payload[:len(r.Batch.Payload)-1]
			r.Batch.UncompressedBytes--
		})},
		{"control frame", func() *geologinternalv1.ReplicateRequest {
			r := batchReq(1, CompressionNone, f0)
			r.Batch.Payload = append(r.Batch.Payload, control...)
			r.Batch.UncompressedBytes = uint64(len(r.Batch.Payload))
			r.Batch.FrameCount = 2
			return r
		}()},
		{"offsets not dense", func() *geologinternalv1.ReplicateRequest {
			r := batchReq(1, CompressionNone, f0, f2) // f1 missing
			r.Batch.EndOffset = frameNext(f2)
			return r
		}()},
		{"first offset wrong", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.FirstOffset = 1 })},
		{"end offset wrong", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.EndOffset++ })},
		{"end before first", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.EndOffset = 0 })},
		{"frame count high", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.FrameCount = 3 })},
		{"frame count low", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.FrameCount = 1 })},
		{"frame count 0", mod(func(r *geologinternalv1.ReplicateRequest) { r.Batch.FrameCount = 0 })},
		{"epoch above home", batchReq(1, CompressionNone, futureEpoch.frame(2))},
		{"heartbeat epoch changes", mod(func(r *geologinternalv1.ReplicateRequest) { r.Heartbeat.HomeEpoch = 2 })},
	}

	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	check := func(t *testing.T, c *rawClient, req *geologinternalv1.ReplicateRequest) {
		t.Helper()
		resp, err := c.roundTrip(req)
		if err != nil {
			t.Fatalf("stream failed instead of refusing: %v", err)
		}
		r := refusalOf(t, resp)
		if !errors.Is(r, ErrMalformed) || r.API.Code != apierr.InvalidArgument || r.API.Retriable {
			t.Fatalf("refused with %v, want a final INVALID_ARGUMENT", r)
		}
		expectEnd(t, c)
	}
	for _, tc := range openCases {
		t.Run("open/"+tc.name, func(t *testing.T) { check(t, dialRaw(t, node.addr), tc.req) })
	}
	for _, tc := range batchCases {
		t.Run("batch/"+tc.name, func(t *testing.T) {
			c := dialRaw(t, node.addr)
			c.mustAnswer(openReq(1))
			check(t, c, proto.Clone(tc.req).(*geologinternalv1.ReplicateRequest))
		})
	}
	if m.AppliedEnd() != 0 {
		t.Fatalf("malformed requests applied up to %d", m.AppliedEnd())
	}
	// The server still serves, and the good request applies.
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))
	if resp := c.mustAnswer(good()); resp.GetError() != nil || resp.GetAppliedEndOffset() != frameNext(f1) {
		t.Fatalf("good batch answered %v", resp)
	}
}

// TestServerApplyFailure: an error of the node's Apply ends the stream
// with it, and the applied end is unchanged.
func TestServerApplyFailure(t *testing.T) {
	g := newLogGen(25, 100)
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	m.FailApply(apierr.New(apierr.Unavailable, "raft group has no quorum"))
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))
	r := refusalOf(t, c.mustAnswer(batchReq(1, CompressionNone, g.frame(2))))
	if r.API.Code != apierr.Unavailable || !r.API.Retriable {
		t.Fatalf("refused with %v", r)
	}
	expectEnd(t, c)
}

// TestServerRangesMax: the per-range state is bounded; idle ranges make
// room, ranges with streams do not.
func TestServerRangesMax(t *testing.T) {
	node := startMirror(t, NewMemMirrorStore(), func(c *ServerConfig) { c.RangesMax = 1 })
	c1 := dialRaw(t, node.addr)
	c1.mustAnswer(openReq(1))
	other := openReq(1)
	other.Open.Range = 9
	c2 := dialRaw(t, node.addr)
	if r := refusalOf(t, c2.mustAnswer(other)); r.API.Code != apierr.Overloaded {
		t.Fatalf("second range refused with %v", r)
	}
	c1.cancel()
	waitFor(t, 5e9, "the first stream's state to be released", func() bool {
		c3 := dialRaw(t, node.addr)
		resp, err := c3.roundTrip(proto.Clone(other).(*geologinternalv1.ReplicateRequest))
		return err == nil && resp.GetError() == nil
	})
	if _, ok := node.srv.Lag(testStream, testRange); ok {
		t.Fatal("the idle range's state was not dropped")
	}
}

// TestConfigValidation: bad configurations are errors, not panics.
func TestConfigValidation(t *testing.T) {
	src := NewMemSource(0)
	d := newDialer(t)
	addrs := func() []string { return nil }
	for name, cfg := range map[string]TaskConfig{
		"no stream":        {SourceRegion: "a", DestinationRegion: "b", Epoch: 1, Source: src, Dialer: d, Addrs: addrs},
		"same regions":     {Stream: "s", SourceRegion: "a", DestinationRegion: "a", Epoch: 1, Source: src, Dialer: d, Addrs: addrs},
		"no epoch":         {Stream: "s", SourceRegion: "a", DestinationRegion: "b", Source: src, Dialer: d, Addrs: addrs},
		"no source":        {Stream: "s", SourceRegion: "a", DestinationRegion: "b", Epoch: 1, Dialer: d, Addrs: addrs},
		"batch > window":   {Stream: "s", SourceRegion: "a", DestinationRegion: "b", Epoch: 1, Source: src, Dialer: d, Addrs: addrs, BatchBytesMax: 2 << 20, WindowBytes: 1 << 20},
		"backoff inverted": {Stream: "s", SourceRegion: "a", DestinationRegion: "b", Epoch: 1, Source: src, Dialer: d, Addrs: addrs, BackoffMin: time.Second, BackoffMax: time.Millisecond},
		"bad compression":  {Stream: "s", SourceRegion: "a", DestinationRegion: "b", Epoch: 1, Source: src, Dialer: d, Addrs: addrs, Compression: 9},
	} {
		if _, err := NewTask(cfg); err == nil {
			t.Errorf("%s: NewTask accepted %+v", name, cfg)
		}
	}
	if _, err := NewCursor(CursorConfig{Epoch: 1}); err == nil {
		t.Error("NewCursor accepted a config without Rand")
	}
	for name, cfg := range map[string]ServerConfig{
		"no region": {Store: NewMemMirrorStore()},
		"no store":  {Region: "us"},
		"tiny max":  {Region: "us", Store: NewMemMirrorStore(), UncompressedBytesMax: 10},
	} {
		if _, err := NewServer(cfg); err == nil {
			t.Errorf("%s: NewServer accepted it", name)
		}
	}
	// A task runs once.
	task, err := NewTask(taskConfig(t, src, d))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = task.Run(ctx)
	if err := task.Run(ctx); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("second Run returned %v", err)
	}
}

// TestServerForksDivergentTail: a mirror holding an old home's tail that
// the new home (epoch 2) never had is cut at the fork into the orphan log
// (Forker) and then applies the new home's frames from there; an older
// epoch's divergent frames are refused as before and cut nothing.
func TestServerForksDivergentTail(t *testing.T) {
	g := newLogGen(31, 100)
	common := []([]byte){g.frame(2), g.frame(3)} // [0,5), epoch 1, both homes
	old := *g
	old.seqs = map[uint64]uint64{}
	tail := []([]byte){old.frame(2), old.frame(2)} // [5,9), epoch 1, only the old home
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(append(append([][]byte{}, common...), tail...)...); err != nil {
		t.Fatal(err)
	}
	// The new home continues at 5 under epoch 2.
	g.epoch = 2
	next := []([]byte){g.frame(1), g.frame(4)} // [5,6) [6,10)
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(2))
	resp := c.mustAnswer(batchReq(2, CompressionNone, append(append([][]byte{}, common[1]), next...)...))
	if resp.GetError() != nil || resp.GetAppliedEndOffset() != 10 {
		t.Fatalf("batch across the fork answered %v", resp)
	}
	orphans := m.Orphans()
	if len(orphans) != 2 || !SameData(orphans[0], tail[0]) || !SameData(orphans[1], tail[1]) {
		t.Fatalf("orphans: %d frames, want the old home's 2", len(orphans))
	}
	got := m.Frames()
	if len(got) != 4 || !SameData(got[2], next[0]) || !SameData(got[3], next[1]) {
		t.Fatalf("mirror after the fork holds %d frames", len(got))
	}
	if node.srv.Stats().Forks != 1 {
		t.Fatalf("forks %d, want 1", node.srv.Stats().Forks)
	}
	// An epoch-2 frame that differs from the mirror's epoch-2 frame is not
	// a fork (same epoch): refused, nothing cut.
	alt := newLogGen(32, 100)
	alt.epoch, alt.next, alt.appendTime = 2, 6, g.appendTime
	r := refusalOf(t, c.mustAnswer(batchReq(2, CompressionNone, alt.frame(4))))
	if !errors.Is(r, ErrDiverged) || len(m.Orphans()) != 2 {
		t.Fatalf("same-epoch divergence: %v, orphans %d", r, len(m.Orphans()))
	}
}

// TestServerForksStraddledTail: a mirror whose log ends in an old home's
// frame [5, 7) that spans the new home's frame boundary at 6 (the old
// home's uncommitted tail committed on the mirror after it reported its
// applied end, so the new home resent from the frame holding 7): the batch
// from 6 shows the fork at 5, where the mirror's frame begins. The mirror
// cuts [5, 7) into its orphan log and names 5 as the gap's end; the batch
// from 5 then applies. Before, it was refused as corrupt for ever (sim
// seed 1700391).
func TestServerForksStraddledTail(t *testing.T) {
	g := newLogGen(33, 100)
	common := []([]byte){g.frame(2), g.frame(3)} // [0,5), epoch 1, both homes
	old := *g
	old.seqs = map[uint64]uint64{}
	tail := old.frame(2) // [5,7), epoch 1, only the old home
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(append(append([][]byte{}, common...), tail)...); err != nil {
		t.Fatal(err)
	}
	g.epoch = 2
	next := []([]byte){g.frame(1), g.frame(2)} // [5,6) [6,8), epoch 2
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(2))
	r := refusalOf(t, c.mustAnswer(batchReq(2, CompressionNone, next[1])))
	if !errors.Is(r, ErrGap) || r.ExpectedOffset() != 5 {
		t.Fatalf("the batch from 6 over the old home's [5, 7): %v, want a gap at 5 after the fork", r)
	}
	if orphans := m.Orphans(); len(orphans) != 1 || !SameData(orphans[0], tail) || node.srv.Stats().Forks != 1 {
		t.Fatalf("orphans: %d frames, forks %d; want the old home's frame, one fork", len(orphans), node.srv.Stats().Forks)
	}
	if resp := c.mustAnswer(batchReq(2, CompressionNone, next...)); resp.GetError() != nil || resp.GetAppliedEndOffset() != 8 {
		t.Fatalf("the batch from 5 answered %v", resp)
	}
	if got := m.Frames(); len(got) != 4 || !SameData(got[2], next[0]) || !SameData(got[3], next[1]) {
		t.Fatalf("mirror after the fork holds %d frames", len(got))
	}
}

// TestServerGroupsQueuedRequests: requests that arrive while an apply is
// in progress are served together, one apply per run of batches that
// extend each other, with the answers serving them one at a time would
// give (each at or past its batch's end; a gap refused, the stream going
// on).
func TestServerGroupsQueuedRequests(t *testing.T) {
	g := newLogGen(26, 100)
	f := make([][]byte, 8)
	for i := range f {
		f[i] = g.frame(2)
	}
	end := func(i int) uint64 { return frameNext(f[i]) }
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))

	m.Hold()
	send := func(req *geologinternalv1.ReplicateRequest) {
		t.Helper()
		if err := c.stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	send(batchReq(1, CompressionNone, f[0], f[1]))
	waitFor(t, 5*time.Second, "the first apply to block", func() bool { return m.Held() == 1 })
	send(batchReq(1, CompressionZstd, f[2]))
	send(&geologinternalv1.ReplicateRequest{Heartbeat: heartbeatPB(1, end(7))})
	send(batchReq(1, CompressionNone, f[3], f[4]))
	send(batchReq(1, CompressionNone, f[6])) // f[5] not sent yet: a gap
	send(batchReq(1, CompressionNone, f[5]))
	send(batchReq(1, CompressionZstd, f[6], f[7]))
	waitFor(t, 5*time.Second, "the server to receive every request", func() bool { return node.srv.Stats().Requests == 7 })
	m.Release()

	type want struct {
		applied uint64
		gap     bool
	}
	wants := []want{{end(1), false}, {end(4), false}, {end(4), false}, {end(4), false}, {end(4), true}, {end(7), false}, {end(7), false}}
	for i, w := range wants {
		resp, err := c.stream.Recv()
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if w.gap {
			r := refusalOf(t, resp)
			if !errors.Is(r, ErrGap) || r.ExpectedOffset() != end(4) {
				t.Fatalf("answer %d: refused with %v (expected offset %d), want a gap at %d", i, r, r.ExpectedOffset(), end(4))
			}
			continue
		}
		if resp.GetError() != nil || resp.GetAppliedEndOffset() != w.applied {
			t.Fatalf("answer %d: %v, want applied end %d", i, resp, w.applied)
		}
	}
	// One apply for f0..f1, one for f2..f4, one for f5..f7.
	if got := m.Applies(); got != 3 {
		t.Fatalf("%d applies, want 3", got)
	}
	got := m.Frames()
	if len(got) != len(f) {
		t.Fatalf("mirror holds %d frames, want %d", len(got), len(f))
	}
	for i := range got {
		if !SameData(got[i], f[i]) {
			t.Fatalf("mirror frame %d differs", i)
		}
	}
	if st := node.srv.Stats(); st.Batches != 5 {
		t.Fatalf("stats count %d batches acknowledged, want 5", st.Batches)
	}
	// The stream goes on after the group.
	if resp := c.mustAnswer(&geologinternalv1.ReplicateRequest{Heartbeat: heartbeatPB(1, end(7))}); resp.GetError() != nil || resp.GetAppliedEndOffset() != end(7) {
		t.Fatalf("heartbeat after the group answered %v", resp)
	}
}

// TestServerRefusesNotHome: with a home known (the node's homing view), a
// stream from another region, or at an epoch above the current one, is
// refused with NOT_HOME, one below it with STALE_EPOCH, before anything
// is recorded: the mirror's epoch and frames stay as they were. The view
// moving mid-stream refuses the next request.
func TestServerRefusesNotHome(t *testing.T) {
	g := newLogGen(23, 100)
	frames := [][]byte{g.frame(2), g.frame(3)}
	store := NewMemMirrorStore()
	store.SetHome(homeRegion, 2)
	node := startMirror(t, store, nil)
	m := store.Range(testStream, testRange)
	m.SetHighestEpoch(2)
	other := openReq(2)
	other.Open.SourceRegion = "elsewhere"
	for _, tc := range []struct {
		name string
		open *geologinternalv1.ReplicateRequest
		want error
	}{
		{"an epoch above the current", openReq(3), ErrNotHome},
		{"another region", other, ErrNotHome},
		{"an epoch below the current", openReq(1), ErrStaleEpoch},
	} {
		c := dialRaw(t, node.addr)
		r := refusalOf(t, c.mustAnswer(tc.open))
		if !errors.Is(r, tc.want) {
			t.Fatalf("%s: refused with %v, want %v", tc.name, r, tc.want)
		}
		expectEnd(t, c)
		if _, hbs := m.LastHeartbeat(); m.HighestEpoch() != 2 || len(m.Frames()) != 0 || hbs != 0 {
			t.Fatalf("%s: the mirror changed: epoch %d, %d frames, %d heartbeats", tc.name, m.HighestEpoch(), len(m.Frames()), hbs)
		}
	}
	c := dialRaw(t, node.addr)
	if resp := c.mustAnswer(openReq(2)); resp.GetError() != nil {
		t.Fatalf("the home's open refused: %v", resp.GetError())
	}
	if resp := c.mustAnswer(batchReq(2, CompressionNone, frames[0])); resp.GetError() != nil {
		t.Fatalf("the home's batch refused: %v", resp.GetError())
	}
	// A takeover elsewhere, as the node learns it: the stream's next
	// request is refused and applies nothing.
	store.SetHome("elsewhere", 2)
	if r := refusalOf(t, c.mustAnswer(batchReq(2, CompressionNone, frames[1]))); !errors.Is(r, ErrNotHome) {
		t.Fatalf("after the move: %v", r)
	}
	expectEnd(t, c)
	if len(m.Frames()) != 1 {
		t.Fatalf("mirror holds %d frames, want 1", len(m.Frames()))
	}
}

// TestServerAuthorizeSource: a stream whose caller may not speak for the
// source it names ends with PERMISSION_DENIED before the mirror sees it
// (its epoch raises nothing), and a stream cannot change the leader its
// heartbeats name after the open was authorized.
func TestServerAuthorizeSource(t *testing.T) {
	node := startMirror(t, NewMemMirrorStore(), func(c *ServerConfig) {
		c.AuthorizeSource = func(_ context.Context, region string, leader uint64) error {
			if region != homeRegion || leader != 5 {
				return fmt.Errorf("caller is not node 5 of %s", homeRegion)
			}
			return nil
		}
	})
	withLeader := func(req *geologinternalv1.ReplicateRequest, leader uint64) *geologinternalv1.ReplicateRequest {
		req.Heartbeat.LeaderNodeId = leader
		return req
	}
	forged := dialRaw(t, node.addr)
	if _, err := forged.roundTrip(withLeader(openReq(9), 6)); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("open in another leader's name: %v, want PermissionDenied", err)
	}
	real := dialRaw(t, node.addr)
	resp := real.mustAnswer(withLeader(openReq(1), 5))
	if resp.GetError() != nil || resp.GetHighestEpoch() != 1 {
		t.Fatalf("the authorized open answered %v: the refused open left a trace", resp)
	}
	g := newLogGen(29, 100)
	r := refusalOf(t, real.mustAnswer(withLeader(batchReq(1, CompressionNone, g.frame(1)), 6)))
	if !errors.Is(r, ErrMalformed) {
		t.Fatalf("heartbeat naming another leader refused with %v", r)
	}
	expectEnd(t, real)
	if m := node.store.Range(testStream, testRange); m != nil && m.AppliedEnd() != 0 {
		t.Fatalf("applied end %d, want nothing applied", m.AppliedEnd())
	}
}
