package batch

import (
	"bytes"
	"errors"
	"testing"
)

// TestMark: a commit mark round-trips, is a control frame of no records,
// Raft term or index, and anything else given to DecodeMark is refused.
func TestMark(t *testing.T) {
	f := EncodeMark(nil, 1<<40+3, 77, 1234)
	h, err := Validate(f)
	if err != nil || h.Type != TypeMark || !h.IsControl() || h.BaseOffset != 77 || h.AppendTimeUnixNanos != 1234 || h.Index != 0 || h.Term != 0 {
		t.Fatalf("Validate: %+v %v", h, err)
	}
	if got, err := DecodeMark(f); err != nil || got != 1<<40+3 {
		t.Fatalf("DecodeMark: %d %v", got, err)
	}
	if !IsMark(f) || IsMark(f[:HeaderSize-1]) || h.Type.String() != "mark" {
		t.Fatal("IsMark or String")
	}
	for name, c := range map[string]struct {
		frame []byte
		want  error
	}{
		"noop":      {EncodeControl(nil, Header{Type: TypeNoop}, make([]byte, MarkPayloadBytes)), ErrNotControl},
		"short":     {EncodeControl(nil, Header{Type: TypeMark}, make([]byte, MarkPayloadBytes-1)), ErrCorrupt},
		"long":      {EncodeControl(nil, Header{Type: TypeMark}, make([]byte, MarkPayloadBytes+1)), ErrCorrupt},
		"magic":     {EncodeControl(nil, Header{Type: TypeMark}, make([]byte, MarkPayloadBytes)), ErrCorrupt},
		"indexed":   {EncodeControl(nil, Header{Type: TypeMark, Index: 3, Term: 1}, f[HeaderSize:]), ErrCorrupt},
		"epoch":     {EncodeControl(nil, Header{Type: TypeMark, Epoch: 2}, f[HeaderSize:]), ErrCorrupt},
		"producer":  {EncodeControl(nil, Header{Type: TypeMark, ProducerID: 2}, f[HeaderSize:]), ErrCorrupt},
		"truncated": {f[:len(f)-1], ErrShort},
		"data":      {Encode(nil, Header{}, []Record{{Value: []byte("v")}}), ErrNotControl},
	} {
		if _, err := DecodeMark(c.frame); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	bad := bytes.Clone(f)
	bad[len(bad)-1] ^= 1
	if _, err := DecodeMark(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad CRC: %v", err)
	}
}

// FuzzDecodeMark: any bytes decode to a mark or are refused, never a
// panic; a decoded mark re-encodes to the same frame.
func FuzzDecodeMark(f *testing.F) {
	f.Add(EncodeMark(nil, 5, 10, 20))
	f.Add(EncodeMark(nil, 0, 0, 0)[:HeaderSize])
	f.Add(EncodeControl(nil, Header{Type: TypeMark}, []byte{1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		index, err := DecodeMark(b)
		if err != nil {
			return
		}
		h, err := DecodeHeader(b)
		if err != nil {
			t.Fatalf("DecodeMark accepted what DecodeHeader refuses: %v", err)
		}
		size, _ := FrameSize(b)
		if again := EncodeMark(nil, index, h.BaseOffset, h.AppendTimeUnixNanos); !bytes.Equal(again, b[:size]) {
			t.Fatalf("re-encoded %x, decoded %x", again, b[:size])
		}
	})
}
