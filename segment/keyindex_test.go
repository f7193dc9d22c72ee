package segment

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// keyTruth returns, per key, the offsets of its records in [StartOffset,
// NextOffset) of s, read with ReadFrames: what ReadKey must agree with.
func keyTruth(t testing.TB, s *Store) map[string][]uint64 {
	t.Helper()
	truth, err := readKeyTruth(s)
	if err != nil {
		t.Fatal(err)
	}
	return truth
}

func readKeyTruth(s *Store) (map[string][]uint64, error) {
	truth := map[string][]uint64{}
	for off := s.StartOffset(); off < s.NextOffset(); {
		got, err := s.ReadFrames(off, 1<<20, math.MaxUint64)
		if err != nil {
			return nil, fmt.Errorf("ReadFrames(%d): %w", off, err)
		}
		for len(got) > 0 {
			h, recs, err := batch.Decode(got)
			if err != nil {
				return nil, err
			}
			for i := range recs {
				if h.Type == batch.TypeData {
					truth[string(recs[i].Key)] = append(truth[string(recs[i].Key)], h.Offset(&recs[i]))
				}
			}
			size, _ := batch.FrameSize(got)
			got, off = got[size:], h.NextOffset()
		}
	}
	return truth, nil
}

// checkKeyReads checks ReadKey of s against keyTruth for up to keysMax
// keys (and a key that is not there): the whole log at once, and paged
// by next from the start with two records at a time.
func checkKeyReads(t testing.TB, s *Store, keysMax int) {
	t.Helper()
	if err := verifyKeyReads(s, keysMax, true); err != nil {
		t.Fatal(err)
	}
}

// verifyKeyReads is checkKeyReads, without the paged reads unless paged.
func verifyKeyReads(s *Store, keysMax int, paged bool) error {
	truth, err := readKeyTruth(s)
	if err != nil {
		return err
	}
	keys := []string{"no such key"}
	for k := range truth {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) > keysMax {
		keys = keys[:keysMax]
	}
	start, next := s.StartOffset(), s.NextOffset()
	for _, k := range keys {
		recs, n, err := s.ReadKey([]byte(k), start, math.MaxUint64, KeyRecordsMax, math.MaxInt)
		if err != nil {
			return fmt.Errorf("ReadKey(%q): %w", k, err)
		}
		if got, err := recordOffsets(k, recs); err != nil || !slices.Equal(got, truth[k]) || n != next {
			return fmt.Errorf("ReadKey(%q) = %v next %d (%v), want %v next %d", k, got, n, err, truth[k], next)
		}
		if !paged {
			continue
		}
		var pages []uint64
		for from := start; ; {
			recs, n, err := s.ReadKey([]byte(k), from, math.MaxUint64, 2, math.MaxInt)
			if err != nil {
				return fmt.Errorf("ReadKey(%q, %d): %w", k, from, err)
			}
			got, err := recordOffsets(k, recs)
			if err != nil {
				return err
			}
			pages = append(pages, got...)
			if n <= from && from != next {
				return fmt.Errorf("ReadKey(%q, %d) did not progress: next %d", k, from, n)
			}
			if n == next {
				break
			}
			from = n
		}
		if !slices.Equal(pages, truth[k]) {
			return fmt.Errorf("ReadKey(%q) paged = %v, want %v", k, pages, truth[k])
		}
	}
	return nil
}

// recordOffsets returns the offsets of recs, checking that each has key k.
func recordOffsets(k string, recs []KeyRecord) ([]uint64, error) {
	var out []uint64
	for _, r := range recs {
		if string(r.Record.Key) != k {
			return nil, fmt.Errorf("ReadKey(%q) returned a record of key %q at %d", k, r.Record.Key, r.Offset)
		}
		out = append(out, r.Offset)
	}
	return out, nil
}

