// Package rpcerr is the gRPC boundary of the API error catalogue (package
// apierr): the one place where an *apierr.Error becomes a gRPC status with
// an ErrorDetail, and back.
//
// Servers install UnaryServerInterceptor and StreamServerInterceptor (first
// in the chain, so that every other interceptor and every handler returns
// plain errors); clients call FromError on what a gRPC call returned. The
// wire contract is the proto enum geolog.v1.ErrorCode and the table of
// docs/api.md, section 8: gRPCCodes below.
package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// gRPCCodes maps every API code to its gRPC status code.
var gRPCCodes = map[apierr.Code]codes.Code{
	apierr.InvalidArgument:       codes.InvalidArgument,
	apierr.StreamNotFound:        codes.NotFound,
	apierr.StreamExists:          codes.AlreadyExists,
	apierr.RangeNotFound:         codes.NotFound,
	apierr.RecordTooLarge:        codes.InvalidArgument,
	apierr.BatchTooLarge:         codes.InvalidArgument,
	apierr.EmptyBatch:            codes.InvalidArgument,
	apierr.OffsetOutOfRange:      codes.OutOfRange,
	apierr.SequenceGap:           codes.FailedPrecondition,
	apierr.DuplicateOutOfWindow:  codes.FailedPrecondition,
	apierr.NotLeader:             codes.Unavailable,
	apierr.NotHome:               codes.Unavailable,
	apierr.StaleEpoch:            codes.FailedPrecondition,
	apierr.LeaseExpired:          codes.Unavailable,
	apierr.Corruption:            codes.DataLoss,
	apierr.Unavailable:           codes.Unavailable,
	apierr.Overloaded:            codes.ResourceExhausted,
	apierr.ShuttingDown:          codes.Unavailable,
	apierr.Timeout:               codes.DeadlineExceeded,
	apierr.Unauthenticated:       codes.Unauthenticated,
	apierr.PermissionDenied:      codes.PermissionDenied,
	apierr.Internal:              codes.Internal,
	apierr.ProducerStateLost:     codes.Aborted, // restart at a higher level: a new producer id
	apierr.UnknownMember:         codes.FailedPrecondition,
	apierr.StaleMemberEpoch:      codes.FailedPrecondition,
	apierr.RangeNotAssigned:      codes.FailedPrecondition,
	apierr.GroupNotEmpty:         codes.FailedPrecondition,
	apierr.GroupNotFound:         codes.NotFound,
	apierr.StaleCursorGeneration: codes.FailedPrecondition,
	apierr.LimitExceeded:         codes.ResourceExhausted,
	apierr.SlowConsumer:          codes.ResourceExhausted,
	apierr.KeyRequired:           codes.InvalidArgument,
	apierr.PastLocalTail:         codes.Unavailable,
	apierr.NodeNotFound:          codes.NotFound,
	apierr.NodeIDRetired:         codes.FailedPrecondition,
	apierr.NodeIDInUse:           codes.AlreadyExists,
	apierr.AddressInUse:          codes.AlreadyExists,
	apierr.RangeSplit:            codes.FailedPrecondition, // retriable once the client refreshed its range map
	apierr.SplitInProgress:       codes.Aborted,
}

// GRPCCode is code's gRPC status code (Unknown for a code outside the
// catalogue).
func GRPCCode(code apierr.Code) codes.Code {
	if c, ok := gRPCCodes[code]; ok {
		return c
	}
	return codes.Unknown
}

// WireCode is code as the proto enum (the same value).
func WireCode(code apierr.Code) geologv1.ErrorCode { return geologv1.ErrorCode(code) }

// retryAfterMillisMax bounds the wait a server can ask for (a detail
// comes from the network).
const retryAfterMillisMax = 10 * 60 * 1000

// Detail returns the wire form of e (its Cause stays behind); nil gives nil.
func Detail(e *apierr.Error) *geologv1.ErrorDetail {
	if e == nil {
		return nil
	}
	return &geologv1.ErrorDetail{
		Code:             WireCode(e.Code),
		Retriable:        e.Retriable,
		LeaderHint:       e.LeaderHint,
		Message:          e.Message,
		StartOffset:      e.StartOffset,
		TailOffset:       e.TailOffset,
		ExpectedSequence: e.ExpectedSequence,
		ForkEpoch:        e.ForkEpoch,
		ForkOffset:       e.ForkOffset,
		RetryAfterMillis: e.RetryAfter.Milliseconds(),
		MemberEpoch:      e.MemberEpoch,
		CursorGeneration: e.CursorGeneration,
		LeaderCutOff:     e.LeaderCutOff,
		SplitOffset:      e.SplitOffset,
		SplitChildren:    splitChildrenToWire(e.SplitChildren),
		SplitAt:          e.SplitAt,
	}
}

