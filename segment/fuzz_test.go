package segment

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// FuzzRecover opens a log whose one segment holds arbitrary bytes (plain
// frames and sealed units), on vfs.Mem. Open must not panic; it fails only with corruption, and when it
// succeeds the log it kept is a prefix of the bytes, every read of it
// verifies (key reads agree with the frames), and a second Open keeps the
// same.
func FuzzRecover(f *testing.F) {
	var valid []byte
	g := &crashGen{rng: rand.New(rand.NewPCG(3, 3)), term: 1}
	next := uint64(0)
	for i := range 12 {
		fr := g.frame(next, uint64(100+i))
		h, _ := batch.DecodeHeader(fr)
		next = h.NextOffset()
		valid = append(valid, fr...)
	}
	unindexed := append(makeFrame(0, 2, 5), controlFrame(batch.TypeNoop, 2, 5, 0, 0, nil)...)
	f.Add(valid)
	// Commit marks (AppendMark) after some frames, one at the tail.
	var marked []byte
	for fr, n := valid, 0; len(fr) > 0; n++ {
		size, _ := batch.FrameSize(fr)
		h, _ := batch.DecodeHeader(fr)
		marked = append(marked, fr[:size]...)
		if n%3 == 0 || len(fr) == size {
			marked = batch.EncodeMark(marked, h.Index, h.NextOffset(), h.AppendTimeUnixNanos)
		}
		fr = fr[size:]
	}
	f.Add(marked)
	f.Add(marked[:len(marked)-5])
	f.Add(valid[:len(valid)-7])
	f.Add(unindexed)
	f.Add(append(bytes.Clone(unindexed), make([]byte, 5000)...))
	holed := bytes.Clone(valid)
	clear(holed[holeBytes : 2*holeBytes])
	f.Add(holed)
	f.Add([]byte{})
	// The sealed format (encryption at rest): the same logs, each frame
	// sealed under the test keyring, which every run opens with, so plain
	// and sealed units are both fuzzed. Before the sealed log, plain
	// frames (a log that turned encryption on).
	k := testKeyring()
	var sealed []byte
	for fr := valid; len(fr) > 0; {
		size, _ := batch.FrameSize(fr)
		sealed = k.Seal(sealed, fr[:size])
		fr = fr[size:]
	}
	f.Add(sealed)
	f.Add(sealed[:len(sealed)-9])
	f.Add(append(k.Seal(bytes.Clone(unindexed[:len(unindexed)-batch.HeaderSize]), unindexed[len(unindexed)-batch.HeaderSize:]), make([]byte, 300)...))
	holedSealed := bytes.Clone(sealed)
	clear(holedSealed[holeBytes : 2*holeBytes])
	f.Add(holedSealed)
	f.Fuzz(func(t *testing.T, data []byte) {
		m := vfs.NewMem(rand.New(rand.NewPCG(1, 1)))
		cfg := Config{Dir: "/r", FS: m, SegmentBytesMax: SegmentBytesMaxMin, IndexIntervalBytes: 64, Keyring: k}
		if err := m.MkdirAll(cfg.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(cfg.Dir, segmentName(0, logSuffix))
		if err := writeFile(m, name, data, true); err != nil {
			t.Fatal(err)
		}
		s, err := Open(cfg)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, atrest.ErrKeyUnavailable) {
				t.Fatalf("Open: %v is neither corruption nor a missing key", err)
			}
			return
		}
		kept, err := vfs.ReadFile(m, name, math.MaxInt64)
		if err != nil || !bytes.HasPrefix(data, kept) || int64(len(kept)) != s.Size() {
			t.Fatalf("kept %d bytes (%v) of %d, Size %d", len(kept), err, len(data), s.Size())
		}
		all, err := s.ReadFrames(s.StartOffset(), math.MaxInt, math.MaxUint64)
		if err != nil {
			t.Fatalf("ReadFrames of a recovered log: %v", err)
		}
		if err := verifyKeyReads(s, 5, true); err != nil {
			t.Fatalf("key reads of a recovered log: %v", err)
		}
		var byIndex []byte
		if s.LastIndex() != 0 {
			if byIndex, err = s.ReadFramesByIndex(s.FirstIndex(), s.LastIndex()+1, math.MaxInt); err != nil {
				t.Fatalf("ReadFramesByIndex of a recovered log: %v", err)
			}
			if _, err := s.TermAt(s.FirstIndex()); err != nil {
				t.Fatalf("TermAt: %v", err)
			}
		}
		next, first, last := s.NextOffset(), s.FirstIndex(), s.LastIndex()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s, err = Open(cfg)
		if err != nil {
			t.Fatalf("second Open: %v", err)
		}
		defer s.Close()
		again, err := s.ReadFrames(s.StartOffset(), math.MaxInt, math.MaxUint64)
		if err != nil || !bytes.Equal(again, all) || s.NextOffset() != next || s.FirstIndex() != first || s.LastIndex() != last {
			t.Fatalf("second Open differs: %v", err)
		}
		if last != 0 {
			again, err := s.ReadFramesByIndex(first, last+1, math.MaxInt)
			if err != nil || !bytes.Equal(again, byIndex) {
				t.Fatalf("second Open differs by index: %v", err)
			}
		}
	})
}
