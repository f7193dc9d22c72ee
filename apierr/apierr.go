// Package apierr is geolog's one catalogue of API errors, free of gRPC.
//
// Servers and pure cores return *Error values (or wrap them with %w); an
// *Error may carry the error that caused it (Cause, Unwrap), so errors.Is
// and errors.As see through it. The mapping to and from the wire (the proto
// enum geolog.v1.ErrorCode, ErrorDetail and gRPC status codes) lives in one
// adapter at the gRPC boundary, internal/rpcerr; a Code's value is the proto
// enum's.
package apierr

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Code is an API error code. Its values are those of the proto enum
// geolog.v1.ErrorCode (the wire contract, docs/api.md): rpcerr converts one
// into the other by value, and its tests hold the two catalogues equal.
type Code int32

// The codes.
const (
	unspecified          Code = 0
	InvalidArgument      Code = 1
	StreamNotFound       Code = 2
	StreamExists         Code = 3
	RangeNotFound        Code = 4
	RecordTooLarge       Code = 5
	BatchTooLarge        Code = 6
	EmptyBatch           Code = 7
	OffsetOutOfRange     Code = 8
	SequenceGap          Code = 9
	DuplicateOutOfWindow Code = 10
	NotLeader            Code = 11
	NotHome              Code = 12
	StaleEpoch           Code = 13
	LeaseExpired         Code = 14
	Corruption           Code = 15
	Unavailable          Code = 16
	Overloaded           Code = 17
	ShuttingDown         Code = 18
	Timeout              Code = 19
	Unauthenticated      Code = 20
	PermissionDenied     Code = 21
	Internal             Code = 22
	ProducerStateLost    Code = 30
	SlowConsumer         Code = 33
	KeyRequired          Code = 37
)

// PastLocalTail is an offset past what the answering node serves now,
// which the range may hold (see the proto): retriable.
const PastLocalTail Code = 39

// The codes of membership refusals (regionsvc/members*.go), so that a
// client tells them apart without reading the message.
const (
	NodeNotFound  Code = 40
	NodeIDRetired Code = 41
	NodeIDInUse   Code = 42
	AddressInUse  Code = 43
)

// RangeSplit is an append to a range that has split (see the proto):
// retriable once the producer refreshed its range map. A read at or past
// the split offset gets it too, not retriable, with SplitOffset and
// SplitChildren set.
const RangeSplit Code = 44

// SplitInProgress is a split of a stream while another split of it is
// under way (see the proto): retriable once that split ends.
const SplitInProgress Code = 45

// The codes of consumer groups and cursors (consumer.proto).
const (
	UnknownMember         Code = 23
	StaleMemberEpoch      Code = 24
	RangeNotAssigned      Code = 25
	GroupNotEmpty         Code = 26
	GroupNotFound         Code = 27
	StaleCursorGeneration Code = 28
	LimitExceeded         Code = 29
)

type codeInfo struct {
	name      string // the proto enum's name without its ERROR_CODE_ prefix
	retriable bool
}

// catalogue names every API code and says whether a retry of the unchanged
// request may succeed.
var catalogue = map[Code]codeInfo{
	InvalidArgument:      {"INVALID_ARGUMENT", false},
	StreamNotFound:       {"STREAM_NOT_FOUND", false},
	StreamExists:         {"STREAM_EXISTS", false},
	RangeNotFound:        {"RANGE_NOT_FOUND", false},
	RecordTooLarge:       {"RECORD_TOO_LARGE", false},
	BatchTooLarge:        {"BATCH_TOO_LARGE", false},
	EmptyBatch:           {"EMPTY_BATCH", false},
	OffsetOutOfRange:     {"OFFSET_OUT_OF_RANGE", false},
	SequenceGap:          {"SEQUENCE_GAP", false},
	DuplicateOutOfWindow: {"DUPLICATE_OUT_OF_WINDOW", false},
	NotLeader:            {"NOT_LEADER", true},
	NotHome:              {"NOT_HOME", true},
	StaleEpoch:           {"STALE_EPOCH", false},
	LeaseExpired:         {"LEASE_EXPIRED", true},
	Corruption:           {"CORRUPTION", false},
	Unavailable:          {"UNAVAILABLE", true},
	Overloaded:           {"OVERLOADED", true},
	ShuttingDown:         {"SHUTTING_DOWN", true},
	Timeout:              {"TIMEOUT", true},
	Unauthenticated:      {"UNAUTHENTICATED", false},
	PermissionDenied:     {"PERMISSION_DENIED", false},
	Internal:             {"INTERNAL", false},
	// Not retriable under the same producer id; the client restarts at a
	// higher level (a new producer id).
	ProducerStateLost: {"PRODUCER_STATE_LOST", false},
	// A member told it is unknown or stale joins again; the request as
	// sent cannot succeed.
	UnknownMember:         {"UNKNOWN_MEMBER", false},
	StaleMemberEpoch:      {"STALE_MEMBER_EPOCH", false},
	RangeNotAssigned:      {"RANGE_NOT_ASSIGNED", false},
	GroupNotEmpty:         {"GROUP_NOT_EMPTY", false},
	GroupNotFound:         {"GROUP_NOT_FOUND", false},
	StaleCursorGeneration: {"STALE_CURSOR_GENERATION", false},
	LimitExceeded:         {"LIMIT_EXCEEDED", false},
	SlowConsumer:          {"SLOW_CONSUMER", true},
	KeyRequired:           {"KEY_REQUIRED", false},
	PastLocalTail:         {"OFFSET_PAST_LOCAL_TAIL", true},
	NodeNotFound:          {"NODE_NOT_FOUND", false},
	NodeIDRetired:         {"NODE_ID_RETIRED", false},
	NodeIDInUse:           {"NODE_ID_IN_USE", false},
	AddressInUse:          {"ADDRESS_IN_USE", false},
	RangeSplit:            {"RANGE_SPLIT", true},
	SplitInProgress:       {"SPLIT_IN_PROGRESS", true},
}

