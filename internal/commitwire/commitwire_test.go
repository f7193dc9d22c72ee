package commitwire

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// randomRequest is a commit request with a few streams, some metadata,
// and every field sometimes set.
func randomRequest(rng *rand.Rand) *geologv1.CommitCursorsRequest {
	req := &geologv1.CommitCursorsRequest{Cursor: fmt.Sprintf("c%d", rng.IntN(100))}
	if rng.IntN(3) == 0 {
		req.MemberId, req.MemberEpoch = fmt.Sprintf("m%d", rng.IntN(10)), rng.Uint64()
	}
	req.Merge = rng.IntN(5) == 0
	for range rng.IntN(70) {
		p := &geologv1.CursorPosition{Stream: fmt.Sprintf("s%d", rng.IntN(2)), Range: rng.Uint32(), Offset: rng.Uint64(),
			Epoch: rng.Uint64N(5), Generation: rng.Uint64N(3)}
		if rng.IntN(4) == 0 {
			p.Metadata = []byte(fmt.Sprint(rng.Int()))
		}
		if rng.IntN(4) == 0 {
			p.CommitTimeUnixNanos = rng.Int64() - rng.Int64()
		}
		req.Positions = append(req.Positions, p)
	}
	return req
}

// mutate damages or extends an encoding the ways a client or a newer
// node might: unknown fields, repeated scalars, wrong wire types, bad
// UTF-8, a range over 32 bits, truncation, random bytes.
func mutate(rng *rand.Rand, b []byte) []byte {
	switch rng.IntN(9) {
	case 0:
		return protowire.AppendString(protowire.AppendTag(b, 99, protowire.BytesType), "new field")
	case 1:
		return protowire.AppendVarint(protowire.AppendTag(b, reqMemberEpoch, protowire.VarintType), rng.Uint64())
	case 2:
		return protowire.AppendVarint(protowire.AppendTag(b, reqCursor, protowire.VarintType), 1)
	case 3:
		return protowire.AppendBytes(protowire.AppendTag(b, reqCursor, protowire.BytesType), []byte{0xff, 0xfe})
	case 4:
		p := protowire.AppendVarint(protowire.AppendTag(nil, posRange, protowire.VarintType), 1<<33)
		return protowire.AppendBytes(protowire.AppendTag(b, reqPositions, protowire.BytesType), p)
	case 5:
		p := protowire.AppendString(protowire.AppendTag(nil, 12, protowire.BytesType), "x")
		return protowire.AppendBytes(protowire.AppendTag(b, reqPositions, protowire.BytesType), p)
	case 6:
		if len(b) > 0 {
			return b[:rng.IntN(len(b))]
		}
	case 7:
		if len(b) > 0 {
			b[rng.IntN(len(b))] = byte(rng.Uint32())
		}
	}
	return protowire.AppendVarint(protowire.AppendTag(b, reqMerge, protowire.VarintType), uint64(rng.IntN(3)))
}

// TestUnmarshalMatchesProto: whatever the bytes, Unmarshal either decodes
// exactly what proto.Unmarshal decodes, or declines (and the caller uses
// proto.Unmarshal); it declines nothing proto.Marshal makes of a request.
func TestUnmarshalMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	for i := range 5000 {
		req := randomRequest(rng)
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		mutated := i%2 == 1
		if mutated {
			b = mutate(rng, b)
		}
		want := &geologv1.CommitCursorsRequest{}
		wantErr := proto.Unmarshal(b, want)
		got := &geologv1.CommitCursorsRequest{Cursor: "left over", Positions: []*geologv1.CursorPosition{{}}}
		ok := Unmarshal(b, got)
		switch {
		case !ok && !mutated:
			t.Fatalf("case %d: declined a plain encoding", i)
		case ok && wantErr != nil:
			t.Fatalf("case %d: decoded what proto refuses (%v)", i, wantErr)
		case ok && !proto.Equal(got, want):
			t.Fatalf("case %d: decoded\n%v\nproto decodes\n%v", i, got, want)
		case !ok && !proto.Equal(got, &geologv1.CommitCursorsRequest{}):
			t.Fatalf("case %d: declined but left %v", i, got)
		}
	}
}

