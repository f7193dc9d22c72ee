package segment

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// keepEven is a RewriteFunc that keeps the records at even offsets of the
// data frames below point, as compacted frames, drops the frames left
// without a record and the control frames, but the segment's last frame,
// and keeps the frames at and past point as they are.
func keepEven(point uint64) RewriteFunc {
	return func(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
		if h.NextOffset() > point || (h.IsControl() && last) {
			return append(dst, frame...), nil
		}
		if h.IsControl() {
			return dst, nil
		}
		_, recs, err := batch.Decode(frame)
		if err != nil {
			return nil, err
		}
		kept := recs[:0]
		for _, r := range recs {
			if h.Offset(&r)%2 == 0 {
				kept = append(kept, r)
			}
		}
		if len(kept) == 0 && !last {
			return dst, nil
		}
		h.OffsetSpan = h.Span()
		return batch.Encode(dst, h, kept), nil
	}
}

// offsetsOf reads the whole log by offset and returns the offsets of its
// records, checking every record's content.
func offsetsOf(t *testing.T, s *Store) []uint64 {
	t.Helper()
	var out []uint64
	for from := s.StartOffset(); from < s.NextOffset(); {
		b, err := s.ReadFrames(from, 300, s.NextOffset())
		if err != nil {
			t.Fatalf("ReadFrames(%d): %v", from, err)
		}
		if len(b) == 0 {
			t.Fatalf("ReadFrames(%d) returned nothing before the end %d", from, s.NextOffset())
		}
		for _, h := range checkFrames(t, b) {
			_, recs, _ := batch.Decode(frameAt(b, h))
			for i := range recs {
				if off := h.Offset(&recs[i]); off >= from {
					out = append(out, off)
				}
			}
			from = h.NextOffset()
		}
	}
	return out
}

// frameAt returns the frame of b whose header is h.
func frameAt(b []byte, h batch.Header) []byte {
	for len(b) > 0 {
		n, _ := batch.FrameSize(b)
		if g, _ := batch.DecodeHeader(b[:n]); g == h {
			return b[:n]
		}
		b = b[n:]
	}
	return nil
}

func TestRewriteSegment(t *testing.T) { forEachFS(t, testRewriteSegment) }

