package rpcerr

import (
	"context"
	"errors"

	"github.com/geolog/geolog/apierr"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// UnaryServerInterceptor maps the error a unary handler, or an interceptor
// after it in the chain, returns to a gRPC status (see Boundary). Install it
// first in the chain, so that every other interceptor sees plain errors and
// the stats handlers (metrics, tracing) see the mapped status.
func UnaryServerInterceptor(logger hclog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, Boundary(logger, info.FullMethod, err)
		}
		return resp, nil
	}
}

// ServerOptions installs both interceptors: give them to grpc.NewServer
// before any other interceptor.
func ServerOptions(logger hclog.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(UnaryServerInterceptor(logger)),
		grpc.ChainStreamInterceptor(StreamServerInterceptor(logger))}
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls.
func StreamServerInterceptor(logger hclog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return Boundary(logger, info.FullMethod, handler(srv, ss))
	}
}

// internalMessage is all a caller learns of an error outside the catalogue.
const internalMessage = "internal error; the server logged its cause"

// Boundary is the mapping the interceptors apply to the error of a call to
// method: nil stays nil; an *apierr.Error in the chain becomes its status
// and ErrorDetail (ToStatus); a status from a nested call passes through; a
// context error becomes TIMEOUT (the gRPC code CANCELED or
// DEADLINE_EXCEEDED); anything else is a bug or an unclassified failure: it
// is logged with its cause and becomes INTERNAL with internalMessage, so no
// internals (paths, addresses, stack) reach the caller.
func Boundary(logger hclog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	var e *apierr.Error
	if errors.As(err, &e) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ToStatus(err)
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if logger != nil {
		logger.Error("internal error", "method", method, "err", err)
	}
	hidden := apierr.New(apierr.Internal, internalMessage)
	hidden.Cause = err // for this side only: ToStatus sends the message
	return ToStatus(hidden)
}