// TestUnmarshalCopiesAndShares: the decoded strings and bytes do not alias
// the input, and a run of positions on one stream shares one string.
func TestUnmarshalCopiesAndShares(t *testing.T) {
	req := &geologv1.CommitCursorsRequest{Cursor: "c"}
	for r := range 64 {
		req.Positions = append(req.Positions, &geologv1.CursorPosition{Stream: "orders", Range: uint32(r), Offset: 7, Metadata: []byte("m")})
	}
	b, _ := proto.Marshal(req)
	got := &geologv1.CommitCursorsRequest{}
	if !Unmarshal(b, got) {
		t.Fatal("declined")
	}
	for i := range b {
		b[i] = 0
	}
	if !proto.Equal(got, req) {
		t.Fatal("the decoded request changed with its input")
	}
	for _, p := range got.Positions {
		if unsafe.StringData(p.Stream) != unsafe.StringData(got.Positions[0].Stream) {
			t.Fatal("positions on one stream have their own strings")
		}
	}
	b, _ = proto.Marshal(req)
	if n := testing.AllocsPerRun(100, func() { Unmarshal(b, got) }); n > 4+64 {
		t.Fatalf("%v allocations for a commit of 64 positions", n)
	}
}

// TestUnmarshalResponseMatchesProto: UnmarshalResponse decodes exactly
// what proto.Unmarshal decodes, or declines, whatever the bytes; it
// declines nothing proto.Marshal makes of an answer.
func TestUnmarshalResponseMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 11))
	for i := range 5000 {
		resp := &geologv1.CommitCursorsResponse{}
		for _, p := range randomRequest(rng).Positions {
			r := &geologv1.CursorCommitResult{Applied: rng.IntN(2) == 0}
			if rng.IntN(10) > 0 {
				r.Position = p
			}
			resp.Results = append(resp.Results, r)
		}
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		mutated := i%2 == 1
		if mutated {
			b = mutateResponse(rng, b)
		}
		want := &geologv1.CommitCursorsResponse{}
		wantErr := proto.Unmarshal(b, want)
		got := &geologv1.CommitCursorsResponse{Results: []*geologv1.CursorCommitResult{{Applied: true}}}
		ok := UnmarshalResponse(b, got)
		switch {
		case !ok && !mutated:
			t.Fatalf("case %d: declined a plain encoding", i)
		case ok && wantErr != nil:
			t.Fatalf("case %d: decoded what proto refuses (%v)", i, wantErr)
		case ok && !proto.Equal(got, want):
			t.Fatalf("case %d: decoded\n%v\nproto decodes\n%v", i, got, want)
		case !ok && !proto.Equal(got, &geologv1.CommitCursorsResponse{}):
			t.Fatalf("case %d: declined but left %v", i, got)
		}
	}
}

// mutateResponse: a result with two positions (proto merges them), an
// unknown field, a bad applied value, a damaged position, truncation or
// a random byte.
func mutateResponse(rng *rand.Rand, b []byte) []byte {
	pos := protowire.AppendVarint(protowire.AppendTag(nil, posOffset, protowire.VarintType), 5)
	switch rng.IntN(6) {
	case 0:
		r := protowire.AppendBytes(protowire.AppendTag(nil, resultPosition, protowire.BytesType), pos)
		r = protowire.AppendBytes(protowire.AppendTag(r, resultPosition, protowire.BytesType),
			protowire.AppendVarint(protowire.AppendTag(nil, posEpoch, protowire.VarintType), 2))
		return protowire.AppendBytes(protowire.AppendTag(b, respResults, protowire.BytesType), r)
	case 1:
		return protowire.AppendString(protowire.AppendTag(b, 9, protowire.BytesType), "new")
	case 2:
		r := protowire.AppendVarint(protowire.AppendTag(nil, resultApplied, protowire.VarintType), 2)
		return protowire.AppendBytes(protowire.AppendTag(b, respResults, protowire.BytesType), r)
	case 3:
		r := protowire.AppendBytes(protowire.AppendTag(nil, resultPosition, protowire.BytesType), pos[:1])
		return protowire.AppendBytes(protowire.AppendTag(b, respResults, protowire.BytesType), r)
	case 4:
		if len(b) > 0 {
			return b[:rng.IntN(len(b))]
		}
	}
	if len(b) > 0 {
		b[rng.IntN(len(b))] = byte(rng.Uint32())
	}
	return b
}