// keyOffsets returns the offsets of recs, checking that each has key k.
func keyOffsets(t testing.TB, k string, recs []KeyRecord) []uint64 {
	t.Helper()
	out, err := recordOffsets(k, recs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkKeyIndexFiles checks that every sealed segment in cfg's directory
// has the key index file a KeyIndexBuilder makes of its log, and that the
// active segment (the last) has none.
func checkKeyIndexFiles(t testing.TB, cfg Config) {
	t.Helper()
	if err := verifyKeyIndexFiles(cfg); err != nil {
		t.Fatal(err)
	}
}

func verifyKeyIndexFiles(cfg Config) error {
	img := map[string][]byte{}
	ents, err := cfg.FS.ReadDir(cfg.Dir)
	if err != nil {
		return err
	}
	var logs []string
	for _, e := range ents {
		if img[e.Name()], err = vfs.ReadFile(cfg.FS, filepath.Join(cfg.Dir, e.Name()), 1<<30); err != nil {
			return err
		}
		if filepath.Ext(e.Name()) == logSuffix {
			logs = append(logs, e.Name())
		}
	}
	slices.Sort(logs)
	for i, name := range logs {
		base, _, _ := parseSegmentName(name)
		kname := segmentName(base, keyIndexSuffix)
		if i == len(logs)-1 {
			if _, ok := img[kname]; ok {
				return fmt.Errorf("the active segment %s has a key index file", name)
			}
			continue
		}
		b := NewKeyIndexBuilder(base)
		log := img[name]
		for pos := 0; pos < len(log); {
			size, err := unitSize(log[pos:])
			if err != nil {
				return err
			}
			frame, _, err := openUnit(cfg.Keyring, bytes.Clone(log[pos:pos+size]))
			if err != nil {
				return err
			}
			if err := b.AddFrame(frame, int64(pos)); err != nil {
				return err
			}
			pos += size
		}
		if want := b.File(int64(len(log))); !bytes.Equal(img[kname], want) {
			return fmt.Errorf("key index of %s: %d bytes, want the %d bytes built from its log", name, len(img[kname]), len(want))
		}
	}
	return nil
}

// randomKeyEntries returns n entries of a segment in log order, with keys
// from a pool of distinct hashes and frames of 1 to 4 records.
func randomKeyEntries(rng *rand.Rand, n, hashes int) []keyEntry {
	pool := make([]uint32, hashes)
	for i := range pool {
		pool[i] = rng.Uint32()
	}
	var ents []keyEntry
	pos := uint32(0)
	for rel := 0; rel < n; {
		for range min(n-rel, 1+rng.IntN(4)) {
			ents = append(ents, keyEntry{hash: pool[rng.IntN(hashes)], rel: uint32(rel), pos: pos})
			rel++
		}
		pos += 100 + uint32(rng.IntN(50))
	}
	return ents
}

func TestKeyIndexFileRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 255, 256, 257, 1000, 5000} {
		ents := randomKeyEntries(rng, n, 1+n/7)
		var fp keyFingerprint
		for _, e := range ents {
			fp.add(e)
		}
		sorted := sortKeyEntries(slices.Clone(ents))
		want := slices.Clone(ents)
		slices.SortStableFunc(want, func(a, b keyEntry) int { return cmp.Compare(a.hash, b.hash) })
		if !slices.Equal(sorted, want) {
			t.Fatalf("%d entries: radix sort differs from a stable sort by hash", n)
		}
		logBytes := int64(1 << 20)
		img := appendKeyIndexFile(nil, 77, logBytes, sorted)
		if uint64(len(img)) != keyIndexFileBytes(uint64(n)) {
			t.Fatalf("%d entries: file of %d bytes, want %d", n, len(img), keyIndexFileBytes(uint64(n)))
		}
		var got []keyEntry
		fence, gotFP, err := decodeKeyIndexFile(img, keyIndexWant{base: 77, logBytes: logBytes, span: uint64(n)}, func(e keyEntry) { got = append(got, e) })
		if err != nil {
			t.Fatalf("%d entries: %v", n, err)
		}
		if !slices.Equal(got, sorted) || gotFP != fp || !slices.Equal(fence, fenceOf(sorted)) {
			t.Fatalf("%d entries: decode does not give back what was encoded", n)
		}
		// A flipped bit anywhere (every byte of a small file, 300 random
		// ones of a large one), and every wrong expectation, is refused.
		for k := range min(len(img), 300) {
			i := k
			if len(img) > 300 {
				i = rng.IntN(len(img))
			}
			bad := slices.Clone(img)
			bad[i] ^= 1 << (i % 8)
			if _, _, err := decodeKeyIndexFile(bad, keyIndexWant{base: 77, logBytes: logBytes, span: uint64(n)}, nil); !errors.Is(err, errKeyIndexInvalid) {
				t.Fatalf("%d entries: flipped bit in byte %d accepted: %v", n, i, err)
			}
		}
		for name, w := range map[string]keyIndexWant{
			"other base": {base: 78, logBytes: logBytes, span: uint64(n)},
			"other log":  {base: 77, logBytes: logBytes - 1, span: uint64(n)},
		} {
			if _, _, err := decodeKeyIndexFile(img, w, nil); !errors.Is(err, errKeyIndexInvalid) {
				t.Fatalf("%d entries, %s: %v", n, name, err)
			}
		}
		if n > 0 {
			if _, _, err := decodeKeyIndexFile(img, keyIndexWant{base: 77, logBytes: logBytes, span: uint64(n - 1)}, nil); !errors.Is(err, errKeyIndexInvalid) {
				t.Fatalf("%d entries, span too short: %v", n, err)
			}
			if _, _, err := decodeKeyIndexFile(img[:len(img)-1], keyIndexWant{base: 77, logBytes: logBytes, span: uint64(n)}, nil); !errors.Is(err, errKeyIndexInvalid) {
				t.Fatalf("%d entries, torn: %v", n, err)
			}
		}
	}
}

