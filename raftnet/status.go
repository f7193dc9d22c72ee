package raftnet

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// statusCodes is the one mapping between this package's errors and gRPC
// status codes, used in both directions: toStatus on the server side of the
// boundary, fromStatus on the client side. Each code names one sentinel.
var statusCodes = []struct {
	err  error
	code codes.Code
}{
	{ErrMalformed, codes.InvalidArgument},
	{ErrWrongNode, codes.FailedPrecondition},
	{ErrSuperseded, codes.Aborted},
	{ErrClosed, codes.Unavailable},
	{ErrSnapshotsBusy, codes.ResourceExhausted},
	{ErrSnapshotTooLarge, codes.OutOfRange},
	{ErrSnapshotCorrupt, codes.DataLoss},
	{ErrUnknownGroup, codes.NotFound},
	{ErrUnauthorized, codes.PermissionDenied},
}

// toStatus turns an error of a server handler into the status the client
// sees. Errors of no sentinel (a Handler's own) become INTERNAL.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err // already a status (a stream error from gRPC itself)
	}
	// ErrInvalidMessage on the server side means the peer sent it.
	if errors.Is(err, ErrInvalidMessage) {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	for _, sc := range statusCodes {
		if errors.Is(err, sc.err) {
			return status.Error(sc.code, err.Error())
		}
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// fromStatus turns what a client stream returned into an error that wraps
// this package's sentinel for its code, when there is one, so that callers
// can classify it with errors.Is. A peer that cannot be reached at all
// (UNAVAILABLE from gRPC itself) wraps ErrPeerUnreachable.
func fromStatus(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, sc := range statusCodes {
		if sc.code == st.Code() && sc.code != codes.Unavailable {
			return fmt.Errorf("%w: %s", sc.err, st.Message())
		}
	}
	if st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded {
		return fmt.Errorf("%w: %w", ErrPeerUnreachable, err)
	}
	return err
}
