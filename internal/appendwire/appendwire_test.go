package appendwire

import (
	"fmt"
	"testing"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// recs builds n records with a header each.
func recs(prefix string, n int) []*geologv1.Record {
	out := make([]*geologv1.Record, n)
	for i := range out {
		out[i] = &geologv1.Record{Key: []byte(prefix), Value: []byte(fmt.Sprintf("%s-%d", prefix, i)),
			Headers: []*geologv1.Header{{Key: "i", Value: []byte{byte(i)}}}}
	}
	return out
}

// emptyRecords is the wire form of an AppendRequest with n empty records
// (two bytes each) and the stream's name after them.
func emptyRecords(n int, stream string) []byte {
	var b []byte
	for range n {
		b = protowire.AppendTag(b, RecordsField, protowire.BytesType)
		b = protowire.AppendBytes(b, nil)
	}
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendString(b, stream)
}

// TestAppendCodecCountsOnTheWire: an append with more records, or record
// headers, than an append may hold is not decoded into structs; its other
// fields are, and the server refuses it with BATCH_TOO_LARGE
// (INVALID_ARGUMENT). One within the bounds decodes as protobuf does.
func TestAppendCodecCountsOnTheWire(t *testing.T) {
	wire := emptyRecords(1<<20, "s") // 2 MiB on the wire, a million structs decoded
	var req geologv1.AppendRequest
	allocs := testing.AllocsPerRun(3, func() {
		req.Reset()
		if err := Unmarshal(wire, &req); err != nil {
			t.Fatal(err)
		}
	})
	if len(req.GetRecords()) != 0 || req.GetStream() != "s" {
		t.Fatalf("decoded %d records, stream %q", len(req.GetRecords()), req.GetStream())
	}
	if allocs > 100 {
		t.Fatalf("%v allocations to refuse a million records", allocs)
	}
	if err := Over(&req); apierr.CodeOf(err) != apierr.BatchTooLarge {
		t.Fatalf("appendOver = %v", err)
	}

	// A million headers in few records: per record, and in all.
	rec := func(headers int) []byte {
		var r []byte
		for range headers {
			r = protowire.AppendTag(r, HeadersField, protowire.BytesType)
			r = protowire.AppendBytes(r, nil)
		}
		return r
	}
	for _, tc := range []struct {
		name             string
		records, headers int
	}{
		{"headers in one record", 1, HeadersPerRecordMax + 1},
		{"headers in all", HeadersPerBatchMax/HeadersPerRecordMax + 1, HeadersPerRecordMax},
	} {
		var b []byte
		for range tc.records {
			b = protowire.AppendTag(b, RecordsField, protowire.BytesType)
			b = protowire.AppendBytes(b, rec(tc.headers))
		}
		req.Reset()
		if err := Unmarshal(b, &req); err != nil || len(req.GetRecords()) != 0 || apierr.CodeOf(Over(&req)) != apierr.BatchTooLarge {
			t.Fatalf("%s: %d records decoded, %v, %v", tc.name, len(req.GetRecords()), err, Over(&req))
		}
	}

	// Within the bounds: what protobuf decodes.
	ok := &geologv1.AppendRequest{Stream: "s", Range: 3, ProducerId: 9, BaseSequence: 4, Records: recs("a", 5)}
	b, err := proto.Marshal(ok)
	if err != nil {
		t.Fatal(err)
	}
	req.Reset()
	if err := Unmarshal(b, &req); err != nil || !proto.Equal(&req, ok) || Over(&req) != nil {
		t.Fatalf("decoded %v, %v", &req, err)
	}
}

// FuzzAppendCodec: any bytes decode as protobuf would, or (over the
// bounds) without records and marked; never a panic.
func FuzzAppendCodec(f *testing.F) {
	for _, r := range []*geologv1.AppendRequest{
		{Stream: "s", Range: 1, Records: recs("x", 3)},
		{Stream: "t", ProducerId: 4, BaseSequence: 7, RequestId: 2},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add(emptyRecords(3, "s"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var got, want geologv1.AppendRequest
		err := Unmarshal(b, &got)
		werr := proto.Unmarshal(b, &want)
		if (err == nil) != (werr == nil) {
			t.Fatalf("codec error %v, protobuf's %v", err, werr)
		}
		if err != nil {
			return
		}
		if over := Over(&got); over != nil {
			if len(got.GetRecords()) != 0 {
				t.Fatalf("over the bounds (%v) with %d records decoded", over, len(got.GetRecords()))
			}
			return
		}
		if !proto.Equal(&got, &want) {
			t.Fatal("within the bounds, the codec decoded something else than protobuf")
		}
	})
}