// FuzzKeyIndex checks that the key index decoder never panics and accepts
// only what the encoder writes: a file it accepts re-encodes byte for
// byte from the entries it gave, which keep the invariants lookups rely
// on.
func FuzzKeyIndex(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 3, 300} {
		ents := sortKeyEntries(randomKeyEntries(rng, n, 5))
		f.Add(appendKeyIndexFile(nil, 9, 1<<16, ents), uint64(9), int64(1<<16), uint64(n))
	}
	f.Add([]byte("GLKI"), uint64(0), int64(0), uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, base uint64, logBytes int64, span uint64) {
		checkKeyIndexDecode(t, b, base, logBytes, span)
		// The CRCs stop almost every mutation at the door; also try the
		// input with its CRCs made right, so that the fuzzer reaches the
		// entry checks.
		if len(b) >= keyIndexHeaderBytes {
			fixed := bytes.Clone(b)
			binary.LittleEndian.PutUint32(fixed[28:], crc32.Checksum(fixed[:28], castagnoli))
			if count := uint64(binary.LittleEndian.Uint32(fixed[20:])); uint64(len(fixed)) == keyIndexFileBytes(count) {
				forKeyEntries(fixed, func([]byte) {})
			}
			checkKeyIndexDecode(t, fixed, base, logBytes, span)
		}
	})
}

// checkKeyIndexDecode decodes b and checks what the decoder accepts (see
// FuzzKeyIndex).
func checkKeyIndexDecode(t *testing.T, b []byte, base uint64, logBytes int64, span uint64) {
	want := keyIndexWant{base: base, logBytes: logBytes, span: span}
	var ents []keyEntry
	fence, fp, err := decodeKeyIndexFile(b, want, func(e keyEntry) { ents = append(ents, e) })
	if err != nil {
		if !errors.Is(err, errKeyIndexInvalid) {
			t.Fatalf("error %v is not errKeyIndexInvalid", err)
		}
		return
	}
	var again keyFingerprint
	for i, e := range ents {
		if uint64(e.rel) >= span || int64(e.pos) >= logBytes || (i > 0 && e.sortKey() <= ents[i-1].sortKey()) {
			t.Fatalf("accepted entry %d %+v (span %d, log %d bytes)", i, e, span, logBytes)
		}
		again.add(e)
	}
	if again != fp || !slices.Equal(fence, fenceOf(ents)) {
		t.Fatal("fingerprint or fence differ from the entries given")
	}
	if img := appendKeyIndexFile(nil, base, logBytes, ents); !bytes.Equal(img, b) {
		t.Fatalf("re-encoding changed the file: %x -> %x", b, img)
	}
}

func TestActiveKeysCandidates(t *testing.T) {
	a := newActiveKeys()
	// Hash 1 at offsets 0, 2, 4, ..., 38; hash 2 at the odd ones.
	for rel := range uint32(40) {
		a.add(keyEntry{hash: 1 + rel%2, rel: rel, pos: rel * 10})
	}
	rels := func(es []keyEntry) []uint32 {
		var out []uint32
		for _, e := range es {
			out = append(out, e.rel)
		}
		return out
	}
	for _, c := range []struct {
		from, end uint32
		limit     int
		want      []uint32
	}{
		{0, 40, 3, []uint32{0, 2, 4}},
		{5, 40, 2, []uint32{6, 8}},
		{5, 11, 10, []uint32{6, 8, 10}},
		{39, 40, 5, nil},
		{0, 40, 100, []uint32{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38}},
	} {
		if got := rels(a.candidates(1, c.from, c.end, c.limit)); !slices.Equal(got, c.want) {
			t.Errorf("candidates(1, %d, %d, %d) = %v, want %v", c.from, c.end, c.limit, got, c.want)
		}
	}
	if got := a.candidates(3, 0, 40, 5); len(got) != 0 {
		t.Fatalf("a missing hash has candidates %v", got)
	}
	a.truncate(205) // drops offsets 21 and up
	if got := rels(a.candidates(2, 0, 40, 100)); !slices.Equal(got, []uint32{1, 3, 5, 7, 9, 11, 13, 15, 17, 19}) {
		t.Fatalf("after truncate: %v", got)
	}
	a.truncate(0)
	if len(a.heads) != 0 || len(a.ents) != 0 {
		t.Fatalf("truncate(0) left %d heads, %d entries", len(a.heads), len(a.ents))
	}
}

