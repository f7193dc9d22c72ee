package replicator

import (
	"fmt"

	"github.com/geolog/geolog/batch"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/klauspost/compress/zstd"
)

// Bounds of the open request's names: the catalogue bounds them tighter;
// these only stop a peer from making the server hold large strings.
const (
	streamNameBytesMax = 1024
	regionNameBytesMax = 256
)

// openRequest is a validated first request of a stream.
type openRequest struct {
	stream       string
	rng          uint32
	sourceRegion string
	epoch        uint64
	hb           Heartbeat
}

// checkOpen validates the first request of a stream, sent to region.
func checkOpen(req *geologinternalv1.ReplicateRequest, region string) (openRequest, error) {
	o := req.GetOpen()
	switch {
	case o == nil:
		return openRequest{}, newRefusal(ErrMalformed, "first request has no open")
	case req.GetBatch() != nil:
		return openRequest{}, newRefusal(ErrMalformed, "open request carries a batch")
	case o.GetStream() == "" || len(o.GetStream()) > streamNameBytesMax:
		return openRequest{}, newRefusal(ErrMalformed, "stream name of %d bytes", len(o.GetStream()))
	case o.GetSourceRegion() == "" || len(o.GetSourceRegion()) > regionNameBytesMax:
		return openRequest{}, newRefusal(ErrMalformed, "source region name of %d bytes", len(o.GetSourceRegion()))
	case o.GetSourceRegion() == region:
		return openRequest{}, newRefusal(ErrMalformed, "source region %q is this region", region)
	case o.GetDestinationRegion() != region:
		return openRequest{}, newRefusal(ErrMalformed, "stream for region %.256q reached region %q", o.GetDestinationRegion(), region)
	case o.GetHomeEpoch() == 0:
		return openRequest{}, newRefusal(ErrMalformed, "home epoch 0")
	}
	hb, err := checkHeartbeat(req, o.GetHomeEpoch())
	if err != nil {
		return openRequest{}, err
	}
	return openRequest{
		stream:       o.GetStream(),
		rng:          o.GetRange(),
		sourceRegion: o.GetSourceRegion(),
		epoch:        o.GetHomeEpoch(),
		hb:           hb,
	}, nil
}

// checkHeartbeat validates the heartbeat every request carries.
func checkHeartbeat(req *geologinternalv1.ReplicateRequest, epoch uint64) (Heartbeat, error) {
	hb := req.GetHeartbeat()
	switch {
	case hb == nil:
		return Heartbeat{}, newRefusal(ErrMalformed, "request without heartbeat")
	case hb.GetHomeEpoch() != epoch:
		return Heartbeat{}, newRefusal(ErrMalformed, "heartbeat epoch %d on a stream opened at epoch %d", hb.GetHomeEpoch(), epoch)
	}
	return Heartbeat{
		CommittedEnd:      hb.GetCommittedEndOffset(),
		HomeTimeUnixNanos: hb.GetHomeTimeUnixNanos(),
		Epoch:             hb.GetHomeEpoch(),
		LeaderNodeID:      hb.GetLeaderNodeId(),
		RetainFrom:        hb.GetRetainFromOffset(),
		RetainFromKnown:   hb.RetainFromOffset != nil,
	}, nil
}

// decodedBatch is a validated MirrorBatch: frameCount whole, CRC-checked
// data frames covering [first, end) densely.
type decodedBatch struct {
	first, end uint64
	frameCount int
	frames     []byte
	// fromSourceStart: first is the home's log start (MirrorBatch's
	// from_source_start), past what the source was to send next.
	fromSourceStart bool
	// homeEpoch is the epoch of the home that sent it: a skip marker
	// (skipMarker) has no frame to give one.
	homeEpoch uint64
}

// skipMarker says whether d is a batch of no frames flagged
// from_source_start, first == end: the home's retention deleted its whole
// log, so no frame can carry the flag, and the mirror skips to first, the
// home's log start and committed tail, with nothing to apply.
func (d decodedBatch) skipMarker() bool { return d.fromSourceStart && d.frameCount == 0 }

