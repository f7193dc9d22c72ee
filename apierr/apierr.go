// Package apierr is geolog's one catalogue of API errors and the one place
// where they are mapped to and from gRPC statuses.
//
// Servers return *Error values (or wrap them with %w); the gRPC boundary calls
// ToStatus. Clients call FromError on what a gRPC call returned and get an
// *Error back whose Code and Retriable tell them what to do.
package apierr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Code is an API error code.
type Code = geologv1.ErrorCode

// The codes, re-exported for brevity.
const (
	InvalidArgument      = geologv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT
	StreamNotFound       = geologv1.ErrorCode_ERROR_CODE_STREAM_NOT_FOUND
	StreamExists         = geologv1.ErrorCode_ERROR_CODE_STREAM_EXISTS
	RangeNotFound        = geologv1.ErrorCode_ERROR_CODE_RANGE_NOT_FOUND
	RecordTooLarge       = geologv1.ErrorCode_ERROR_CODE_RECORD_TOO_LARGE
	BatchTooLarge        = geologv1.ErrorCode_ERROR_CODE_BATCH_TOO_LARGE
	EmptyBatch           = geologv1.ErrorCode_ERROR_CODE_EMPTY_BATCH
	OffsetOutOfRange     = geologv1.ErrorCode_ERROR_CODE_OFFSET_OUT_OF_RANGE
	SequenceGap          = geologv1.ErrorCode_ERROR_CODE_SEQUENCE_GAP
	DuplicateOutOfWindow = geologv1.ErrorCode_ERROR_CODE_DUPLICATE_OUT_OF_WINDOW
	NotLeader            = geologv1.ErrorCode_ERROR_CODE_NOT_LEADER
	NotHome              = geologv1.ErrorCode_ERROR_CODE_NOT_HOME
	StaleEpoch           = geologv1.ErrorCode_ERROR_CODE_STALE_EPOCH
	LeaseExpired         = geologv1.ErrorCode_ERROR_CODE_LEASE_EXPIRED
	Corruption           = geologv1.ErrorCode_ERROR_CODE_CORRUPTION
	Unavailable          = geologv1.ErrorCode_ERROR_CODE_UNAVAILABLE
	Overloaded           = geologv1.ErrorCode_ERROR_CODE_OVERLOADED
	ShuttingDown         = geologv1.ErrorCode_ERROR_CODE_SHUTTING_DOWN
	Timeout              = geologv1.ErrorCode_ERROR_CODE_TIMEOUT
	Unauthenticated      = geologv1.ErrorCode_ERROR_CODE_UNAUTHENTICATED
	PermissionDenied     = geologv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED
	Internal             = geologv1.ErrorCode_ERROR_CODE_INTERNAL
	ProducerStateLost    = geologv1.ErrorCode_ERROR_CODE_PRODUCER_STATE_LOST
	SlowConsumer         = geologv1.ErrorCode_ERROR_CODE_SLOW_CONSUMER
	KeyRequired          = geologv1.ErrorCode_ERROR_CODE_KEY_REQUIRED
	unspecified          = geologv1.ErrorCode_ERROR_CODE_UNSPECIFIED
)

// PastLocalTail is an offset past what the answering node serves now,
// which the range may hold (see the proto): retriable.
const PastLocalTail = geologv1.ErrorCode_ERROR_CODE_OFFSET_PAST_LOCAL_TAIL

// The codes of consumer groups and cursors (consumer.proto).
const (
	UnknownMember         = geologv1.ErrorCode_ERROR_CODE_UNKNOWN_MEMBER
	StaleMemberEpoch      = geologv1.ErrorCode_ERROR_CODE_STALE_MEMBER_EPOCH
	RangeNotAssigned      = geologv1.ErrorCode_ERROR_CODE_RANGE_NOT_ASSIGNED
	GroupNotEmpty         = geologv1.ErrorCode_ERROR_CODE_GROUP_NOT_EMPTY
	GroupNotFound         = geologv1.ErrorCode_ERROR_CODE_GROUP_NOT_FOUND
	StaleCursorGeneration = geologv1.ErrorCode_ERROR_CODE_STALE_CURSOR_GENERATION
	LimitExceeded         = geologv1.ErrorCode_ERROR_CODE_LIMIT_EXCEEDED
)