// keyModelRecord is one record of the key model.
type keyModelRecord struct {
	off   uint64
	key   string
	value []byte
}

// keyModel is what TestReadKeyModel expects the log to hold.
type keyModel struct {
	recs   []keyModelRecord
	starts []uint64 // first offset of every data frame
}

// expect returns what ReadKey(key, from, end, maxRecords, maxBytes) must
// return of a log whose NextOffset is next.
func (m *keyModel) expect(key string, from, end, next uint64, maxRecords, maxBytes int) ([]keyModelRecord, uint64) {
	maxRecords = max(1, min(maxRecords, KeyRecordsMax))
	var out []keyModelRecord
	size := 0
	for _, r := range m.recs {
		if r.off < from || r.off >= min(end, next) || r.key != key {
			continue
		}
		n := len(r.key) + len(r.value)
		if len(out) > 0 && size+n > maxBytes {
			return out, r.off
		}
		size += n
		if out = append(out, r); len(out) == maxRecords {
			return out, r.off + 1
		}
	}
	return out, max(from, min(end, next))
}

// dropFrom drops the records from offset off on; dropBelow those below it.
func (m *keyModel) dropFrom(off uint64) {
	m.recs = slices.DeleteFunc(m.recs, func(r keyModelRecord) bool { return r.off >= off })
	m.starts = slices.DeleteFunc(m.starts, func(o uint64) bool { return o >= off })
}

func (m *keyModel) dropBelow(off uint64) {
	m.recs = slices.DeleteFunc(m.recs, func(r keyModelRecord) bool { return r.off < off })
	m.starts = slices.DeleteFunc(m.starts, func(o uint64) bool { return o < off })
}

// modelKeys are the keys of TestReadKeyModel: a few hot ones, the empty
// key, and a long one.
var modelKeys = []string{"room-1", "room-1", "room-1", "room-2", "room-2", "room-3", "", "a", "b", "c", "d",
	string(bytes.Repeat([]byte{'x'}, 300))}

// TestReadKeyModel holds ReadKey to a model: random appends of records
// with keys from a small pool (and control frames), reads with random
// bounds, truncations, prefix deletions and reopens, on small segments
// that roll by bytes or records. A failure names its seed.
func TestReadKeyModel(t *testing.T) {
	seeds := 12
	if testing.Short() || raceEnabled {
		seeds = 4
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			e := memEnv(seed)
			if seed%3 == 0 {
				e = osEnv(t)
			}
			runKeyModel(t, seed, e)
		})
	}
}

func runKeyModel(t *testing.T, seed uint64, e env) {
	rng := rand.New(rand.NewPCG(seed, 0x4b1))
	cfg := Config{Dir: e.dir, FS: e.fs, Logger: testLogger(t),
		SegmentBytesMax:    []int64{SegmentBytesMaxMin, 4 << 10, 64 << 10}[rng.IntN(3)],
		SegmentRecordsMax:  []int64{7, 50, 0}[rng.IntN(3)],
		IndexIntervalBytes: []int{1, 300, 4096}[rng.IntN(3)]}
	if sealAll || seed%2 == 1 {
		// Half the seeds read by key through sealed units.
		cfg.Keyring = testKeyring()
	}
	s := mustOpen(t, cfg)
	defer func() { s.Close() }()
	var m keyModel
	tm := int64(0)
	reads := 0
	for op := range 1500 {
		switch r := rng.IntN(100); {
		case r < 60:
			next := s.NextOffset()
			recs := make([]batch.Record, 1+rng.IntN(6))
			for i := range recs {
				k := modelKeys[rng.IntN(len(modelKeys))]
				recs[i] = batch.Record{Key: []byte(k), Value: fmt.Appendf(nil, "v%d-%d", next+uint64(i), rng.IntN(1000))}
				m.recs = append(m.recs, keyModelRecord{off: next + uint64(i), key: k, value: recs[i].Value})
			}
			m.starts = append(m.starts, next)
			if err := s.Append(batch.Encode(nil, batch.Header{BaseOffset: next, Epoch: 1, AppendTimeUnixNanos: tm}, recs)); err != nil {
				t.Fatalf("op %d: Append: %v", op, err)
			}
		case r < 64:
			if err := s.Append(controlFrame(batch.TypeNoop, s.NextOffset(), tm, 0, 0, []byte("noop"))); err != nil {
				t.Fatalf("op %d: Append control: %v", op, err)
			}
		case r < 90:
			checkModelRead(t, s, &m, rng, op)
			reads++
		case r < 93 && len(m.starts) > 0:
			cut := m.starts[rng.IntN(len(m.starts))]
			if err := s.TruncateSuffix(cut); err != nil {
				t.Fatalf("op %d: TruncateSuffix(%d): %v", op, cut, err)
			}
			m.dropFrom(cut)
		case r < 96:
			start, next := s.StartOffset(), s.NextOffset()
			if err := s.DeletePrefix(start + rng.Uint64N(next-start+1)); err != nil {
				t.Fatalf("op %d: DeletePrefix: %v", op, err)
			}
			m.dropBelow(s.StartOffset())
		default:
			if err := s.Close(); err != nil {
				t.Fatalf("op %d: Close: %v", op, err)
			}
			s = mustOpen(t, cfg)
			checkKeyIndexFiles(t, cfg)
		}
		tm += rng.Int64N(3)
	}
	checkKeyReads(t, s, 20)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	checkKeyIndexFiles(t, cfg)
	checkKeyReads(t, s, 20)
	t.Logf("%d reads; log [%d, %d) in %d segments", reads, s.StartOffset(), s.NextOffset(), len(logFiles(t, cfg)))
}

