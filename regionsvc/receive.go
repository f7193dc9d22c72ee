package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/internal/rpcerr"
	"google.golang.org/grpc"
)

// Receiving a request (limits.go). gRPC reads an RPC's request only when
// its handler asks for it (a unary method's generated handler, through its
// decoder, before any unary interceptor runs), granting the stream's
// flow-control window for the length the message declares as the read
// starts; nothing between the RPC's headers (the tap) and the decoded
// request sees that length. A bound taken at the tap must therefore
// charge every request the receive limit, and it holds it while the RPC's
// goroutine waits to be scheduled: on busy cores that wait is most of a
// slot's time, for requests of a few hundred bytes, and small requests
// were refused for the sake of a bound meant for 16 MiB batches.
//
// So the order is turned around for the client API's methods:
//
//  1. the tap admits the RPC as waiting (RequestsWaitingMax), or refuses
//     it with OVERLOADED; a waiting request holds at most what its stream's
//     flow-control window (Start's InitialWindowSize) lets the client send
//     before anyone reads, as any open stream does;
//  2. its handler, running, takes a receive slot (RequestsReceivingMax)
//     before it reads, waiting up to receiveWaitMax for one, OVERLOADED
//     after that; the waiting slot is given back as the receive slot is
//     taken;
//  3. it reads the request, which may grow to the receive limit; the slot
//     is given back once the request is decoded (limitsStats), or when
//     the RPC ends.
//
// A slot is thus held only by a goroutine that is reading, for the time
// a read takes, and the bytes of requests being read stay bounded by
// RequestsReceivingMax times the receive limit.

// receiveWaitMax bounds a request's wait for a receive slot.
const receiveWaitMax = time.Second

// receiveGated returns a copy of desc whose methods read their request
// only once they hold a receive slot: a unary method's handler waits
// before its decoder runs (and answers a refusal as a status itself: the
// unary interceptors, rpcerr's boundary first, run after the decoder);
// a streaming method's before the method's handler (a server-streaming
// handler reads its one request first; an AppendStream holds no waiting
// slot and waits for nothing here). It records the methods for the tap
// (admitReceive), which gives any other method of the client API its
// receive slot as it arrives; call it before the server serves.
func (l *limits) receiveGated(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = slices.Clone(desc.Methods)
	for i, md := range d.Methods {
		l.gated["/"+desc.ServiceName+"/"+md.MethodName] = true
		d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			if err := l.awaitReceiveSlot(ctx); err != nil {
				return nil, rpcerr.ToStatus(err)
			}
			return md.Handler(srv, ctx, dec, in)
		}
	}
	d.Streams = slices.Clone(desc.Streams)
	for i, sd := range d.Streams {
		l.gated["/"+desc.ServiceName+"/"+sd.StreamName] = true
		d.Streams[i].Handler = func(srv any, ss grpc.ServerStream) error {
			if err := l.awaitReceiveSlot(ss.Context()); err != nil {
				return err
			}
			return sd.Handler(srv, ss)
		}
	}
	return &d
}

// awaitReceiveSlot takes a receive slot for the RPC of ctx, waiting up to
// receiveWaitMax; it refuses with OVERLOADED after that. Outside an RPC
// admitted by the tap (in-process calls) there is nothing to take.
func (l *limits) awaitReceiveSlot(ctx context.Context) error {
	h := holdOf(ctx)
	if h == nil || !h.waiting() {
		return nil
	}
	if !l.receiving.take(ctx, l.cfg.receiveWait) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return l.overloaded(ctx, "receiving", jittered(overloadRetryAfter), "node is receiving %d requests", l.cfg.RequestsReceivingMax)
	}
	if !h.receiveWith(l.receiving) {
		l.receiving.give() // the RPC ended meanwhile
		return context.Canceled
	}
	return nil
}
