package regionsvc

import (
	"testing"

	"github.com/geolog/geolog/internal/commitwire"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"
)

// TestAPICodecDecodesCommitsWithCommitwire: a commit as the SDK sends it
// (64 positions of one stream) goes through commitwire, not the generic
// decoder, and decodes to the request sent.
func TestAPICodecDecodesCommitsWithCommitwire(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	req := &geologv1.CommitCursorsRequest{Cursor: "bench-7"}
	for r := range 64 {
		req.Positions = append(req.Positions, &geologv1.CursorPosition{Stream: "bench-cursors", Range: uint32(r), Offset: 12345})
	}
	data, err := encoding.GetCodecV2("proto").Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if !commitwire.Unmarshal(data.Materialize(), &geologv1.CommitCursorsRequest{}) {
		t.Fatal("commitwire declines the SDK's commit")
	}
	c := newAPICodec()
	got := &geologv1.CommitCursorsRequest{}
	if err := c.Unmarshal(data, got); err != nil || !proto.Equal(got, req) {
		t.Fatalf("decoded %v, %v", got, err)
	}
	// The generic decoder makes an allocation per position and per stream
	// name; commitwire a handful per request.
	if n := testing.AllocsPerRun(50, func() { _ = c.Unmarshal(data, &geologv1.CommitCursorsRequest{}) }); n > 8 {
		t.Fatalf("%v allocations to decode a commit of 64 positions", n)
	}
}