func testRewriteSegment(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	raftLog(t, s, 1, 120, 1, 10)
	point := s.NextOffset() // a frame boundary, as compaction points are
	if err := s.SealBefore(point); err != nil {
		t.Fatal(err)
	}
	raftLog(t, s, s.LastIndex()+1, 10, 1, 20)
	before := offsetsOf(t, s)
	sizeBefore, next, last := s.Size(), s.NextOffset(), s.LastIndex()
	var saved int64
	for _, g := range s.Sealed() {
		if g.BaseOffset >= point {
			continue
		}
		st, err := s.RewriteSegment(g.BaseOffset, nil, keepEven(point))
		if err != nil {
			t.Fatalf("rewrite %d: %v", g.BaseOffset, err)
		}
		saved += st.BytesBefore - st.BytesAfter
	}
	want := slices.DeleteFunc(slices.Clone(before), func(o uint64) bool { return o < point && o%2 == 1 })
	check := func(s *Store) {
		t.Helper()
		if got := offsetsOf(t, s); !slices.Equal(got, want) {
			t.Fatalf("offsets after the rewrite: %v\nwant %v", got, want)
		}
		if s.NextOffset() != next || s.LastIndex() != last || s.Size() != sizeBefore-saved {
			t.Fatalf("bounds moved: next %d last %d size %d", s.NextOffset(), s.LastIndex(), s.Size())
		}
		// Every offset reads from the record at or after it, holes too.
		for _, off := range []uint64{0, 1, 3, point - 1, point} {
			b, err := s.ReadFrames(off, 1, next)
			if err != nil || len(b) == 0 {
				t.Fatalf("ReadFrames(%d): %v", off, err)
			}
			h, _ := batch.DecodeHeader(b)
			if h.NextOffset() <= off {
				t.Fatalf("ReadFrames(%d) returned a frame ending at %d", off, h.NextOffset())
			}
		}
		// Raft readers walk the gaps compaction left.
		if got := readAllByIndex(t, s); len(got) == 0 {
			t.Fatal("nothing by index")
		}
		if err := s.HeadersByIndex(s.FirstIndex(), s.LastIndex()+1, func(batch.Header) {}); err != nil {
			t.Fatalf("HeadersByIndex: %v", err)
		}
	}
	check(s)
	if saved <= 0 {
		t.Fatalf("saved %d bytes", saved)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := mustOpen(t, cfg)
	defer r.Close()
	check(r)
	// Appends continue after a rewritten log.
	raftLog(t, r, r.LastIndex()+1, 5, 1, 30)
}

// TestRewriteRefusesABrokenLog: a rewrite that drops the segment's last
// frame, or returns frames out of sequence, replaces nothing.
func TestRewriteRefusesABrokenLog(t *testing.T) {
	e := memEnv(3)
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	defer s.Close()
	raftLog(t, s, 1, 60, 1, 10)
	g := s.Sealed()[0]
	image := dirImage(t, cfg)
	for name, fn := range map[string]RewriteFunc{
		"drops the last frame": func(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
			if last {
				return dst, nil
			}
			return append(dst, frame...), nil
		},
		"skips an offset": func(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
			if h.IsControl() || last {
				return append(dst, frame...), nil
			}
			_, recs, _ := batch.Decode(frame)
			h.BaseOffset++ // not a compacted frame: must continue exactly
			return batch.Encode(dst, h, recs), nil
		},
		"fails": func(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
			return nil, errors.New("no")
		},
	} {
		if _, err := s.RewriteSegment(g.BaseOffset, nil, fn); err == nil {
			t.Fatalf("%s: rewrite succeeded", name)
		}
		if got := dirImage(t, cfg); !maps(got, image) {
			t.Fatalf("%s: the directory changed", name)
		}
	}
}

// maps reports whether two directory images are equal.
func maps(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// TestRewriteAbandoned: a segment deleted by retention while it is being
// rewritten stays deleted; the rewrite reports ErrRewriteAbandoned.
func TestRewriteAbandoned(t *testing.T) {
	e := memEnv(4)
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	defer s.Close()
	raftLog(t, s, 1, 60, 1, 10)
	g := s.Sealed()[0]
	deleted := false
	_, err := s.RewriteSegment(g.BaseOffset, nil, func(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
		if !deleted {
			deleted = true
			if err := s.DeletePrefix(g.NextOffset); err != nil {
				return nil, err
			}
		}
		return append(dst, frame...), nil
	})
	if !errors.Is(err, ErrRewriteAbandoned) {
		t.Fatalf("err = %v", err)
	}
	if s.StartOffset() != g.NextOffset {
		t.Fatalf("start %d, want %d", s.StartOffset(), g.NextOffset)
	}
	for name := range dirImage(t, cfg) {
		if strings.HasPrefix(name, cleanPrefix) || name == segmentName(g.BaseOffset, logSuffix) {
			t.Fatalf("left behind: %s", name)
		}
	}
}

// TestRewriteCrashAtEveryStep crashes the disk before every file system
// operation of a rewrite: the log Open recovers holds exactly the old
// segment's records or exactly the new one's, never neither, and both
// outcomes happen.
func TestRewriteCrashAtEveryStep(t *testing.T) {
	outcomes := map[string]int{}
	for k := 1; ; k++ {
		m := vfs.NewMem(rand.New(rand.NewPCG(uint64(k), 11)))
		e := env{fs: m, dir: "/range", mem: m}
		cfg := smallConfig(t, e)
		cfg.Logger = nil
		s := mustOpen(t, cfg)
		raftLog(t, s, 1, 60, 1, 10)
		g := s.Sealed()[1]
		old := offsetsOf(t, s)
		var crashed *vfs.Mem
		ops := 0
		m.SetHook(func(op vfs.Op, name string) error {
			if ops++; ops == k {
				crashed = m.Crash()
			}
			return nil
		})
		if _, err := s.RewriteSegment(g.BaseOffset, nil, keepEven(g.NextOffset)); err != nil {
			t.Fatal(err)
		}
		m.SetHook(nil)
		compacted := offsetsOf(t, s)
		s.Close()
		if crashed == nil {
			break
		}
		cfg.FS = crashed
		r, err := Open(cfg)
		if err != nil {
			t.Fatalf("crash before operation %d: open: %v", k, err)
		}
		switch got := offsetsOf(t, r); {
		case slices.Equal(got, old):
			outcomes["old"]++
		case slices.Equal(got, compacted):
			outcomes["new"]++
		default:
			t.Fatalf("crash before operation %d: offsets %v are neither old nor new", k, got)
		}
		for name := range dirImage(t, Config{FS: crashed, Dir: cfg.Dir}) {
			if strings.HasPrefix(name, cleanPrefix) {
				t.Fatalf("crash before operation %d: %s left after open", k, name)
			}
		}
		// Whichever log it is, its key index files are its own.
		checkKeyIndexFiles(t, Config{FS: crashed, Dir: cfg.Dir})
		checkKeyReads(t, r, 10)
		r.Close()
	}
	if outcomes["old"] == 0 || outcomes["new"] == 0 {
		t.Fatalf("outcomes %v: both should occur", outcomes)
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestAppendCompactedFrame: a mirror appends the frames a compacted home
// ships: a compacted frame may start past the log's end, and an empty one
// takes its span.
func TestAppendCompactedFrame(t *testing.T) {
	e := memEnv(5)
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	if err := s.Append(makeFrame(0, 2, 1)); err != nil {
		t.Fatal(err)
	}
	h := batch.Header{BaseOffset: 10, OffsetSpan: 4, AppendTimeUnixNanos: 2}
	f := batch.Encode(nil, h, []batch.Record{{Key: []byte("k12"), Value: recordValue(12, 8+12%37), OffsetDelta: 2}})
	if err := s.Append(f); err != nil {
		t.Fatalf("append compacted frame: %v", err)
	}
	if err := s.Append(batch.Encode(nil, batch.Header{BaseOffset: 20, OffsetSpan: 3, AppendTimeUnixNanos: 2}, nil)); err != nil {
		t.Fatalf("append empty compacted frame: %v", err)
	}
	if s.NextOffset() != 23 {
		t.Fatalf("next %d", s.NextOffset())
	}
	if err := s.Append(makeFrame(30, 1, 3)); err == nil {
		t.Fatal("a dense frame skipped offsets")
	}
	if got := fmt.Sprint(offsetsOf(t, s)); got != "[0 1 12]" {
		t.Fatalf("offsets %s", got)
	}
}
