package replicator

import (
	"errors"
	"fmt"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// ErrGap reports a batch whose first offset is past the mirror's applied
// end: applying it would leave a hole. The refusal's ExpectedOffset is the
// applied end; the source rewinds to it on the same stream. Wire code
// OFFSET_OUT_OF_RANGE, with tail_offset = the expected offset.
var ErrGap = errors.New("replicator: batch would leave a gap")

// ErrDiverged reports a batch that overlaps the mirror's applied offsets
// with different data: the mirror is not a prefix of the home's log there
// (a divergent tail that homing must cut into the orphan log first, or
// corruption). Wire code CORRUPTION; the stream ends and the source backs
// off.
var ErrDiverged = errors.New("replicator: mirror diverges from the home log")

// ErrStaleEpoch reports a source whose home epoch is lower than the highest
// the mirror has seen: a newer home exists and this one is fenced. Wire code
// STALE_EPOCH; the source stops.
var ErrStaleEpoch = errors.New("replicator: stale home epoch")

// ErrMalformed reports a request that breaks the protocol: missing or
// repeated open, bad compression or payload, a corrupt or control frame,
// offsets that are not dense from first_offset, counts or sizes that do not
// match, a request for another region. Wire code INVALID_ARGUMENT; the
// stream ends.
var ErrMalformed = errors.New("replicator: malformed request")

// ErrNotLeader reports a node that does not lead the range's mirror group;
// the refusal's LeaderHint names an address to try. Wire code NOT_LEADER.
var ErrNotLeader = errors.New("replicator: not the mirror leader")

// ErrNotHome reports a source that is not the range's home at its epoch as
// the mirror's node knows homes (the lease store's, through the node's
// homing view): another region, or an epoch above the current one. Wire
// code NOT_HOME; the stream ends, nothing of the request was recorded, and
// the source backs off and retries (the node may yet learn of a newer
// home).
var ErrNotHome = errors.New("replicator: source is not the range's home")

// ErrProtocol reports a server that broke the protocol towards a source:
// more responses than requests, or an acknowledgement that does not cover
// the batch it answers. The source drops the stream and reconnects.
var ErrProtocol = errors.New("replicator: protocol violation by the mirror")

// ErrOutOfRange reports a read from a Source (or MirrorRange) outside the
// offsets it holds. Sources wrap it (segment.ErrOutOfRange is the
// production equivalent; a driver treats any read error alike).
var ErrOutOfRange = errors.New("replicator: offset out of range")

// ErrSkipRefused reports a batch flagged from_source_start (the home's log
// start, past what the mirror holds) that the mirror may not skip to: its
// applied end is at or past the batch's start (a skip never moves a log
// backwards), the batch ends past the home's committed tail (an offset
// the source never had), or the mirror cannot skip (no Skipper). Wire
// code INVALID_ARGUMENT (it reads as ErrMalformed at the source); the
// stream ends, and the source reconnects and learns the applied end.
var ErrSkipRefused = errors.New("replicator: skip refused")

// skipRefusal is ErrSkipRefused with a formatted message. It is not in
// refusalCodes: INVALID_ARGUMENT maps back to ErrMalformed.
func skipRefusal(format string, args ...any) *Refusal {
	return &Refusal{API: apierr.New(apierr.InvalidArgument, "%s: %s", ErrSkipRefused, fmt.Sprintf(format, args...)), Sentinel: ErrSkipRefused}
}

// ErrClosed reports use of a closed Server.
var ErrClosed = errors.New("replicator: closed")

// refusalCodes is the one mapping between this package's refusal sentinels
// and API codes, used both ways: newRefusal on the mirror side, fromDetail on
// the source side. Codes of no sentinel here (STREAM_NOT_FOUND,
// UNAVAILABLE, ...) travel as plain API errors.
var refusalCodes = []struct {
	err  error
	code apierr.Code
}{
	{ErrGap, apierr.OffsetOutOfRange},
	{ErrDiverged, apierr.Corruption},
	{ErrStaleEpoch, apierr.StaleEpoch},
	{ErrMalformed, apierr.InvalidArgument},
	{ErrNotLeader, apierr.NotLeader},
	{ErrNotHome, apierr.NotHome},
}

// Refusal is a mirror's refusal of a request: an API error (code, expected
// offset, leader hint) that also matches one of this package's sentinels
// with errors.Is. errors.As(err, **apierr.Error) finds the API error, so
// the gRPC boundary (internal/rpcerr) maps it.
type Refusal struct {
	// API is the error as it travels (ReplicateResponse.error).
	API *apierr.Error
	// Sentinel is the package sentinel for API.Code, or nil.
	Sentinel error
	// fork, on an ErrDiverged refusal, is where the mirror's log leaves a
	// newer home's: a fork the mirror may cut (see Forker).
	fork *forkPoint
}

// forkPoint is where a mirror's stored frames stop matching a newer home's:
// at offset at, the home's frame has epoch, above the stored frame's.
type forkPoint struct {
	at, epoch, storedEpoch uint64
}

// ExpectedOffset is the offset the mirror expects next (its applied end),
// meaningful for ErrGap.
func (r *Refusal) ExpectedOffset() uint64 { return r.API.TailOffset }

func (r *Refusal) Error() string { return r.API.Error() }

// Unwrap exposes both the sentinel and the API error.
func (r *Refusal) Unwrap() []error {
	if r.Sentinel == nil {
		return []error{r.API}
	}
	return []error{r.Sentinel, r.API}
}

// newRefusal builds the refusal for sentinel with a formatted message.
func newRefusal(sentinel error, format string, args ...any) *Refusal {
	code := apierr.Internal
	for _, rc := range refusalCodes {
		if rc.err == sentinel {
			code = rc.code
		}
	}
	msg := fmt.Sprintf(format, args...)
	return &Refusal{API: apierr.New(code, "%s: %s", sentinel, msg), Sentinel: sentinel}
}

// gapRefusal is ErrGap with the expected offset.
func gapRefusal(first, expected uint64) *Refusal {
	r := newRefusal(ErrGap, "batch starts at %d, mirror expects %d", first, expected)
	r.API.TailOffset = expected
	return r
}

// asRefusal turns any error met while serving a request into a refusal: a
// *Refusal as is, an *apierr.Error (from the node's MirrorStore or
// MirrorRange) with the sentinel of its code, anything else Internal.
func asRefusal(err error) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	return fromAPI(apierr.As(err))
}

// fromDetail turns a response's error detail back into a refusal.
func fromDetail(d *geologv1.ErrorDetail) *Refusal {
	return fromAPI(rpcerr.FromDetail(d))
}

func fromAPI(e *apierr.Error) *Refusal {
	r := &Refusal{API: e}
	for _, rc := range refusalCodes {
		if rc.code == e.Code {
			r.Sentinel = rc.err
		}
	}
	return r
}

// ErrFenced is what Task.Run returns when the mirror refused the source's
// epoch: it wraps ErrStaleEpoch.
var ErrFenced = fmt.Errorf("replicator: source fenced: %w", ErrStaleEpoch)
