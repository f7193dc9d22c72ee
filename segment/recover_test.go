package segment

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/geolog/geolog/batch"
)

// builtLog is a closed log on disk and what it holds.
type builtLog struct {
	cfg      Config
	m        model
	img      map[string][]byte
	files    []string // log files, oldest first
	lastBase uint64
	lastPos  []int64 // positions of the last segment's frames
	lastIdx  []int   // their indexes in m
}

// buildLog appends batches until there are at least minSegments segments and
// the last one holds at least minLast batches, then closes the store.
func buildLog(t *testing.T, e env, minSegments, minLast int) *builtLog {
	t.Helper()
	b := &builtLog{cfg: smallConfig(t, e)}
	s := mustOpen(t, b.cfg)
	tm := int64(0)
	for {
		tm = appendBatches(t, s, &b.m, 1, tm)
		files := logFiles(t, b.cfg)
		last, _, _ := parseSegmentName(files[len(files)-1])
		inLast := len(b.m.heads) - b.m.find(last)
		if len(files) >= minSegments && inLast >= minLast {
			break
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b.img = dirImage(t, b.cfg)
	b.files = logFiles(t, b.cfg)
	b.lastBase, _, _ = parseSegmentName(b.files[len(b.files)-1])
	pos := int64(0)
	for i := b.m.find(b.lastBase); i < len(b.m.heads); i++ {
		b.lastPos = append(b.lastPos, pos)
		b.lastIdx = append(b.lastIdx, i)
		pos += int64(len(b.m.frames[i]))
	}
	if pos != int64(len(b.img[b.files[len(b.files)-1]])) {
		t.Fatalf("last segment holds %d bytes, model says %d", len(b.img[b.files[len(b.files)-1]]), pos)
	}
	return b
}

// framePos returns the file and position of batch i of the model.
func (b *builtLog) framePos(i int) (string, int64) {
	file := ""
	for _, f := range b.files {
		base, _, _ := parseSegmentName(f)
		if base <= b.m.heads[i].BaseOffset {
			file = f
		}
	}
	base, _, _ := parseSegmentName(file)
	pos := int64(0)
	for j := b.m.find(base); j < i; j++ {
		pos += int64(len(b.m.frames[j]))
	}
	return file, pos
}

func cloneImage(img map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(img))
	for k, v := range img {
		out[k] = bytes.Clone(v)
	}
	return out
}

func TestTornTail(t *testing.T) { forEachFS(t, testTornTail) }

func testTornTail(t *testing.T, e env) {
	b := buildLog(t, e, 3, 6)
	lastFile := b.files[len(b.files)-1]
	data := b.img[lastFile]
	first := b.lastPos[len(b.lastPos)-3] // start of the last three batches
	cuts := tornTailCuts(e, b.lastPos, first, int64(len(data)))
	t.Logf("last segment %s: %d bytes, %d batches; cutting at %d of the bytes from %d", lastFile, len(data), len(b.lastPos), len(cuts), first)

	cfg := b.cfg
	cfg.Logger = nil // thousands of opens; keep the output readable
	for _, k := range cuts {
		// The last whole batch before k ends at wantPos.
		j := len(b.lastPos) - 1
		for b.lastPos[j] > k {
			j--
		}
		wantPos := b.lastPos[j]
		wantNext := b.m.heads[b.lastIdx[j]].BaseOffset
		want := bytes.Join(b.m.frames[:b.lastIdx[j]], nil)

		for _, mode := range []string{"cut", "garbage"} {
			img := cloneImage(b.img)
			switch mode {
			case "cut":
				img[lastFile] = img[lastFile][:k]
			case "garbage":
				rng := rand.New(rand.NewPCG(uint64(k), 7))
				for i := k; i < int64(len(data)); i++ {
					img[lastFile][i] = byte(rng.Uint32())
				}
			}
			writeDirImage(t, cfg, img)
			s, err := Open(cfg)
			if err != nil {
				t.Fatalf("%s at %d: Open: %v", mode, k, err)
			}
			if s.NextOffset() != wantNext || s.DurableOffset() != wantNext {
				t.Fatalf("%s at %d: NextOffset %d DurableOffset %d, want %d", mode, k, s.NextOffset(), s.DurableOffset(), wantNext)
			}
			got, err := s.ReadFrames(0, math.MaxInt, math.MaxUint64)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s at %d: read back %d bytes (%v), want %d", mode, k, len(got), err, len(want))
			}
			st, err := cfg.FS.Stat(filepath.Join(cfg.Dir, lastFile))
			if err != nil || st.Size() != wantPos {
				t.Fatalf("%s at %d: last segment is %d bytes (%v), want truncated to %d", mode, k, st.Size(), err, wantPos)
			}
			// The repaired log takes appends where it ends.
			if err := s.Append(makeFrame(wantNext, 1, math.MaxInt64)); err != nil {
				t.Fatalf("%s at %d: Append after recovery: %v", mode, k, err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// tornTailCuts is where testTornTail cuts the last segment: at every byte
// from first to end on the in-memory file system; on the real one (each
// cut writes the directory and opens the store, with its fsyncs: over two
// minutes for every byte on a busy machine) at the first and last 8 bytes
// of each batch, 2 bytes either side of its header's end, and every 16th
// byte between. The recovery logic is the same code on both; the real
// file system adds truncate and stat, which any cut exercises.
func tornTailCuts(e env, batchStarts []int64, first, end int64) []int64 {
	var cuts []int64
	for k := first; k < end; k++ {
		keep := e.mem != nil || (k-first)%16 == 0
		for i, start := range batchStarts {
			next := end
			if i+1 < len(batchStarts) {
				next = batchStarts[i+1]
			}
			in := k - start
			if k >= start && k < next && (in < 8 || next-k <= 8 || (in >= batch.HeaderSize-2 && in <= batch.HeaderSize+2)) {
				keep = true
			}
		}
		if keep {
			cuts = append(cuts, k)
		}
	}
	return cuts
}

func TestTornTailOfFirstFrame(t *testing.T) { forEachFS(t, testTornTailOfFirstFrame) }

func testTornTailOfFirstFrame(t *testing.T, e env) {
	// A log whose only frame is torn recovers to empty; so does a file of
	// zeros (a file extended but never written).
	for name, content := range map[string][]byte{
		"half a frame": makeFrame(0, 3, 0)[:50],
		"zeros":        make([]byte, 4096),
		"three bytes":  {1, 2, 3},
	} {
		t.Run(name, func(t *testing.T) {
			e := e
			e.dir = filepath.Join(e.dir, t.Name())
			cfg := smallConfig(t, e)
			if err := cfg.FS.MkdirAll(cfg.Dir, 0o755); err != nil {
				t.Fatal(err)
			}
			writeTestFile(t, cfg.FS, filepath.Join(cfg.Dir, segmentName(0, logSuffix)), content)
			s := mustOpen(t, cfg)
			defer s.Close()
			if s.NextOffset() != 0 || s.Size() != 0 {
				t.Fatalf("next %d size %d", s.NextOffset(), s.Size())
			}
		})
	}
}

func TestMidLogCorruption(t *testing.T) { forEachFS(t, testMidLogCorruption) }

func testMidLogCorruption(t *testing.T, e env) {
	b := buildLog(t, e, 4, 6)
	le := binary.LittleEndian
	sealed := b.m.find(mustBase(t, b.files[1])) + 2 // third batch of the second segment
	lastSecond := b.lastIdx[1]                      // second batch of the last segment
	lastThird := b.lastIdx[2]

	type mutation struct {
		name    string
		batch   int // batch whose position the error must name, or -1 to skip that check
		mutate  func(t *testing.T, img map[string][]byte)
		segment string
	}
	at := func(i int) (string, int64) { return b.framePos(i) }
	flip := func(i int, delta int64) func(*testing.T, map[string][]byte) {
		return func(t *testing.T, img map[string][]byte) {
			f, pos := at(i)
			img[f][pos+delta] ^= 0x40
		}
	}
	setLength := func(i int, length func(size uint32) uint32) func(*testing.T, map[string][]byte) {
		return func(t *testing.T, img map[string][]byte) {
			f, pos := at(i)
			le.PutUint32(img[f][pos:], length(le.Uint32(img[f][pos:])))
		}
	}
	for _, mu := range []mutation{
		{name: "sealed segment body byte", batch: sealed, mutate: flip(sealed, batch.HeaderSize+3)},
		{name: "sealed segment header byte", batch: sealed, mutate: flip(sealed, 20)},
		{name: "sealed segment crc byte", batch: sealed, mutate: flip(sealed, 5)},
		{name: "sealed segment length byte", batch: sealed, mutate: flip(sealed, 1)},
		{name: "sealed segment last frame", batch: b.m.find(mustBase(t, b.files[2])) - 1,
			mutate: flip(b.m.find(mustBase(t, b.files[2]))-1, batch.HeaderSize)},
		{name: "sealed segment cut short", batch: b.m.find(mustBase(t, b.files[2])) - 1, mutate: func(t *testing.T, img map[string][]byte) {
			img[b.files[1]] = img[b.files[1]][:len(img[b.files[1]])-1]
		}},
		{name: "last segment body byte", batch: lastSecond, mutate: flip(lastSecond, batch.HeaderSize+1)},
		{name: "last segment first frame", batch: b.lastIdx[0], mutate: flip(b.lastIdx[0], 9)},
		{name: "last segment length runs past the end", batch: lastSecond,
			mutate: setLength(lastSecond, func(uint32) uint32 { return 1 << 20 })},
		{name: "last segment length implausible", batch: lastSecond,
			mutate: setLength(lastSecond, func(uint32) uint32 { return 3 })},
		{name: "last segment length points into the next frame", batch: lastSecond,
			mutate: setLength(lastSecond, func(l uint32) uint32 { return l + 10 })},
		{name: "last segment length points short", batch: lastSecond,
			mutate: setLength(lastSecond, func(l uint32) uint32 { return l - 1 })},
		{name: "last segment frame zeroed", batch: lastSecond, mutate: func(t *testing.T, img map[string][]byte) {
			f, pos := at(lastSecond)
			clear(img[f][pos : pos+int64(len(b.m.frames[lastSecond]))])
		}},
		{name: "crc-valid frame out of sequence in the last segment", batch: b.lastIdx[len(b.lastIdx)-1],
			mutate: func(t *testing.T, img map[string][]byte) {
				i := b.lastIdx[len(b.lastIdx)-1]
				f, pos := at(i)
				frame := img[f][pos : pos+int64(len(b.m.frames[i]))]
				batch.Patch(frame, b.m.heads[i].BaseOffset+1, 1, b.m.heads[i].AppendTimeUnixNanos)
			}},
		{name: "crc-valid frame duplicated at the tail", batch: -1, mutate: func(t *testing.T, img map[string][]byte) {
			img[b.files[len(b.files)-1]] = append(img[b.files[len(b.files)-1]], b.m.frames[lastThird]...)
		}},
		{name: "missing middle segment", batch: -1, segment: b.files[2], mutate: func(t *testing.T, img map[string][]byte) {
			delete(img, b.files[1])
		}},
		{name: "segment named off its first frame", batch: -1, segment: segmentName(mustBase(t, b.files[1])+1, logSuffix),
			mutate: func(t *testing.T, img map[string][]byte) {
				img[segmentName(mustBase(t, b.files[1])+1, logSuffix)] = img[b.files[1]]
				delete(img, b.files[1])
			}},
		{name: "first segment named off its first frame", batch: -1, segment: segmentName(1, logSuffix),
			mutate: func(t *testing.T, img map[string][]byte) {
				img[segmentName(1, logSuffix)] = img[b.files[0]]
				delete(img, b.files[0])
			}},
	} {
		t.Run(mu.name, func(t *testing.T) {
			img := cloneImage(b.img)
			mu.mutate(t, img)
			writeDirImage(t, b.cfg, img)
			cfg := b.cfg
			cfg.Logger = testLogger(t)
			s, err := Open(cfg)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open err = %v, want ErrCorrupt", err)
			}
			ce, ok := errorsAs[*CorruptionError](err)
			if !ok {
				t.Fatalf("Open err %T is not a *CorruptionError", err)
			}
			t.Logf("Open: %v", err)
			if mu.batch >= 0 {
				f, pos := at(mu.batch)
				if ce.Segment != f || ce.Position != pos || ce.Offset != b.m.heads[mu.batch].BaseOffset {
					t.Fatalf("error names %s position %d offset %d, want %s %d %d",
						ce.Segment, ce.Position, ce.Offset, f, pos, b.m.heads[mu.batch].BaseOffset)
				}
			}
			if mu.segment != "" && ce.Segment != mu.segment {
				t.Fatalf("error names segment %s, want %s", ce.Segment, mu.segment)
			}
			if after := dirImage(t, b.cfg); !equalImages(after, img) {
				t.Fatal("Open changed files of a corrupt log")
			}
		})
	}
}

func mustBase(t *testing.T, name string) uint64 {
	t.Helper()
	base, suffix, ok := parseSegmentName(name)
	if !ok || suffix != logSuffix {
		t.Fatalf("bad segment name %q", name)
	}
	return base
}

func TestCorruptionOnRead(t *testing.T) { forEachFS(t, testCorruptionOnRead) }

func testCorruptionOnRead(t *testing.T, e env) {
	b := buildLog(t, e, 3, 2)
	s := mustOpen(t, b.cfg)
	defer s.Close()
	i := b.m.find(mustBase(t, b.files[1])) + 1
	file, pos := b.framePos(i)
	f, err := b.cfg.FS.OpenFile(filepath.Join(b.cfg.Dir, file), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{b.m.frames[i][60] ^ 1}, pos+60); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, from := range []uint64{b.m.heads[i].BaseOffset, b.m.heads[i-1].BaseOffset} {
		_, err := s.ReadFrames(from, 1<<20, math.MaxUint64)
		ce, ok := errorsAs[*CorruptionError](err)
		if !errors.Is(err, ErrCorrupt) || !ok || ce.Segment != file || ce.Position != pos {
			t.Fatalf("ReadFrames(%d) err = %v, want corruption at %s:%d", from, err, file, pos)
		}
	}
	// Reads that do not touch the bad frame still work.
	if got, err := s.ReadFrames(b.m.heads[i-1].BaseOffset, 0, math.MaxUint64); err != nil || !bytes.Equal(got, b.m.frames[i-1]) {
		t.Fatalf("read of the frame before: %v", err)
	}
	// A read by key of a record in the bad frame meets it through the key
	// index, scans the segment and reports the corruption; one of a key
	// elsewhere does not.
	key := fmt.Appendf(nil, "k%d", b.m.heads[i].BaseOffset)
	_, _, err = s.ReadKey(key, s.StartOffset(), math.MaxUint64, 10, 1<<20)
	if ce, ok := errorsAs[*CorruptionError](err); !ok || ce.Segment != file || ce.Position != pos {
		t.Fatalf("ReadKey(%s) err = %v, want corruption at %s:%d", key, err, file, pos)
	}
	key = fmt.Appendf(nil, "k%d", b.m.heads[i-1].BaseOffset)
	if recs, _, err := s.ReadKey(key, s.StartOffset(), math.MaxUint64, 10, 1<<20); err != nil || len(recs) != 1 {
		t.Fatalf("ReadKey(%s): %d records, %v", key, len(recs), err)
	}
}

func TestIndexFilesRebuilt(t *testing.T) { forEachFS(t, testIndexFilesRebuilt) }

func testIndexFilesRebuilt(t *testing.T, e env) {
	b := buildLog(t, e, 3, 2)
	first := b.files[0]
	idx := segmentName(mustBase(t, first), indexSuffix)
	tidx := segmentName(mustBase(t, first), timeIndexSuffix)
	if len(b.img[idx]) < 3*offsetEntryBytes {
		t.Fatalf("index of %d bytes is too small for the test", len(b.img[idx]))
	}
	le := binary.LittleEndian
	for name, mutate := range map[string]func(img map[string][]byte){
		"offset index missing":      func(img map[string][]byte) { delete(img, idx) },
		"time index missing":        func(img map[string][]byte) { delete(img, tidx) },
		"offset index torn":         func(img map[string][]byte) { img[idx] = img[idx][:len(img[idx])-3] },
		"time index torn":           func(img map[string][]byte) { img[tidx] = img[tidx][:len(img[tidx])-1] },
		"offset index empty":        func(img map[string][]byte) { img[idx] = nil },
		"offset index not monotone": func(img map[string][]byte) { le.PutUint32(img[idx][8:], 0) },
		"offset index past the log": func(img map[string][]byte) {
			le.PutUint32(img[idx][len(img[idx])-4:], uint32(len(img[first])+10))
		},
		"time index not monotone": func(img map[string][]byte) { le.PutUint64(img[tidx][12:], 0) },
		"offset index extra entry": func(img map[string][]byte) {
			img[idx] = le.AppendUint32(le.AppendUint32(img[idx], 1<<30), 1<<30)
		},
		"offset index stale but valid": func(img map[string][]byte) { img[idx] = img[idx][:offsetEntryBytes] },
		"garbage":                      func(img map[string][]byte) { img[idx] = bytes.Repeat([]byte{0xff}, 7) },
	} {
		t.Run(name, func(t *testing.T) {
			img := cloneImage(b.img)
			mutate(img)
			writeDirImage(t, b.cfg, img)
			cfg := b.cfg
			cfg.Logger = testLogger(t)
			s := mustOpen(t, cfg)
			defer s.Close()
			checkLog(t, s, &b.m)
			after := dirImage(t, b.cfg)
			if !bytes.Equal(after[idx], b.img[idx]) || !bytes.Equal(after[tidx], b.img[tidx]) {
				t.Fatal("index files were not rebuilt to match the log")
			}
		})
	}
}

func TestIndexDecoders(t *testing.T) {
	entries := []indexEntry{{relOffset: 3, position: 400, appendTimeUnixNanos: 5}, {relOffset: 9, position: 900, appendTimeUnixNanos: 5}}
	off, err := decodeOffsetIndex(appendOffsetIndex(nil, entries), 1000, 10)
	if err != nil || len(off) != 2 || off[1] != (offsetEntry{9, 900}) {
		t.Fatalf("decodeOffsetIndex = %v, %v", off, err)
	}
	tm, err := decodeTimeIndex(appendTimeIndex(nil, entries), 10)
	if err != nil || len(tm) != 2 || tm[1] != (timeEntry{5, 9}) {
		t.Fatalf("decodeTimeIndex = %v, %v", tm, err)
	}
	for name, err := range map[string]error{
		"offset past log":     second(decodeOffsetIndex(appendOffsetIndex(nil, entries), 900, 10)),
		"offset past records": second(decodeOffsetIndex(appendOffsetIndex(nil, entries), 1000, 9)),
		"time past records":   second(decodeTimeIndex(appendTimeIndex(nil, entries), 9)),
		"offset zero entry":   second(decodeOffsetIndex(appendOffsetIndex(nil, []indexEntry{{}}), 1000, 10)),
		"time zero entry":     second(decodeTimeIndex(appendTimeIndex(nil, []indexEntry{{}}), 10)),
		"offset torn":         second(decodeOffsetIndex(make([]byte, 9), 1000, 10)),
		"time torn":           second(decodeTimeIndex(make([]byte, 13), 10)),
		"time decreasing": second(decodeTimeIndex(appendTimeIndex(nil, []indexEntry{
			{relOffset: 1, appendTimeUnixNanos: 5}, {relOffset: 2, appendTimeUnixNanos: 4}}), 10)),
	} {
		if !errors.Is(err, errIndexInvalid) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// FuzzOffsetIndex checks that the offset index decoder never panics and
// accepts only what it can re-encode byte for byte, with the invariants
// recovery relies on.
func FuzzOffsetIndex(f *testing.F) {
	f.Add(appendOffsetIndex(nil, []indexEntry{{relOffset: 3, position: 400}, {relOffset: 9, position: 900}}), int64(1000), uint64(10))
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0}, int64(10), uint64(10))
	f.Add([]byte{}, int64(0), uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, logBytes int64, records uint64) {
		entries, err := decodeOffsetIndex(b, logBytes, records)
		if err != nil {
			if !errors.Is(err, errIndexInvalid) {
				t.Fatalf("error %v is not errIndexInvalid", err)
			}
			return
		}
		var prev offsetEntry
		re := make([]indexEntry, len(entries))
		for i, e := range entries {
			if e.relOffset <= prev.relOffset || e.position <= prev.position ||
				int64(e.position) >= logBytes || uint64(e.relOffset) >= records {
				t.Fatalf("accepted entry %d %+v after %+v (log %d bytes, %d records)", i, e, prev, logBytes, records)
			}
			prev = e
			re[i] = indexEntry{relOffset: e.relOffset, position: e.position}
		}
		if again := appendOffsetIndex(nil, re); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding changed the index: %x -> %x", b, again)
		}
	})
}

// FuzzTimeIndex is FuzzOffsetIndex for the time index decoder.
func FuzzTimeIndex(f *testing.F) {
	f.Add(appendTimeIndex(nil, []indexEntry{{relOffset: 3, appendTimeUnixNanos: -5}, {relOffset: 9, appendTimeUnixNanos: 7}}), uint64(10))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, uint64(2))
	f.Add([]byte{}, uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, records uint64) {
		entries, err := decodeTimeIndex(b, records)
		if err != nil {
			if !errors.Is(err, errIndexInvalid) {
				t.Fatalf("error %v is not errIndexInvalid", err)
			}
			return
		}
		re := make([]indexEntry, len(entries))
		for i, e := range entries {
			if e.relOffset == 0 || uint64(e.relOffset) >= records ||
				(i > 0 && (e.relOffset <= entries[i-1].relOffset || e.appendTimeUnixNanos < entries[i-1].appendTimeUnixNanos)) {
				t.Fatalf("accepted entry %d %+v (%d records)", i, e, records)
			}
			re[i] = indexEntry{relOffset: e.relOffset, appendTimeUnixNanos: e.appendTimeUnixNanos}
		}
		if again := appendTimeIndex(nil, re); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding changed the index: %x -> %x", b, again)
		}
	})
}
