package replicator

import (
	"errors"
	"testing"

	"github.com/geolog/geolog/batch"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/protobuf/proto"
)

// fuzzBytesMax bounds the announced size in the fuzzer, so that a claim of
// 64 MiB does not make every execution allocate it.
const fuzzBytesMax = 1 << 20

// FuzzDecodeRequest feeds arbitrary bytes to the mirror's request path: the
// protobuf decoding, the open and heartbeat checks, decompression and frame
// validation, and the overlap comparison. Nothing may panic; a batch that
// is accepted must hold exactly what it announces, and must compare equal
// to itself at every frame boundary.
func FuzzDecodeRequest(f *testing.F) {
	g := newLogGen(30, 64)
	f0, f1, f2 := g.frame(1), g.frame(3), g.frame(2)
	for _, req := range []*geologinternalv1.ReplicateRequest{
		openReq(1),
		batchReq(1, CompressionNone, f0, f1, f2),
		batchReq(1, CompressionZstd, f0, f1, f2),
		batchReq(1, CompressionZstd, f1),
		{Heartbeat: heartbeatPB(1, 7)},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x1a, 0x03, 0x20, 0x02, 0x2a})
	dec, err := newDecoder(1, fuzzBytesMax)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := new(geologinternalv1.ReplicateRequest)
		if proto.Unmarshal(data, req) != nil {
			return
		}
		if req.GetOpen() != nil {
			o, err := checkOpen(req, dstRegion)
			if err != nil {
				checkRefusal(t, err)
			} else if o.epoch == 0 || o.stream == "" || o.hb.Epoch != o.epoch || o.sourceRegion == dstRegion {
				t.Fatalf("accepted open %+v", o)
			}
			return
		}
		epoch := req.GetHeartbeat().GetHomeEpoch()
		if _, err := checkHeartbeat(req, epoch); err != nil {
			checkRefusal(t, err)
			return
		}
		if req.GetBatch() == nil {
			return
		}
		d, err := decodeBatch(req.GetBatch(), epoch, fuzzBytesMax, dec)
		if err != nil {
			checkRefusal(t, err)
			return
		}
		// Accepted: the frames are what the batch announced.
		frames, err := SplitFrames(d.frames)
		if err != nil {
			t.Fatalf("accepted frames do not split: %v", err)
		}
		if len(frames) != d.frameCount || frameBase(frames[0]) != d.first || frameNext(frames[len(frames)-1]) != d.end {
			t.Fatalf("accepted %d frames covering [%d, %d), announced %d covering [%d, %d)",
				len(frames), frameBase(frames[0]), frameNext(frames[len(frames)-1]), d.frameCount, d.first, d.end)
		}
		for i, fr := range frames {
			h, err := batch.DecodeHeader(fr)
			if err != nil || h.IsControl() || h.Epoch > epoch {
				t.Fatalf("accepted frame %d: %+v, %v", i, h, err)
			}
			if i > 0 && h.BaseOffset != frameNext(frames[i-1]) {
				t.Fatalf("accepted frames are not dense at %d", i)
			}
		}
		// Every frame boundary, as an applied end, compares equal.
		for _, fr := range frames {
			p, err := overlapSuffix(d, frameBase(fr), d.frames)
			if err != nil || frameBase(d.frames[p:]) != frameBase(fr) {
				t.Fatalf("self-overlap at %d: position %d, %v", frameBase(fr), p, err)
			}
		}
		if p, err := overlapSuffix(d, d.end, d.frames); err != nil || p != len(d.frames) {
			t.Fatalf("self-overlap of the whole batch: position %d, %v", p, err)
		}
		// The same frames sent uncompressed decode to the same batch.
		again := proto.Clone(req.GetBatch()).(*geologinternalv1.MirrorBatch)
		again.Compression, again.Payload = CompressionNone, d.frames
		d2, err := decodeBatch(again, epoch, fuzzBytesMax, dec)
		if err != nil || string(d2.frames) != string(d.frames) {
			t.Fatalf("uncompressed re-send refused: %v", err)
		}
	})
}

// checkRefusal checks that a refusal of the request path is a final
// INVALID_ARGUMENT.
func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) || !errors.Is(err, ErrMalformed) || r.API.Retriable {
		t.Fatalf("refusal %v is not a final ErrMalformed", err)
	}
}

// TestHeaderPositions pins the header positions this package reads without
// a CRC pass against the batch package's decoder.
func TestHeaderPositions(t *testing.T) {
	h := batch.Header{Type: batch.TypeData, BaseOffset: 0x0102030405, Epoch: 77, Term: 5, Index: 9, AppendTimeUnixNanos: 123}
	f := batch.Encode(nil, h, []batch.Record{{Value: []byte("a")}, {Value: []byte("b")}})
	if frameBase(f) != h.BaseOffset || frameNext(f) != h.BaseOffset+2 {
		t.Fatalf("frameBase %d frameNext %d", frameBase(f), frameNext(f))
	}
	g := append([]byte(nil), f...)
	batch.PatchRaft(g, 6, 10)
	if !sameData(f, g) || !SameData(f, g) {
		t.Fatal("frames differing only in term and index compare different")
	}
	batch.Patch(g, h.BaseOffset, 78, 123)
	if sameData(f, g) {
		t.Fatal("frames of different epochs compare equal")
	}
	if SameData(f, f[:len(f)-1]) {
		t.Fatal("a truncated frame compares equal")
	}
}