// checkModelRead makes one ReadKey with random bounds and checks it
// against the model.
func checkModelRead(t *testing.T, s *Store, m *keyModel, rng *rand.Rand, op int) {
	t.Helper()
	start, next := s.StartOffset(), s.NextOffset()
	key := "missing"
	if rng.IntN(8) > 0 {
		key = modelKeys[rng.IntN(len(modelKeys))]
	}
	from := start + rng.Uint64N(next-start+1)
	end := uint64(math.MaxUint64)
	if rng.IntN(2) == 0 {
		end = from + rng.Uint64N(next-from+1)
	}
	maxRecords := []int{1, 2, 5, 1000}[rng.IntN(4)]
	maxBytes := []int{1, 20, 100, math.MaxInt}[rng.IntN(4)]
	got, gotNext, err := s.ReadKey([]byte(key), from, end, maxRecords, maxBytes)
	if err != nil {
		t.Fatalf("op %d: ReadKey(%q, %d, %d): %v", op, key, from, end, err)
	}
	want, wantNext := m.expect(key, from, end, next, maxRecords, maxBytes)
	ok := len(got) == len(want) && gotNext == wantNext
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].Offset == want[i].off && string(got[i].Record.Key) == want[i].key && bytes.Equal(got[i].Record.Value, want[i].value) &&
			got[i].Batch.BaseOffset <= got[i].Offset && got[i].Offset < got[i].Batch.NextOffset()
	}
	if !ok {
		t.Fatalf("op %d: ReadKey(%q, from %d, end %d, %d records, %d bytes) on [%d, %d) = %d records next %d, want %d next %d",
			op, key, from, end, maxRecords, maxBytes, start, next, len(got), gotNext, len(want), wantNext)
	}
	if _, _, err := s.ReadKey([]byte(key), next+1, math.MaxUint64, 1, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("op %d: ReadKey past the end: %v", op, err)
	}
}

