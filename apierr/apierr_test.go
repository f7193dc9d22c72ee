package apierr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCatalogueCoversEveryCode: every API code has a gRPC mapping, and the
// server and client boundaries round-trip every field.
func TestCatalogueCoversEveryCode(t *testing.T) {
	for v := range geologv1.ErrorCode_name {
		code := Code(v)
		if code == unspecified {
			continue
		}
		info, ok := catalogue[code]
		if !ok {
			t.Fatalf("%v has no entry in the catalogue", code)
		}
		e := New(code, "boom %d", 7)
		e.LeaderHint, e.StartOffset, e.TailOffset, e.ExpectedSequence = "10.0.0.1:7400", 3, 9, 11
		e.ForkEpoch, e.ForkOffset = 4, 1234
		st, _ := status.FromError(ToStatus(fmt.Errorf("wrapped: %w", e)))
		if st.Code() != info.grpc {
			t.Fatalf("%v maps to %v, want %v", code, st.Code(), info.grpc)
		}
		back := FromError(st.Err())
		if *back != *e {
			t.Fatalf("%v round trip: %+v != %+v", code, back, e)
		}
		if IsRetriable(st.Err()) != info.retriable || CodeOf(st.Err()) != code {
			t.Fatalf("%v: classification lost", code)
		}
	}
}

func TestFromErrorWithoutDetail(t *testing.T) {
	for _, c := range []struct {
		err       error
		code      Code
		retriable bool
	}{
		{status.Error(codes.Unavailable, "conn refused"), Unavailable, true},
		{status.Error(codes.ResourceExhausted, "busy"), Overloaded, true},
		{status.Error(codes.Internal, "x"), Internal, false},
		{context.DeadlineExceeded, Timeout, true},
		{errors.New("plain"), Internal, false},
	} {
		e := FromError(c.err)
		if e.Code != c.code || e.Retriable != c.retriable {
			t.Errorf("%v: got %v retriable=%v", c.err, e.Code, e.Retriable)
		}
	}
	if FromError(nil) != nil || ToStatus(nil) != nil {
		t.Fatal("nil must stay nil")
	}
	if !errors.Is(fmt.Errorf("x: %w", New(StreamNotFound, "a")), New(StreamNotFound, "b")) {
		t.Fatal("errors.Is must match by code")
	}
}
