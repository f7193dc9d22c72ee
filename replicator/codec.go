package replicator

import (
	"fmt"
	"runtime"
	"sync"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/klauspost/compress/zstd"
)

// Compression is how a batch's frames travel.
type Compression = geologinternalv1.Compression

const (
	// CompressionNone ships frames as they are.
	CompressionNone = geologinternalv1.Compression_COMPRESSION_NONE
	// CompressionZstd ships frames as one zstd frame.
	CompressionZstd = geologinternalv1.Compression_COMPRESSION_ZSTD
)

// compressBytesMin is the smallest batch worth compressing: below it zstd's
// frame overhead eats the gain and the batch travels uncompressed.
const compressBytesMin = 256

// An encoder is shared by every task of a process: zstd.Encoder.EncodeAll
// may be called concurrently, each call on one of the encoder's internal
// states (GOMAXPROCS of them), so the memory for compression is per core,
// not per range and destination.
var (
	encodersMu sync.Mutex
	encoders   = map[zstd.EncoderLevel]*zstd.Encoder{}
)

// sharedEncoder returns the process's encoder for level.
func sharedEncoder(level zstd.EncoderLevel) (*zstd.Encoder, error) {
	encodersMu.Lock()
	defer encodersMu.Unlock()
	if e := encoders[level]; e != nil {
		return e, nil
	}
	e, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(level),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
		// Every frame carries its own CRC32C, checked by the mirror; zstd's
		// checksum would only check the same bytes again.
		zstd.WithEncoderCRC(false),
	)
	if err != nil {
		return nil, fmt.Errorf("replicator: zstd encoder: %w", err)
	}
	encoders[level] = e
	return e, nil
}

// newDecoder returns a decoder for DecodeAll calls of up to concurrency
// goroutines at once, never producing more than cap(dst)-len(dst) bytes
// (the request's announced size) nor more than maxBytes.
func newDecoder(concurrency int, maxBytes int) (*zstd.Decoder, error) {
	d, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(concurrency),
		zstd.WithDecoderMaxMemory(uint64(maxBytes)),
		zstd.WithDecodeAllCapLimit(true),
	)
	if err != nil {
		return nil, fmt.Errorf("replicator: zstd decoder: %w", err)
	}
	return d, nil
}

// compress returns the payload and compression for frames: zstd when asked
// and the result is smaller, the frames themselves otherwise.
func compress(enc *zstd.Encoder, want Compression, frames []byte) ([]byte, Compression) {
	if want != CompressionZstd || enc == nil || len(frames) < compressBytesMin {
		return frames, CompressionNone
	}
	out := enc.EncodeAll(frames, make([]byte, 0, len(frames)/2))
	if len(out) >= len(frames) {
		return frames, CompressionNone
	}
	return out, CompressionZstd
}
