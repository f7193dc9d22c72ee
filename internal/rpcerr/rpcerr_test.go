package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCataloguesAgree: the proto enum (the wire contract) and apierr's
// catalogue hold the same codes under the same names, and every code has
// a gRPC mapping.
func TestCataloguesAgree(t *testing.T) {
	for v, name := range geologv1.ErrorCode_name {
		if v == 0 {
			continue
		}
		if got := apierr.Code(v).String(); got != name {
			t.Errorf("proto %s (%d) is %q in apierr", name, v, got)
		}
	}
	for _, c := range apierr.Codes() {
		if _, ok := geologv1.ErrorCode_name[int32(c)]; !ok {
			t.Errorf("apierr's %v (%d) is not in the proto enum", c, c)
		}
		if _, ok := gRPCCodes[c]; !ok {
			t.Errorf("%v has no gRPC code", c)
		}
	}
	if len(gRPCCodes) != len(apierr.Codes()) {
		t.Errorf("gRPCCodes has %d codes, the catalogue %d", len(gRPCCodes), len(apierr.Codes()))
	}
}

// TestRoundTrip: the server and client boundaries round-trip every field of
// every code, and the classification survives.
func TestRoundTrip(t *testing.T) {
	for _, code := range apierr.Codes() {
		e := apierr.New(code, "boom %d", 7)
		e.LeaderHint, e.StartOffset, e.TailOffset, e.ExpectedSequence = "10.0.0.1:7400", 3, 9, 11
		e.ForkEpoch, e.ForkOffset, e.MemberEpoch, e.CursorGeneration = 4, 1234, 5, 6
		e.LeaderCutOff = true
		st, _ := status.FromError(ToStatus(fmt.Errorf("wrapped: %w", e)))
		if st.Code() != gRPCCodes[code] {
			t.Fatalf("%v maps to %v, want %v", code, st.Code(), gRPCCodes[code])
		}
		back := FromError(st.Err())
		if *back != *e {
			t.Fatalf("%v round trip: %+v != %+v", code, back, e)
		}
		if IsRetriable(st.Err()) != apierr.IsRetriableCode(code) || CodeOf(st.Err()) != code {
			t.Fatalf("%v: classification lost", code)
		}
	}
}

func TestFromErrorWithoutDetail(t *testing.T) {
	for _, c := range []struct {
		err       error
		code      apierr.Code
		retriable bool
	}{
		{status.Error(codes.Unavailable, "conn refused"), apierr.Unavailable, true},
		{status.Error(codes.ResourceExhausted, "busy"), apierr.Overloaded, true},
		{status.Error(codes.Canceled, "gone"), apierr.Timeout, true},
		{status.Error(codes.Internal, "x"), apierr.Internal, false},
		{context.DeadlineExceeded, apierr.Timeout, true},
		{errors.New("plain"), apierr.Internal, false},
	} {
		e := FromError(c.err)
		if e.Code != c.code || e.Retriable != c.retriable {
			t.Errorf("%v: got %v retriable=%v", c.err, e.Code, e.Retriable)
		}
	}
	if FromError(nil) != nil || ToStatus(nil) != nil || CodeOf(nil) != 0 {
		t.Fatal("nil must stay nil")
	}
}

// recordingLogger keeps what was logged at error level.
type recordingLogger struct {
	hclog.Logger
	lines []string
}

func (l *recordingLogger) Error(msg string, args ...any) {
	l.lines = append(l.lines, fmt.Sprint(append([]any{msg}, args...)...))
}

// TestBoundary drives the interceptors with handlers returning each kind of
// error and checks the status the caller would get.
func TestBoundary(t *testing.T) {
	nested := status.Error(codes.Unavailable, "peer: connection refused")
	for _, c := range []struct {
		name    string
		err     error
		code    codes.Code
		api     apierr.Code // 0: no ErrorDetail
		message string      // in the status message
		logged  bool
	}{
		{"api error", fmt.Errorf("append: %w", apierr.Wrap(apierr.NotLeader, errors.New("raft: not leader"), "range 3")),
			codes.Unavailable, apierr.NotLeader, "range 3: raft: not leader (NOT_LEADER)", false},
		{"deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded, apierr.Timeout, "deadline", false},
		{"cancelled", context.Canceled, codes.Canceled, apierr.Timeout, "canceled", false},
		{"api timeout of a cancel", apierr.Wrap(apierr.Timeout, context.Canceled, "append"), codes.Canceled, apierr.Timeout, "append", false},
		{"nested status", nested, codes.Unavailable, 0, "connection refused", false},
		{"unknown", fmt.Errorf("open /secret/data/r1: %w", errors.New("permission denied")), codes.Internal, apierr.Internal, internalMessage, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			log := &recordingLogger{Logger: hclog.NewNullLogger()}
			unary := UnaryServerInterceptor(log)
			resp, uerr := unary(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: "/geolog.v1.Log/Read"},
				func(context.Context, any) (any, error) { return "partial", c.err })
			stream := StreamServerInterceptor(log)
			serr := stream(nil, nil, &grpc.StreamServerInfo{FullMethod: "/geolog.v1.Log/Subscribe"},
				func(any, grpc.ServerStream) error { return c.err })
			if resp != nil {
				t.Fatalf("a failed call returned %v", resp)
			}
			for _, err := range []error{uerr, serr} {
				st, ok := status.FromError(err)
				if !ok || st.Code() != c.code || !strings.Contains(st.Message(), c.message) {
					t.Fatalf("got %v (status %v), want %v containing %q", err, ok, c.code, c.message)
				}
				if strings.Contains(st.Message(), "/secret") {
					t.Fatalf("internals leaked: %q", st.Message())
				}
				if got := FromError(err); c.api != 0 && (got.Code != c.api || len(st.Details()) != 1) {
					t.Fatalf("detail %+v, want code %v", got, c.api)
				}
			}
			if logged := len(log.lines) == 2; logged != c.logged {
				t.Fatalf("logged %q, want logged=%v", log.lines, c.logged)
			}
			if c.logged && !strings.Contains(log.lines[0], "/secret/data/r1") {
				t.Fatalf("the log lost the cause: %q", log.lines[0])
			}
		})
	}
	ok := UnaryServerInterceptor(nil)
	if resp, err := ok(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return "r", nil }); resp != "r" || err != nil {
		t.Fatalf("success changed: %v %v", resp, err)
	}
}