// DetailOf is Detail(apierr.As(err)): the wire form of any error, for an
// answer that carries its error in band (an AppendResponse).
func DetailOf(err error) *geologv1.ErrorDetail { return Detail(apierr.As(err)) }

// FromDetail converts the wire form back; nil gives nil.
func FromDetail(d *geologv1.ErrorDetail) *apierr.Error {
	if d == nil {
		return nil
	}
	return &apierr.Error{
		Code:             apierr.Code(d.GetCode()),
		Retriable:        d.GetRetriable(),
		LeaderHint:       d.GetLeaderHint(),
		Message:          d.GetMessage(),
		StartOffset:      d.GetStartOffset(),
		TailOffset:       d.GetTailOffset(),
		ExpectedSequence: d.GetExpectedSequence(),
		ForkEpoch:        d.GetForkEpoch(),
		ForkOffset:       d.GetForkOffset(),
		RetryAfter:       time.Duration(min(max(d.GetRetryAfterMillis(), 0), retryAfterMillisMax)) * time.Millisecond,
		MemberEpoch:      d.GetMemberEpoch(),
		CursorGeneration: d.GetCursorGeneration(),
		LeaderCutOff:     d.GetLeaderCutOff(),
		SplitOffset:      d.GetSplitOffset(),
		SplitChildren:    splitChildren(d.GetSplitChildren()),
		SplitAt:          d.GetSplitAt(),
	}
}

// splitChildren is a RANGE_SPLIT's children from the wire: a split has
// two, so anything else is dropped (nothing from the network is trusted).
func splitChildren(c []uint32) [2]uint32 {
	if len(c) != 2 {
		return [2]uint32{}
	}
	return [2]uint32{c[0], c[1]}
}

// splitChildrenToWire is the wire form of a RANGE_SPLIT's children (none
// when zero).
func splitChildrenToWire(c [2]uint32) []uint32 {
	if c == ([2]uint32{}) {
		return nil
	}
	return c[:]
}

// ToStatus turns any error into a gRPC status error carrying an
// ErrorDetail: an *apierr.Error in the chain by the catalogue (TIMEOUT
// caused by a cancellation as CANCELED), a context error as TIMEOUT, a
// status from a nested gRPC call as it is, anything else as INTERNAL with
// err's text. The interceptors call it; a handler need not.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	var e *apierr.Error
	if !errors.As(err, &e) {
		if _, ok := status.FromError(err); ok {
			return err // already a status (a nested gRPC call's): pass it through
		}
		e = apierr.As(err)
	}
	code := GRPCCode(e.Code)
	if e.Code == apierr.Timeout && errors.Is(err, context.Canceled) {
		code = codes.Canceled
	}
	st := status.New(code, e.Error())
	if withDetail, derr := st.WithDetails(Detail(e)); derr == nil {
		st = withDetail
	}
	return st.Err()
}

// FromError is the client-side boundary: it turns what a gRPC call returned
// into an *apierr.Error. Statuses without a detail are classified by their
// gRPC code (Unavailable and ResourceExhausted are retriable: the connection
// broke or the server shed load before it could answer).
func FromError(err error) *apierr.Error {
	if err == nil {
		return nil
	}
	var e *apierr.Error
	if errors.As(err, &e) {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		return apierr.As(err)
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*geologv1.ErrorDetail); ok {
			return FromDetail(ed)
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		return &apierr.Error{Code: apierr.Unavailable, Retriable: true, Message: st.Message()}
	case codes.ResourceExhausted:
		return &apierr.Error{Code: apierr.Overloaded, Retriable: true, Message: st.Message()}
	case codes.DeadlineExceeded, codes.Canceled:
		return &apierr.Error{Code: apierr.Timeout, Retriable: true, Message: st.Message()}
	case codes.InvalidArgument:
		return &apierr.Error{Code: apierr.InvalidArgument, Message: st.Message()}
	case codes.Unauthenticated:
		return &apierr.Error{Code: apierr.Unauthenticated, Message: st.Message()}
	case codes.PermissionDenied:
		return &apierr.Error{Code: apierr.PermissionDenied, Message: st.Message()}
	default:
		return &apierr.Error{Code: apierr.Internal, Message: fmt.Sprintf("%s: %s", st.Code(), st.Message())}
	}
}

// IsRetriable reports whether err (an *apierr.Error or a gRPC status) is
// retriable.
func IsRetriable(err error) bool {
	e := FromError(err)
	return e != nil && e.Retriable
}

// CodeOf returns the API code of err (an *apierr.Error or a gRPC status),
// or ERROR_CODE_UNSPECIFIED for nil.
func CodeOf(err error) apierr.Code {
	e := FromError(err)
	if e == nil {
		return 0
	}
	return e.Code
}
