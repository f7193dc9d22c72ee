package replicator

import (
	"context"
	"io"
	"testing"

	"github.com/geolog/geolog/batch"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// fakeStream is a Replicate stream without a network: the server receives
// reqs in order, then io.EOF; what it sends is kept.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	reqs []*geologinternalv1.ReplicateRequest
	sent []*geologinternalv1.ReplicateResponse
}

func (f *fakeStream) Context() context.Context     { return f.ctx }
func (f *fakeStream) SetHeader(metadata.MD) error  { return nil }
func (f *fakeStream) SendHeader(metadata.MD) error { return nil }
func (f *fakeStream) SetTrailer(metadata.MD)       {}
func (f *fakeStream) Recv() (*geologinternalv1.ReplicateRequest, error) {
	req := new(geologinternalv1.ReplicateRequest)
	return req, f.RecvMsg(req)
}
func (f *fakeStream) Send(r *geologinternalv1.ReplicateResponse) error { return f.SendMsg(r) }
func (f *fakeStream) SendMsg(m any) error {
	f.sent = append(f.sent, m.(*geologinternalv1.ReplicateResponse))
	return nil
}
func (f *fakeStream) RecvMsg(m any) error {
	if len(f.reqs) == 0 {
		return io.EOF
	}
	proto.Merge(m.(*geologinternalv1.ReplicateRequest), f.reqs[0])
	f.reqs = f.reqs[1:]
	return nil
}

// fuzzRequests builds a stream's requests from the fuzzer's bytes: an
// open (from the home or not, at some epoch), then batches of real frames
// near the mirror's applied end at various epochs, heartbeats, repeated
// opens, damaged payloads and raw protobuf requests.
func fuzzRequests(r *fuzzBytes, g *logGen) []*geologinternalv1.ReplicateRequest {
	open := openReq(uint64(r.next() % 4))
	if r.next()%4 == 0 {
		open.Open.SourceRegion = "elsewhere"
	}
	epoch := open.GetOpen().GetHomeEpoch()
	reqs := []*geologinternalv1.ReplicateRequest{open}
	for len(reqs) < 24 && !r.done() {
		switch r.next() % 6 {
		case 0:
			req := new(geologinternalv1.ReplicateRequest)
			if proto.Unmarshal(r.take(int(r.next())), req) == nil {
				reqs = append(reqs, req)
			}
		case 1, 2:
			g.next = uint64(max(0, int64(g.next)+int64(int8(r.next()))/32))
			g.epoch = uint64(r.next()%4) + 1
			frames := make([][]byte, 1+r.next()%3)
			for i := range frames {
				frames[i] = g.frame(1 + int(r.next()%3))
			}
			reqs = append(reqs, batchReq(epoch, Compression(1+r.next()%2), frames...))
		case 3:
			reqs = append(reqs, &geologinternalv1.ReplicateRequest{Heartbeat: heartbeatPB(uint64(r.next()%4), uint64(r.next()))})
		case 4:
			reqs = append(reqs, openReq(epoch))
		case 5:
			req := batchReq(epoch, CompressionNone, g.frame(2))
			if p := req.Batch.Payload; len(p) > 0 {
				p[int(r.next())%len(p)] ^= 1 << (r.next() % 8)
			}
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// fuzzBytes hands out the fuzzer's bytes; past the end, zeros.
type fuzzBytes struct{ b []byte }

func (r *fuzzBytes) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzBytes) take(n int) []byte {
	n = min(n, len(r.b))
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *fuzzBytes) done() bool { return len(r.b) == 0 }

// FuzzServe runs the mirror's request handler (the Server over an
// in-memory mirror whose node knows the home: region homeRegion at epoch
// 2) on the fuzzer's streams: nothing may panic; the mirror's log stays a
// dense run of valid data frames; a stream that is not the home's at the
// current epoch changes nothing, and no epoch above the current one is
// ever recorded.
func FuzzServe(f *testing.F) {
	f.Add([]byte{2, 1, 1, 0, 1, 1, 1, 2, 0, 1, 2, 3, 3, 2, 9})
	f.Add([]byte{3, 1, 1, 0, 3, 1, 2, 4, 5, 0, 1})
	f.Add([]byte{2, 0, 5, 0, 2, 3, 2, 1, 1, 1, 1, 2, 2, 2, 2, 0})
	f.Add([]byte{2, 1, 0, 6, 0x12, 0x02, 0x18, 0x07, 0x08, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		store := NewMemMirrorStore()
		store.SetHome(homeRegion, 2)
		srv, err := NewServer(ServerConfig{Region: dstRegion, Store: store, UncompressedBytesMax: fuzzBytesMax})
		if err != nil {
			t.Fatal(err)
		}
		m := store.Range(testStream, testRange)
		m.SetHighestEpoch(2)
		g := newLogGen(31, 16)
		var seed []byte
		for range 3 {
			seed = append(seed, g.frame(2)...)
		}
		if _, err := m.Apply(context.Background(), seed); err != nil {
			t.Fatal(err)
		}
		before := len(m.Frames())
		r := &fuzzBytes{b: data}
		reqs := fuzzRequests(r, g)
		fromHome := reqs[0].GetOpen().GetSourceRegion() == homeRegion && reqs[0].GetOpen().GetHomeEpoch() == 2
		s := &fakeStream{ctx: context.Background(), reqs: reqs}
		_ = srv.Replicate(s)

		frames := m.Frames()
		for i, fr := range frames {
			h, err := batch.DecodeHeader(fr)
			if err != nil || h.IsControl() {
				t.Fatalf("mirror frame %d: %+v, %v", i, h, err)
			}
			if i > 0 && h.BaseOffset != frameNext(frames[i-1]) {
				t.Fatalf("mirror frames not dense at %d", i)
			}
		}
		if m.HighestEpoch() > 2 {
			t.Fatalf("mirror recorded epoch %d, above the current 2", m.HighestEpoch())
		}
		if !fromHome {
			if _, hbs := m.LastHeartbeat(); len(frames) != before || hbs != 0 {
				t.Fatalf("a stream not from the home changed the mirror: %d frames (was %d), %d heartbeats", len(frames), before, hbs)
			}
		}
	})
}