// decodeBatch decompresses and validates b, a batch sent by a home at
// epoch homeEpoch. Every failure is an ErrMalformed refusal. dec may be nil
// when uncompressedBytesMax is below what zstd needs (then ZSTD is refused);
// the payload is never decompressed past the announced size, which is
// bounded by uncompressedBytesMax first.
func decodeBatch(b *geologinternalv1.MirrorBatch, homeEpoch uint64, uncompressedBytesMax int, dec *zstd.Decoder) (decodedBatch, error) {
	first, end, count := b.GetFirstOffset(), b.GetEndOffset(), b.GetFrameCount()
	size := b.GetUncompressedBytes()
	if count == 0 && b.GetFromSourceStart() {
		if end != first || size != 0 || len(b.GetPayload()) != 0 || b.GetCompression() != CompressionNone {
			return decodedBatch{}, newRefusal(ErrMalformed, "a skip marker (no frames, from the home's start) must cover no offset and carry nothing: [%d, %d), %d bytes", first, end, size)
		}
		return decodedBatch{first: first, end: end, frames: []byte{}, fromSourceStart: true, homeEpoch: homeEpoch}, nil
	}
	switch {
	case count == 0:
		return decodedBatch{}, newRefusal(ErrMalformed, "batch of no frames")
	case end <= first:
		return decodedBatch{}, newRefusal(ErrMalformed, "batch covers [%d, %d)", first, end)
	case size > uint64(uncompressedBytesMax):
		return decodedBatch{}, newRefusal(ErrMalformed, "batch of %d bytes exceeds %d", size, uncompressedBytesMax)
	case size < uint64(count)*batch.HeaderSize:
		return decodedBatch{}, newRefusal(ErrMalformed, "%d bytes cannot hold %d frames", size, count)
	case uint64(count) > end-first:
		return decodedBatch{}, newRefusal(ErrMalformed, "%d frames cannot each hold records in [%d, %d)", count, first, end)
	}
	var frames []byte
	switch b.GetCompression() {
	case CompressionNone:
		if uint64(len(b.GetPayload())) != size {
			return decodedBatch{}, newRefusal(ErrMalformed, "payload of %d bytes announced as %d", len(b.GetPayload()), size)
		}
		frames = b.GetPayload()
	case CompressionZstd:
		if dec == nil {
			return decodedBatch{}, newRefusal(ErrMalformed, "zstd is not accepted here")
		}
		if len(b.GetPayload()) > uncompressedBytesMax {
			return decodedBatch{}, newRefusal(ErrMalformed, "compressed payload of %d bytes", len(b.GetPayload()))
		}
		out, err := dec.DecodeAll(b.GetPayload(), make([]byte, 0, size))
		if err != nil {
			return decodedBatch{}, newRefusal(ErrMalformed, "zstd payload: %v", err)
		}
		if uint64(len(out)) != size {
			return decodedBatch{}, newRefusal(ErrMalformed, "payload decompressed to %d bytes, announced %d", len(out), size)
		}
		frames = out
	default:
		return decodedBatch{}, newRefusal(ErrMalformed, "compression %v", b.GetCompression())
	}
	if err := checkFrames(frames, first, end, count, homeEpoch); err != nil {
		return decodedBatch{}, err
	}
	return decodedBatch{first: first, end: end, frameCount: int(count), frames: frames, fromSourceStart: b.GetFromSourceStart(), homeEpoch: homeEpoch}, nil
}