type codeInfo struct {
	grpc      codes.Code
	retriable bool
}

// catalogue maps every API code to its gRPC code and whether a retry of the
// unchanged request may succeed.
var catalogue = map[Code]codeInfo{
	InvalidArgument:      {codes.InvalidArgument, false},
	StreamNotFound:       {codes.NotFound, false},
	StreamExists:         {codes.AlreadyExists, false},
	RangeNotFound:        {codes.NotFound, false},
	RecordTooLarge:       {codes.InvalidArgument, false},
	BatchTooLarge:        {codes.InvalidArgument, false},
	EmptyBatch:           {codes.InvalidArgument, false},
	OffsetOutOfRange:     {codes.OutOfRange, false},
	SequenceGap:          {codes.FailedPrecondition, false},
	DuplicateOutOfWindow: {codes.FailedPrecondition, false},
	NotLeader:            {codes.Unavailable, true},
	NotHome:              {codes.Unavailable, true},
	StaleEpoch:           {codes.FailedPrecondition, false},
	LeaseExpired:         {codes.Unavailable, true},
	Corruption:           {codes.DataLoss, false},
	Unavailable:          {codes.Unavailable, true},
	Overloaded:           {codes.ResourceExhausted, true},
	ShuttingDown:         {codes.Unavailable, true},
	Timeout:              {codes.DeadlineExceeded, true},
	Unauthenticated:      {codes.Unauthenticated, false},
	PermissionDenied:     {codes.PermissionDenied, false},
	Internal:             {codes.Internal, false},
	// Not retriable under the same producer id; the client restarts at a
	// higher level (a new producer id), which is what Aborted says.
	ProducerStateLost: {codes.Aborted, false},
	// A member told it is unknown or stale joins again; the request as
	// sent cannot succeed.
	UnknownMember:         {codes.FailedPrecondition, false},
	StaleMemberEpoch:      {codes.FailedPrecondition, false},
	RangeNotAssigned:      {codes.FailedPrecondition, false},
	GroupNotEmpty:         {codes.FailedPrecondition, false},
	GroupNotFound:         {codes.NotFound, false},
	StaleCursorGeneration: {codes.FailedPrecondition, false},
	LimitExceeded:         {codes.ResourceExhausted, false},
	SlowConsumer:          {codes.ResourceExhausted, true},
	KeyRequired:           {codes.InvalidArgument, false},
	PastLocalTail:         {codes.Unavailable, true},
}

// Error is a typed API error.
type Error struct {
	Code             Code
	Retriable        bool
	Message          string
	LeaderHint       string
	StartOffset      uint64
	TailOffset       uint64
	ExpectedSequence uint64
	// ForkEpoch and ForkOffset, for PRODUCER_STATE_LOST: the range's
	// current epoch and where it started (see the API's ErrorDetail).
	ForkEpoch  uint64
	ForkOffset uint64
	// RetryAfter is, for OVERLOADED and SLOW_CONSUMER, how long to wait
	// before sending the request again (0: not said).
	RetryAfter time.Duration
	// MemberEpoch (STALE_MEMBER_EPOCH) and CursorGeneration
	// (STALE_CURSOR_GENERATION) carry the current values.
	MemberEpoch      uint64
	CursorGeneration uint64
}

// NewOverloaded is a retriable OVERLOADED that asks for a wait of
// retryAfter before the request is sent again.
func NewOverloaded(retryAfter time.Duration, format string, args ...any) *Error {
	e := New(Overloaded, format, args...)
	e.RetryAfter = retryAfter
	return e
}

