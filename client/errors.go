package client

import (
	"context"
	"errors"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/internal/rpcerr"
)

// Error is a typed geolog API error: Code says what happened and Retriable
// whether the same request may succeed later unchanged. It is apierr.Error.
type Error = apierr.Error

// Code is a geolog API error code.
type Code = apierr.Code

// The API error codes, re-exported from apierr.
const (
	CodeInvalidArgument      = apierr.InvalidArgument
	CodeStreamNotFound       = apierr.StreamNotFound
	CodeStreamExists         = apierr.StreamExists
	CodeRangeNotFound        = apierr.RangeNotFound
	CodeRecordTooLarge       = apierr.RecordTooLarge
	CodeBatchTooLarge        = apierr.BatchTooLarge
	CodeEmptyBatch           = apierr.EmptyBatch
	CodeOffsetOutOfRange     = apierr.OffsetOutOfRange
	CodeSequenceGap          = apierr.SequenceGap
	CodeDuplicateOutOfWindow = apierr.DuplicateOutOfWindow
	CodeNotLeader            = apierr.NotLeader
	CodeNotHome              = apierr.NotHome
	CodeStaleEpoch           = apierr.StaleEpoch
	CodeLeaseExpired         = apierr.LeaseExpired
	CodeCorruption           = apierr.Corruption
	CodeUnavailable          = apierr.Unavailable
	CodeOverloaded           = apierr.Overloaded
	CodeShuttingDown         = apierr.ShuttingDown
	CodeTimeout              = apierr.Timeout
	CodeUnauthenticated      = apierr.Unauthenticated
	CodePermissionDenied     = apierr.PermissionDenied
	CodeInternal             = apierr.Internal
	CodeProducerStateLost    = apierr.ProducerStateLost
	CodeSlowConsumer         = apierr.SlowConsumer
)

// CodeOffsetPastLocalTail is a read past what the answering node serves
// now, which the range may hold (the node lags, or fences off a divergent
// tail): retriable, elsewhere or later.
const CodeOffsetPastLocalTail = apierr.PastLocalTail

// CodeRangeSplit is an append to a range that has split (docs/split.md):
// the batch is not in it; retriable once the range map is refreshed.
const CodeRangeSplit = apierr.RangeSplit

// CodeSplitInProgress is a split of a stream while another split of it is
// under way: retriable once it ends.
const CodeSplitInProgress = apierr.SplitInProgress

// RetryAfter returns how long the server asked to wait before a request
// it refused is sent again (OVERLOADED: a budget or quota), or 0.
func RetryAfter(err error) time.Duration {
	if e := rpcerr.FromError(err); e != nil {
		return e.RetryAfter
	}
	return 0
}

// retryDelay is the wait before retry attempt n after err: the backoff,
// or longer if the server asked for it.
func retryDelay(err error, n int, min, max time.Duration) time.Duration {
	d := backoff.Delay(n-1, min, max, nil)
	if ra := RetryAfter(err); ra > d {
		return ra
	}
	return d
}

// ErrClosed is returned for calls on, and records still unacknowledged by, a
// closed Client or Producer. A record failed with ErrClosed after it was sent
// may or may not have been appended.
var ErrClosed = errors.New("client: closed")

// ErrDeliveryTimeout fails a record whose delivery timeout passed before it
// was acknowledged. If the record had been sent, the outcome is unknown: it
// may or may not have been appended. The error wraps the last error the range
// saw, if any.
var ErrDeliveryTimeout = errors.New("client: delivery timeout")

// ErrBufferFull is the cause of the OVERLOADED error a record gets from a
// producer with FailWhenFull when the producer's bound (QueueDelayTarget,
// BufferedBytesMax) is reached: the record was not sent, so producing it
// again is safe (IsRetriable says true).
var ErrBufferFull = errors.New("client: producer buffer full")

// IsRetriable reports whether err is an API error that a retry of the same
// request may cure. Errors the client already gave up on (ErrClosed,
// ErrDeliveryTimeout, context errors) are not retriable: re-producing a
// record after them may append it twice.
func IsRetriable(err error) bool {
	if err == nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrDeliveryTimeout) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var e *Error
	return errors.As(err, &e) && e.Retriable
}

// CodeOf returns the API code carried by err: CodeTimeout for
// ErrDeliveryTimeout and context errors, CodeUnspecified-equivalent 0 for nil
// or for ErrClosed.
func CodeOf(err error) Code {
	var e *Error
	switch {
	case err == nil, errors.Is(err, ErrClosed):
		return 0
	case errors.Is(err, ErrDeliveryTimeout), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return CodeTimeout
	case errors.As(err, &e):
		return e.Code
	default:
		return CodeInternal
	}
}

// FromError turns what a gRPC call returned (a call through API, say) into
// an *Error: the ErrorDetail a geolog node sent, or, for a status without
// one, a classification by its gRPC code (UNAVAILABLE and
// RESOURCE_EXHAUSTED retriable). An *Error in err's chain is returned as
// is; nil gives nil.
func FromError(err error) *Error { return rpcerr.FromError(err) }

// rpcError is the client's one boundary for errors of gRPC calls: when ctx is
// done the context error is returned (so errors.Is(err, context.Canceled)
// works); otherwise the error is classified into an *Error.
func rpcError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return rpcerr.FromError(err)
}

// The error codes of consumer groups and cursors.
const (
	// CodeUnknownMember: the member is not in the group (removed after its
	// session or rebalance timeout, or it left); join again.
	CodeUnknownMember = apierr.UnknownMember
	// CodeStaleMemberEpoch: the request carries an epoch of an older
	// incarnation of the member; join again.
	CodeStaleMemberEpoch = apierr.StaleMemberEpoch
	// CodeRangeNotAssigned: a commit or fetch for a range the member does
	// not own.
	CodeRangeNotAssigned = apierr.RangeNotAssigned
	// CodeGroupNotEmpty: delete, reset, or a commit outside the group, while
	// the group has members.
	CodeGroupNotEmpty         = apierr.GroupNotEmpty
	CodeGroupNotFound         = apierr.GroupNotFound
	CodeStaleCursorGeneration = apierr.StaleCursorGeneration
	CodeLimitExceeded         = apierr.LimitExceeded
)

// The error codes of membership refusals (Admin.SetNodeState, a join).
const (
	// CodeNodeNotFound: no node of the region has the id.
	CodeNodeNotFound = apierr.NodeNotFound
	// CodeNodeIDRetired: the id belonged to a decommissioned node (never
	// reused; its state is final).
	CodeNodeIDRetired = apierr.NodeIDRetired
	// CodeNodeIDInUse: a member has the id at another address.
	CodeNodeIDInUse = apierr.NodeIDInUse
	// CodeAddressInUse: another node of the region has the address.
	CodeAddressInUse = apierr.AddressInUse
)