// checkFrames checks that frames holds exactly count whole, valid data
// frames with records (or emptied by compaction) and compaction markers,
// covering [first, end) densely but for holes before compacted frames,
// whose epochs never decrease and never exceed homeEpoch and whose append
// times never decrease.
func checkFrames(frames []byte, first, end uint64, count uint32, homeEpoch uint64) error {
	next := first
	var n uint32
	var epoch uint64
	var appendTime int64
	for p := 0; p < len(frames); n++ {
		if n == count {
			return newRefusal(ErrMalformed, "more than %d frames", count)
		}
		size, err := batch.FrameSize(frames[p:])
		if err != nil {
			return newRefusal(ErrMalformed, "frame %d: %v", n, err)
		}
		if size > len(frames)-p {
			return newRefusal(ErrMalformed, "frame %d runs past the payload", n)
		}
		h, err := batch.Validate(frames[p : p+size])
		switch {
		case err != nil:
			return newRefusal(ErrMalformed, "frame %d: %v", n, err)
		case !shipped(h):
			return newRefusal(ErrMalformed, "frame %d is a %v frame of %d records: only data frames with records and markers are shipped", n, h.Type, h.RecordCount)
		case !follows(h, next):
			return newRefusal(ErrMalformed, "frame %d starts at %d, expected %d", n, h.BaseOffset, next)
		case h.Epoch > homeEpoch:
			return newRefusal(ErrMalformed, "frame %d has epoch %d above the home's %d", n, h.Epoch, homeEpoch)
		case h.Epoch < epoch:
			return newRefusal(ErrMalformed, "frame %d has epoch %d after epoch %d", n, h.Epoch, epoch)
		case h.AppendTimeUnixNanos < appendTime:
			return newRefusal(ErrMalformed, "frame %d goes back in append time", n)
		}
		epoch, appendTime = h.Epoch, h.AppendTimeUnixNanos
		next = h.NextOffset()
		p += size
	}
	switch {
	case n != count:
		return newRefusal(ErrMalformed, "%d frames announced, %d present", count, n)
	case next != end:
		return newRefusal(ErrMalformed, "frames end at %d, batch announces %d", next, end)
	}
	return nil
}

// overlapSuffix compares the part of a batch below the mirror's applied end
// with what the mirror stored there. stored holds the mirror's frames from
// the one holding d.first (as MirrorRange.ReadFrames returns them). It
// returns the byte position in d.frames where the frames at and past
// applied begin (len(d.frames) when the batch ends at or below applied), or
// an ErrDiverged refusal when any overlapping frame differs in data or in
// its boundaries, or the mirror lacks some of them.
func overlapSuffix(d decodedBatch, applied uint64, stored []byte) (int, error) {
	if anyCompacted(d.frames, applied) || anyCompacted(stored, applied) {
		return compactedSuffix(d, applied)
	}
	p, q := 0, 0
	for p < len(d.frames) {
		size, _ := batch.FrameSize(d.frames[p:]) // validated by decodeBatch
		f := d.frames[p : p+size]
		base := frameBase(f)
		if base >= applied {
			if base != applied {
				panic(fmt.Sprintf("replicator: dense frames skip applied end %d (frame at %d)", applied, base))
			}
			return p, nil
		}
		if q < len(stored) {
			if r := forkedOff(f, stored[q:], applied); r != nil {
				return 0, r
			}
		}
		if frameNext(f) > applied {
			return 0, newRefusal(ErrDiverged, "frame [%d, %d) straddles the applied end %d", base, frameNext(f), applied)
		}
		if q >= len(stored) {
			return 0, newRefusal(ErrDiverged, "mirror has no frame at %d below its applied end %d", base, applied)
		}
		ssize, err := batch.FrameSize(stored[q:])
		if err != nil || ssize > len(stored)-q {
			return 0, newRefusal(ErrDiverged, "mirror's stored frame at byte %d is unreadable: %v", q, err)
		}
		s := stored[q : q+ssize]
		if _, err := batch.DecodeHeader(s); err != nil {
			return 0, newRefusal(ErrDiverged, "mirror's stored frame at byte %d: %v", q, err)
		}
		if !sameData(f, s) {
			return 0, newRefusal(ErrDiverged, "frame at %d differs from the mirror's (stored frame at %d, %d bytes vs %d)", base, frameBase(s), len(s), len(f))
		}
		p += size
		q += ssize
	}
	return p, nil
}

