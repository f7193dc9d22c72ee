package regionsvc

import (
	"fmt"

	"google.golang.org/grpc/mem"
)

// grpcBufferPool is the gRPC server's buffer pool: one tier per
// power of two from 256 B to 16 MiB.
//
// gRPC's default pool has five tiers (256 B, 4 KiB, 16 KiB, 32 KiB, 1 MiB)
// and zeroes a reused buffer's whole capacity on Get. A message between
// 32 KiB and 1 MiB (an append batch of a few dozen 1 KiB records, a Raft
// MsgApp carrying it) took a 1 MiB buffer and cleared all of it: at 8
// producers at half rate that clearing was 8-9% of the three nodes' CPU
// (runtime.memclrNoHeapPointers under sizedBufferPool.Get; notes/tail.md).
// With a tier per power of two a message clears at most twice its size.
var grpcBufferPool = newGRPCBufferPool()

// GRPCBufferPool is the same pool, for geologd to make it gRPC's
// process-wide default (experimental.SetDefaultBufferPool): the protobuf
// codecs marshal into and unmarshal from the default pool's buffers
// whatever the server's option says.
var GRPCBufferPool = grpcBufferPool

// grpcBufferPoolExponents are the pool's tiers, as powers of two.
var grpcBufferPoolExponents = func() []uint8 {
	var e []uint8
	for x := uint8(8); x <= 24; x++ {
		e = append(e, x)
	}
	return e
}()

func newGRPCBufferPool() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(grpcBufferPoolExponents...)
	if err != nil {
		panic(fmt.Sprintf("regionsvc: gRPC buffer pool: %v", err))
	}
	return p
}