// buildKeyedLog appends n frames of 1 to 4 records with keys "k<off%7>"
// to a store with small segments, closes it and returns its config and
// the directory's image.
func buildKeyedLog(t *testing.T, e env, frames int) (Config, map[string][]byte) {
	t.Helper()
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	for i := range frames {
		next := s.NextOffset()
		recs := make([]batch.Record, 1+i%4)
		for j := range recs {
			off := next + uint64(j)
			recs[j] = batch.Record{Key: fmt.Appendf(nil, "k%d", off%7), Value: recordValue(off, 20)}
		}
		if err := s.Append(batch.Encode(nil, batch.Header{BaseOffset: next, AppendTimeUnixNanos: int64(i)}, recs)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return cfg, dirImage(t, cfg)
}

func TestKeyIndexRebuilt(t *testing.T) { forEachFS(t, testKeyIndexRebuilt) }

// testKeyIndexRebuilt damages the key index file of a sealed segment in
// every way (missing, torn, a flipped bit, another segment's file, a
// stale file with valid CRCs, garbage) and checks that Open rebuilds it
// byte for byte and that key reads are right; and that a key index file
// beside the active segment, and one without a log, are removed.
func testKeyIndexRebuilt(t *testing.T, e env) {
	cfg, img := buildKeyedLog(t, e, 120)
	logs := logFiles(t, cfg)
	if len(logs) < 4 {
		t.Fatalf("%d segments: too few for the test", len(logs))
	}
	kname := func(i int) string { return segmentName(mustBase(t, logs[i]), keyIndexSuffix) }
	first, second := kname(0), kname(1)
	if len(img[first]) <= keyIndexHeaderBytes+keyEntryBytes {
		t.Fatalf("key index of %d bytes is too small for the test", len(img[first]))
	}
	for name, mutate := range map[string]func(img map[string][]byte){
		"missing":       func(img map[string][]byte) { delete(img, first) },
		"empty":         func(img map[string][]byte) { img[first] = nil },
		"torn":          func(img map[string][]byte) { img[first] = img[first][:len(img[first])-5] },
		"flipped bit":   func(img map[string][]byte) { img[first][keyIndexHeaderBytes+3] ^= 0x10 },
		"other segment": func(img map[string][]byte) { img[first] = slices.Clone(img[second]) },
		"garbage":       func(img map[string][]byte) { img[first] = bytes.Repeat([]byte{0xa5}, len(img[first])) },
		"stale but valid": func(img map[string][]byte) {
			// A well-formed file for the same segment whose entries point
			// the first key at the wrong record.
			var ents []keyEntry
			base := mustBase(t, logs[0])
			_, _, err := decodeKeyIndexFile(img[first], keyIndexWant{base: base, logBytes: int64(len(img[logs[0]])), span: math.MaxUint32},
				func(e keyEntry) { ents = append(ents, e) })
			if err != nil {
				t.Fatal(err)
			}
			ents[0].hash = 0xfffffff0
			slices.SortFunc(ents, func(a, b keyEntry) int { return cmp.Compare(a.sortKey(), b.sortKey()) })
			img[first] = appendKeyIndexFile(nil, base, int64(len(img[logs[0]])), ents)
		},
		"beside the active segment": func(img map[string][]byte) { img[kname(len(logs)-1)] = slices.Clone(img[second]) },
		"orphan":                    func(img map[string][]byte) { img[segmentName(1<<40, keyIndexSuffix)] = slices.Clone(img[second]) },
	} {
		t.Run(name, func(t *testing.T) {
			bad := cloneImage(img)
			mutate(bad)
			writeDirImage(t, cfg, bad)
			c := cfg
			c.Logger = testLogger(t)
			s := mustOpen(t, c)
			defer s.Close()
			if after := dirImage(t, cfg); !equalImages(after, img) {
				t.Fatal("Open did not restore the key index files")
			}
			checkKeyIndexFiles(t, cfg)
			checkKeyReads(t, s, 10)
		})
	}
}

func TestKeyIndexBrokenWhileOpen(t *testing.T) { forEachFS(t, testKeyIndexBrokenWhileOpen) }

// testKeyIndexBrokenWhileOpen damages key index files under an open store:
// reads that meet a block failing its CRC, or an entry the log does not
// bear out, scan the segment instead and stay right.
func testKeyIndexBrokenWhileOpen(t *testing.T, e env) {
	cfg, _ := buildKeyedLog(t, e, 120)
	s := mustOpen(t, cfg)
	defer s.Close()
	truth := keyTruth(t, s)
	logs := logFiles(t, cfg)
	for i, name := range logs[:len(logs)-1] {
		path := filepath.Join(cfg.Dir, segmentName(mustBase(t, name), keyIndexSuffix))
		b := readTestFile(t, cfg.FS, path)
		if i%2 == 0 {
			b[len(b)-1] ^= 1 // the last block's CRC
		} else {
			// Valid CRCs, wrong positions: every entry points at the
			// start of the log.
			forKeyEntries(b, func(e []byte) { binary.LittleEndian.PutUint32(e[8:], 0) })
		}
		writeTestFile(t, cfg.FS, path, b)
	}
	for k, offs := range truth {
		recs, _, err := s.ReadKey([]byte(k), s.StartOffset(), math.MaxUint64, KeyRecordsMax, math.MaxInt)
		if err != nil {
			t.Fatalf("ReadKey(%q): %v", k, err)
		}
		if got := keyOffsets(t, k, recs); !slices.Equal(got, offs) {
			t.Fatalf("ReadKey(%q) = %v, want %v", k, got, offs)
		}
	}
}

// forKeyEntries calls fn with every entry of a key index file image, then
// recomputes the block CRCs.
func forKeyEntries(b []byte, fn func(entry []byte)) {
	count := uint64(binary.LittleEndian.Uint32(b[20:]))
	k := &sealedKeys{count: count}
	for blk := 0; uint64(blk)*keyBlockEntries < count; blk++ {
		pos, n := k.block(blk)
		for j := range n {
			fn(b[int(pos)+j*keyEntryBytes:][:keyEntryBytes])
		}
		end := int(pos) + n*keyEntryBytes
		binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[pos:end], castagnoli))
	}
}

func TestSegmentRecordsMax(t *testing.T) { forEachFS(t, testSegmentRecordsMax) }