// forkedOff is the refusal naming the fork point when f, a home's frame
// below the mirror's applied end, is of a newer epoch than the mirror's
// frame at the head of stored and the two differ (in data, or in where
// they begin or end): the mirror holds an older home's tail there, which a
// Forker may cut (DESIGN.md "Divergent tails"). The fork is where the
// mirror's frame begins. When that is below f's base the frame spans the
// home's frame boundary at f's base, so it is none of the home's frames;
// this is the first frame of stored (read from the one holding the
// batch's first offset), the one a resend from the mirror's tail meets
// when an old home's uncommitted tail committed on the mirror after it
// reported its applied end (sim seed 1700391). nil when f does not show a
// fork.
func forkedOff(f, stored []byte, applied uint64) *Refusal {
	ssize, err := batch.FrameSize(stored)
	if err != nil || ssize > len(stored) {
		return nil
	}
	s := stored[:ssize]
	sh, err := batch.DecodeHeader(s)
	base := frameBase(f)
	if err != nil || sh.BaseOffset > base || frameEpoch(f) <= sh.Epoch ||
		(sh.BaseOffset == base && frameNext(f) <= applied && sameData(f, s)) {
		return nil
	}
	r := newRefusal(ErrDiverged, "frame at %d is of homing epoch %d, the mirror holds epoch %d in its frame at %d: the mirror forked off the home's log at %d",
		base, frameEpoch(f), sh.Epoch, sh.BaseOffset, sh.BaseOffset)
	r.fork = &forkPoint{at: sh.BaseOffset, epoch: frameEpoch(f), storedEpoch: sh.Epoch}
	return r
}

// resetPoint is where a mirror whose frames below its applied end are
// gone at d.first (retention deleted them, so the overlap cannot be
// compared) forks off the home's log, if it does: when d's first frame is
// of a newer epoch than logEpoch, the epoch the mirror's log ends in (0:
// unknown). Epochs never decrease along a log, so every frame the mirror
// holds is of logEpoch or older, and the range's frames at the same
// offsets from d.first on are of d's first epoch or newer: nothing the
// mirror holds from d.first on is the range's, and nothing below d.first
// is readable. The fork is at d.first, below the mirror's log start
// (replica.ProposeFork's reset). ok is false when it cannot be shown.
func resetPoint(d decodedBatch, applied, logEpoch uint64) (forkPoint, bool) {
	if d.first >= applied || logEpoch == 0 || len(d.frames) < batch.HeaderSize {
		return forkPoint{}, false
	}
	e := frameEpoch(d.frames)
	if e <= logEpoch {
		return forkPoint{}, false
	}
	return forkPoint{at: d.first, epoch: e, storedEpoch: logEpoch}, true
}

// anyCompacted reports whether any of the concatenated frames below end
// was rewritten by compaction by key (frames that do not parse count as
// not: the comparison that follows refuses them).
func anyCompacted(frames []byte, end uint64) bool {
	for p := 0; p < len(frames); {
		size, err := batch.FrameSize(frames[p:])
		if err != nil || size > len(frames)-p {
			return false
		}
		f := frames[p : p+size]
		if frameBase(f) >= end {
			return false
		}
		if frameCompacted(f) {
			return true
		}
		p += size
	}
	return false
}

// compactedSuffix is overlapSuffix where compaction by key rewrote the
// home's frames or the mirror's below its applied end: the two copies may
// then hold different frames (which emptied batches stay depends on each
// copy's segments) with the same records, so frames below the applied end
// are not compared. Compaction only runs below points every mirror had
// applied, so what lies there is no divergent tail. A frame across the
// applied end is still refused.
func compactedSuffix(d decodedBatch, applied uint64) (int, error) {
	for p := 0; p < len(d.frames); {
		size, _ := batch.FrameSize(d.frames[p:]) // validated by decodeBatch
		f := d.frames[p : p+size]
		switch {
		case frameBase(f) >= applied:
			return p, nil
		case frameNext(f) > applied:
			return 0, newRefusal(ErrDiverged, "frame [%d, %d) straddles the applied end %d", frameBase(f), frameNext(f), applied)
		}
		p += size
	}
	return len(d.frames), nil
}