// Codes returns every code of the catalogue (not ERROR_CODE_UNSPECIFIED),
// in no particular order.
func Codes() []Code {
	out := make([]Code, 0, len(catalogue))
	for c := range catalogue {
		out = append(out, c)
	}
	return out
}

// String is the proto enum's name of c, "ERROR_CODE_STREAM_EXISTS" (the
// number for a code outside the catalogue, as the proto's String does).
func (c Code) String() string {
	if c == unspecified {
		return "ERROR_CODE_UNSPECIFIED"
	}
	if info, ok := catalogue[c]; ok {
		return "ERROR_CODE_" + info.name
	}
	return strconv.Itoa(int(c))
}

// ShortName is c's name without the enum's ERROR_CODE_ prefix:
// "STREAM_EXISTS".
func ShortName(c Code) string {
	if info, ok := catalogue[c]; ok {
		return info.name
	}
	if c == unspecified {
		return "UNSPECIFIED"
	}
	return strconv.Itoa(int(c))
}

// Error is a typed API error. Cause, when set, is the error that led to it
// (a sentinel of a core, a context error, an I/O error): it stays on this
// side of the wire, which carries Message only.
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
	// LeaderCutOff, for NOT_LEADER, says that the answering node leads as
	// far as it knows but has heard from no quorum within an election
	// timeout: hints naming it are stale until the others elect a leader.
	LeaderCutOff bool
	// SplitOffset, SplitChildren and SplitAt, for RANGE_SPLIT on a read:
	// the range's log ends at SplitOffset and its keys continue in the two
	// children, the first owning the hashes below SplitAt (docs/split.md
	// "Readers"). SplitChildren is zero on an append's RANGE_SPLIT (an
	// array, so that an Error stays comparable).
	SplitOffset   uint64
	SplitChildren [2]uint32
	SplitAt       uint64
	// Cause is the error that led to this one, or nil; Unwrap returns it.
	Cause error
}

// NewOverloaded is a retriable OVERLOADED that asks for a wait of
// retryAfter before the request is sent again.
func NewOverloaded(retryAfter time.Duration, format string, args ...any) *Error {
	e := New(Overloaded, format, args...)
	e.RetryAfter = retryAfter
	return e
}

// New returns an *Error with the catalogue's retriability for code.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Retriable: IsRetriableCode(code), Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with the catalogue's retriability for code whose
// cause is cause: its message is the formatted text, ": ", then cause's
// (cause's alone for an empty format), and errors.Is(e, target) holds for
// whatever cause matches.
func Wrap(code Code, cause error, format string, args ...any) *Error {
	e := New(code, format, args...)
	switch {
	case cause == nil:
	case e.Message == "":
		e.Message = cause.Error()
	default:
		e.Message += ": " + cause.Error()
	}
	e.Cause = cause
	return e
}

// IsRetriableCode reports whether the catalogue calls code retriable.
func IsRetriableCode(code Code) bool { return catalogue[code].retriable }

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

// Unwrap returns the cause, or nil.
func (e *Error) Unwrap() error { return e.Cause }

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, apierr.New(apierr.StreamNotFound, "")) works. errors.Is
// goes on to the cause when this returns false.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// As converts any error into an *Error: an *Error in the chain is returned as
// is; context cancellation and deadlines become Timeout; anything else is
// Internal. The error converted is the result's cause.
func As(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Wrap(Timeout, err, "")
	}
	return Wrap(Internal, err, "")
}

// CodeOf returns the API code of err as As classifies it, or
// ERROR_CODE_UNSPECIFIED for nil. It does not decode gRPC statuses: on what
// a gRPC call returned use rpcerr.CodeOf.
func CodeOf(err error) Code {
	if err == nil {
		return unspecified
	}
	return As(err).Code
}

// IsRetriable reports whether err is an *Error (or a context error, as As
// classifies it) that is retriable. On what a gRPC call returned use
// rpcerr.IsRetriable.
func IsRetriable(err error) bool {
	return err != nil && As(err).Retriable
}