// testSegmentRecordsMax: segments roll by record count too, a frame larger
// than the bound gets a segment of its own, and staging rolls the same way.
func testSegmentRecordsMax(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	cfg.SegmentBytesMax = 1 << 20
	cfg.SegmentRecordsMax = 10
	s := mustOpen(t, cfg)
	defer s.Close()
	var m model
	for _, n := range []int{4, 4, 4, 12, 1, 9, 3} {
		f := makeFrame(s.NextOffset(), n, 0)
		if err := s.Append(f); err != nil {
			t.Fatal(err)
		}
		m.add(t, f)
	}
	var bases []uint64
	for _, name := range logFiles(t, cfg) {
		bases = append(bases, mustBase(t, name))
	}
	// [0,8) [8,12) [12,24) [24,34) [34,37)
	if want := []uint64{0, 8, 12, 24, 34}; !slices.Equal(bases, want) {
		t.Fatalf("segments at %v, want %v", bases, want)
	}
	checkLog(t, s, &m)
	if _, err := Open(Config{Dir: t.TempDir(), SegmentRecordsMax: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("negative SegmentRecordsMax: %v", err)
	}
}

func TestReadKeyLargeSegments(t *testing.T) { forEachFS(t, testReadKeyLargeSegments) }

// testReadKeyLargeSegments reads keys whose entries span many blocks of
// a segment's key index (a hot key) and keys with one record in a
// segment of thousands, sealed and active, before and after a reopen.
func testReadKeyLargeSegments(t *testing.T, e env) {
	cfg := Config{Dir: e.dir, FS: e.fs, Logger: testLogger(t), SegmentBytesMax: 128 << 10}
	s := mustOpen(t, cfg)
	defer func() { s.Close() }()
	rng := rand.New(rand.NewPCG(7, 7))
	for range 1500 {
		next := s.NextOffset()
		recs := make([]batch.Record, 8)
		for i := range recs {
			k := fmt.Appendf(nil, "conv-%d", rng.IntN(2000))
			if rng.IntN(3) == 0 {
				k = []byte("hot")
			}
			recs[i] = batch.Record{Key: k, Value: recordValue(next+uint64(i), 16)}
		}
		if err := s.Append(batch.Encode(nil, batch.Header{BaseOffset: next}, recs)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(logFiles(t, cfg)); n < 3 {
		t.Fatalf("%d segments: too few for the test", n)
	}
	check := func() {
		truth := keyTruth(t, s)
		if len(truth["hot"]) < 3*keyBlockEntries {
			t.Fatalf("the hot key has %d records: too few for the test", len(truth["hot"]))
		}
		checkKeyReads(t, s, 40)
		for _, k := range []string{"hot", "conv-1", "conv-1999"} {
			for _, from := range []uint64{0, 1, 2999, 3000, s.NextOffset() - 1} {
				got, next, err := s.ReadKey([]byte(k), from, math.MaxUint64, 300, math.MaxInt)
				if err != nil {
					t.Fatal(err)
				}
				i, _ := slices.BinarySearch(truth[k], from)
				want := truth[k][i:min(i+300, len(truth[k]))]
				if !slices.Equal(keyOffsets(t, k, got), want) {
					t.Fatalf("ReadKey(%q, %d, 300) = %d records, want %d", k, from, len(got), len(want))
				}
				if len(want) == 300 && next != want[299]+1 {
					t.Fatalf("ReadKey(%q, %d, 300): next %d, want %d", k, from, next, want[299]+1)
				}
			}
		}
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	checkKeyIndexFiles(t, cfg)
	check()
}

func TestRewriteKeyIndex(t *testing.T) { forEachFS(t, testRewriteKeyIndex) }

// testRewriteKeyIndex rewrites the sealed segments of a log with repeated
// keys as compaction does (compacted frames with holes, frames dropped, a
// compaction marker in the log) and checks that the swap leaves each
// rewritten segment with the key index file its new log makes, that key
// reads agree with a scan (also through a view of a segment taken before
// its rewrite), and that Open keeps the files as they are.
func testRewriteKeyIndex(t *testing.T, e env) {
	cfg, _ := buildKeyedLog(t, e, 80)
	s := mustOpen(t, cfg)
	point := s.NextOffset()
	marker := batch.EncodeCompaction(nil, batch.Header{BaseOffset: s.NextOffset(), Epoch: 1, AppendTimeUnixNanos: 1000},
		batch.Compaction{Point: s.NextOffset()})
	if err := s.Append(marker); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(makeFrame(s.NextOffset(), 3, 1001)); err != nil {
		t.Fatal(err)
	}
	if err := s.SealBefore(s.NextOffset()); err != nil {
		t.Fatal(err)
	}
	before := keyTruth(t, s)
	// A reader holding a view of the first segment from before its rewrite.
	held, _ := s.sealedView(s.Sealed()[0].BaseOffset)
	for _, g := range s.Sealed() {
		if _, err := s.RewriteSegment(g.BaseOffset, nil, keepEven(point)); err != nil {
			t.Fatalf("rewrite %d: %v", g.BaseOffset, err)
		}
	}
	after := keyTruth(t, s)
	for k, offs := range before {
		want := slices.DeleteFunc(slices.Clone(offs), func(o uint64) bool { return o < point && o%2 == 1 })
		if !slices.Equal(after[k], want) {
			t.Fatalf("key %q after the rewrite: %v, want %v", k, after[k], want)
		}
	}
	checkKeyIndexFiles(t, cfg)
	checkKeyReads(t, s, 20)
	// The old view reads the old segment through the old index.
	r := &keyRead{key: []byte("k0"), hash: keyHash([]byte("k0")), recordsMax: KeyRecordsMax, bytesMax: math.MaxInt}
	kv := keyView{v: held, sealed: held.seg.sealed.Load()}
	if kv.sealed == nil {
		t.Fatal("the old segment had no key index")
	}
	cands, err := s.probeSealed(kv, r.hash, held.seg.baseOffset, held.nextOffset, KeyRecordsMax)
	if err != nil || len(cands) == 0 {
		t.Fatalf("old index probe: %d entries, %v", len(cands), err)
	}
	if err := s.readCandidates(r, held, cands); err != nil {
		t.Fatalf("old index read: %v", err)
	}
	var old []uint64
	for _, o := range before["k0"] {
		if o < held.nextOffset {
			old = append(old, o)
		}
	}
	if got := keyOffsets(t, "k0", r.out); !slices.Equal(got, old) {
		t.Fatalf("old view read %v, want %v", got, old)
	}
	s.releaseView(held)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	img := dirImage(t, cfg)
	s = mustOpen(t, cfg)
	defer s.Close()
	if !equalImages(dirImage(t, cfg), img) {
		t.Fatal("Open changed the files of a rewritten log")
	}
	checkKeyReads(t, s, 20)
}

// TestReadKeyCoalescesFrameReads: the frames of one key that lie close
// together in a segment are read with one pread per window, not one per
// frame (frames of 6 KiB, larger than a first read, the key in each of
// them), in sealed and active segments, in the clear and sealed at rest;
// the records read are the key's, in order.
func TestReadKeyCoalescesFrameReads(t *testing.T) {
	for _, atRest := range []bool{false, true} {
		t.Run(fmt.Sprint("at rest ", atRest), func(t *testing.T) {
			var reads atomic.Int64
			cfg := Config{Dir: t.TempDir(), FS: countingFS{FS: vfs.OS(), reads: &reads}, Logger: testLogger(t),
				SegmentRecordsMax: 120}
			if atRest {
				cfg.Keyring = testKeyring()
			}
			s := mustOpen(t, cfg)
			defer s.Close()
			const frames, perFrame = 40, 6
			for i := range frames {
				next := s.NextOffset()
				recs := make([]batch.Record, perFrame)
				for j := range recs {
					key := fmt.Appendf(nil, "c%d", j)
					if j == 0 {
						key = []byte("hot")
					}
					recs[j] = batch.Record{Key: key, Value: recordValue(next+uint64(j), 1000)}
				}
				if err := s.Append(batch.Encode(nil, batch.Header{BaseOffset: next, Epoch: 1, AppendTimeUnixNanos: int64(i)}, recs)); err != nil {
					t.Fatal(err)
				}
			}
			if n := s.segmentCount(); n < 2 {
				t.Fatalf("%d segments, want a sealed one and the active one", n)
			}
			before := reads.Load()
			got, next, err := s.ReadKey([]byte("hot"), 0, math.MaxUint64, 1000, math.MaxInt)
			preads := reads.Load() - before
			if err != nil || len(got) != frames || next != s.NextOffset() {
				t.Fatalf("ReadKey: %d records, next %d, %v", len(got), next, err)
			}
			for i, r := range got {
				if off := uint64(i * perFrame); r.Offset != off || string(r.Record.Key) != "hot" || !bytes.Equal(r.Record.Value, recordValue(off, 1000)) {
					t.Fatalf("record %d: offset %d key %q", i, r.Offset, r.Record.Key)
				}
			}
			// One pread per frame would be 40 (and one block of the sealed
			// segment's key index); windows of 64 KiB hold about ten.
			if preads > frames/3 {
				t.Fatalf("%d preads for %d frames of the key", preads, frames)
			}
			t.Logf("%d preads for %d frames", preads, frames)
		})
	}
}