// retryAfterMillisMax bounds the wait a server can ask for (a detail
// comes from the network).
const retryAfterMillisMax = 10 * 60 * 1000

// New returns an *Error with the catalogue's retriability for code.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Retriable: catalogue[code].retriable, Message: fmt.Sprintf(format, args...)}
}

// Error is the message in plain words, then the code's short name (the
// enum's without its ERROR_CODE_ prefix) for scripts and searches:
// "stream \"s\" already exists (STREAM_EXISTS)".
func (e *Error) Error() string {
	name := ShortName(e.Code)
	if e.LeaderHint != "" {
		return fmt.Sprintf("%s (%s; leader %s)", e.Message, name, e.LeaderHint)
	}
	return fmt.Sprintf("%s (%s)", e.Message, name)
}

// ShortName is c's name without the enum's ERROR_CODE_ prefix:
// "STREAM_EXISTS".
func ShortName(c Code) string {
	return strings.TrimPrefix(c.String(), "ERROR_CODE_")
}

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, apierr.New(apierr.StreamNotFound, "")) works.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// Detail returns the wire form of e.
func (e *Error) Detail() *geologv1.ErrorDetail {
	return &geologv1.ErrorDetail{
		Code:             e.Code,
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
	}
}

// FromDetail converts the wire form back; nil gives nil.
func FromDetail(d *geologv1.ErrorDetail) *Error {
	if d == nil {
		return nil
	}
	return &Error{
		Code:             d.GetCode(),
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
	}
}

// As converts any error into an *Error: an *Error in the chain is returned as
// is; context cancellation and deadlines become Timeout; anything else is
// Internal.
func As(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return New(Timeout, "%v", err)
	}
	return New(Internal, "%v", err)
}

// ToStatus is the server-side boundary: it turns any error into a gRPC status
// error carrying an ErrorDetail.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		// Already a status (e.g. from a nested gRPC call); pass it through.
		var e *Error
		if !errors.As(err, &e) {
			return err
		}
	}
	e := As(err)
	info, ok := catalogue[e.Code]
	if !ok {
		info = codeInfo{codes.Unknown, false}
	}
	st := status.New(info.grpc, e.Error())
	if withDetail, derr := st.WithDetails(e.Detail()); derr == nil {
		st = withDetail
	}
	return st.Err()
}

// FromError is the client-side boundary: it turns what a gRPC call returned
// into an *Error. Statuses without a detail are classified by their gRPC code
// (Unavailable and ResourceExhausted are retriable: the connection broke or
// the server shed load before it could answer).
func FromError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		return As(err)
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*geologv1.ErrorDetail); ok {
			return FromDetail(ed)
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		return &Error{Code: Unavailable, Retriable: true, Message: st.Message()}
	case codes.ResourceExhausted:
		return &Error{Code: Overloaded, Retriable: true, Message: st.Message()}
	case codes.DeadlineExceeded, codes.Canceled:
		return &Error{Code: Timeout, Retriable: true, Message: st.Message()}
	case codes.InvalidArgument:
		return &Error{Code: InvalidArgument, Message: st.Message()}
	case codes.Unauthenticated:
		return &Error{Code: Unauthenticated, Message: st.Message()}
	case codes.PermissionDenied:
		return &Error{Code: PermissionDenied, Message: st.Message()}
	default:
		return &Error{Code: Internal, Message: fmt.Sprintf("%s: %s", st.Code(), st.Message())}
	}
}

// IsRetriable reports whether err (an *Error or a gRPC status) is retriable.
func IsRetriable(err error) bool {
	e := FromError(err)
	return e != nil && e.Retriable
}

// CodeOf returns the API code of err, or ERROR_CODE_UNSPECIFIED for nil.
func CodeOf(err error) Code {
	e := FromError(err)
	if e == nil {
		return unspecified
	}
	return e.Code
}
