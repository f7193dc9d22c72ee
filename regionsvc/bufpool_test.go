package regionsvc

import "testing"

// TestGRPCBufferPoolTiers: a buffer the server's gRPC pool hands out for a
// message is at most twice the message (gRPC's default pool gives a 40 KiB
// message a 1 MiB buffer and zeroes all of it on every reuse).
func TestGRPCBufferPoolTiers(t *testing.T) {
	t.Parallel()
	for _, n := range []int{300, 5 << 10, 40 << 10, 100 << 10, 600 << 10, 3 << 20, 16 << 20} {
		for range 2 { // the second Get reuses the first's buffer
			b := grpcBufferPool.Get(n)
			if len(*b) != n {
				t.Fatalf("Get(%d): length %d", n, len(*b))
			}
			if c := cap(*b); c > 2*n {
				t.Fatalf("Get(%d): capacity %d, over twice the message", n, c)
			}
			grpcBufferPool.Put(b)
		}
	}
}
