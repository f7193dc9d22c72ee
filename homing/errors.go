package homing

import (
	"errors"
	"fmt"

	"github.com/geolog/geolog/apierr"
)

// The package's sentinels. Every error the package returns matches one of
// them with errors.Is, and also carries an *apierr.Error (found with
// errors.As or apierr.As) whose Code and Retriable classify it for the API
// boundary. IsRetriable answers the retry question directly.
var (
	// ErrInvalidArgument: a request or configuration is malformed (bad name,
	// zero id, out-of-range number, too many items). Final.
	ErrInvalidArgument = errors.New("homing: invalid argument")
	// ErrNotHome: this node's region is not the range's home, or the range is
	// moving away (planned rehome in progress), or this node has not learned
	// its homes yet. Retriable: ask the home region, or retry after a refresh.
	ErrNotHome = errors.New("homing: range is not homed here")
	// ErrLeaseExpired: this node's liveness may have expired by its own clock
	// minus the maximum clock offset, so it must not ack. Retriable: a
	// successful heartbeat restores it. When the lease store is the reason,
	// the error also matches ErrStoreUnavailable.
	ErrLeaseExpired = errors.New("homing: liveness lease expired")
	// ErrStoreUnavailable: the lease store could not be reached or did not
	// answer in time; nothing was changed. Retriable.
	ErrStoreUnavailable = errors.New("homing: lease store unavailable")
	// ErrAmbiguousCommit: the lease store lost contact while committing, so
	// the change may or may not have been applied. Retriable only after
	// reading the current state back (every write here is a compare-and-set,
	// so a blind retry fails harmlessly with ErrEpochMismatch if the first
	// attempt had committed). Also matches ErrStoreUnavailable.
	ErrAmbiguousCommit = errors.New("homing: lease store commit outcome unknown")
	// ErrHomeLive: a takeover was refused because a node of the current home
	// region may still be live. Retriable once that node's liveness expired.
	ErrHomeLive = errors.New("homing: home region is still live")
	// ErrEpochMismatch: a compare-and-set lost: the range's homing epoch (or
	// its planned-move target) is not what the caller expected. Final for
	// that request: read the range's home again.
	ErrEpochMismatch = errors.New("homing: homing epoch mismatch")
	// ErrStartMoved: a RaiseStart lost its compare-and-set: the recorded
	// start of the epoch is no longer the one the caller read (another
	// leader of the home raised it first). Retriable: read the home again.
	ErrStartMoved = errors.New("homing: epoch start moved")
	// ErrRangeNotFound: the range has no home record.
	ErrRangeNotFound = errors.New("homing: range has no home")
	// ErrNotDrained: a planned rehome cannot complete yet because a live node
	// of the old home region has not confirmed that it stopped acking the
	// range. Retriable after that node's next heartbeat.
	ErrNotDrained = errors.New("homing: old home region not drained yet")
	// ErrRegionMismatch: a node id is registered in another region.
	ErrRegionMismatch = errors.New("homing: node is registered in another region")
	// ErrClosed: the Homes driver or the store is closed.
	ErrClosed = errors.New("homing: closed")
	// ErrSplitClaimed: the stream's next range-map version is claimed by a
	// split in another region, which this region has not applied yet.
	// Retriable once this region's map holds that split.
	ErrSplitClaimed = errors.New("homing: map version claimed by another region's split")
	// ErrSchema: the lease store's schema could not be migrated or is newer
	// than this code knows.
	ErrSchema = errors.New("homing: lease store schema")
)

// apiCodes maps each sentinel to its API error code.
var apiCodes = map[error]apierr.Code{
	ErrInvalidArgument:  apierr.InvalidArgument,
	ErrNotHome:          apierr.NotHome,
	ErrLeaseExpired:     apierr.LeaseExpired,
	ErrStoreUnavailable: apierr.Unavailable,
	ErrAmbiguousCommit:  apierr.Unavailable,
	ErrHomeLive:         apierr.Unavailable,
	ErrEpochMismatch:    apierr.StaleEpoch,
	ErrRangeNotFound:    apierr.RangeNotFound,
	ErrStartMoved:       apierr.Unavailable,
	ErrNotDrained:       apierr.Unavailable,
	ErrRegionMismatch:   apierr.InvalidArgument,
	ErrClosed:           apierr.ShuttingDown,
	ErrSchema:           apierr.Internal,
	ErrSplitClaimed:     apierr.SplitInProgress,
}

// newError returns an error matching sentinel (and the extra sentinels in
// also) and carrying the sentinel's *apierr.Error.
func newError(sentinel error, format string, args ...any) error {
	return newErrorAlso(sentinel, nil, format, args...)
}

// newErrorAlso is newError with one more error in the chain (a cause, or a
// second sentinel such as ErrStoreUnavailable behind ErrLeaseExpired). The
// sentinel's own *apierr.Error comes first, so apierr.As finds it.
func newErrorAlso(sentinel, also error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	api := apierr.New(apiCodes[sentinel], "%s", msg)
	if also != nil {
		return &homingError{msg: sentinel.Error() + ": " + msg, errs: []error{sentinel, api, also}}
	}
	return &homingError{msg: sentinel.Error() + ": " + msg, errs: []error{sentinel, api}}
}

// homingError is the package's error type: a message and the errors it
// matches (its sentinel, optionally a cause, and an *apierr.Error).
type homingError struct {
	msg  string
	errs []error
}

func (e *homingError) Error() string   { return e.msg }
func (e *homingError) Unwrap() []error { return e.errs }

// IsRetriable reports whether retrying the same request later may succeed.
func IsRetriable(err error) bool {
	if err == nil {
		return false
	}
	return apierr.As(err).Retriable
}

func invalidf(format string, args ...any) error {
	return newError(ErrInvalidArgument, format, args...)
}

func unavailablef(format string, args ...any) error {
	return newError(ErrStoreUnavailable, format, args...)
}
