package compact

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
)

// testLog is one copy of a range: a segment store on an in-memory disk,
// appended to as a single-node range is (no Raft indexes) or, with raft
// set, as a Raft log (every frame the next index, noops among them).
type testLog struct {
	t    testing.TB
	mem  *vfs.Mem
	cfg  segment.Config
	s    *segment.Store
	raft bool
	tm   int64 // append time of the last frame
}

func newTestLog(t testing.TB, seed uint64, segmentBytes int64, raft bool) *testLog {
	m := vfs.NewMem(rand.New(rand.NewPCG(seed, 1)))
	cfg := segment.Config{Dir: "/r", FS: m, SegmentBytesMax: segmentBytes, IndexIntervalBytes: 300,
		Logger: hclog.NewNullLogger()}
	s, err := segment.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := &testLog{t: t, mem: m, cfg: cfg, s: s, raft: raft}
	t.Cleanup(func() { l.s.Close() })
	return l
}

// add appends frame (built at the log's tail by the caller), stamping the
// next Raft index when the log is a Raft log.
func (l *testLog) add(frame []byte) batch.Header {
	l.t.Helper()
	h, err := batch.DecodeHeader(frame)
	if err != nil {
		l.t.Fatal(err)
	}
	if l.raft {
		batch.PatchRaft(frame, 1, l.s.LastIndex()+1)
		h.Term, h.Index = 1, l.s.LastIndex()+1
	}
	if err := l.s.Append(frame); err != nil {
		l.t.Fatalf("append at %d: %v", h.BaseOffset, err)
	}
	return h
}

// put appends one batch of recs at the tail.
func (l *testLog) put(producer, seq uint64, tm int64, recs []batch.Record) batch.Header {
	l.tm = max(l.tm, tm)
	h := batch.Header{BaseOffset: l.s.NextOffset(), Epoch: 1, AppendTimeUnixNanos: l.tm, ProducerID: producer, BaseSequence: seq}
	return l.add(batch.Encode(nil, h, recs))
}

// mark appends a compaction marker.
func (l *testLog) mark(c batch.Compaction) batch.Header {
	h := batch.Header{BaseOffset: l.s.NextOffset(), Epoch: 1, AppendTimeUnixNanos: l.tm}
	return l.add(batch.EncodeCompaction(nil, h, c))
}

// noop appends a Raft leader's empty entry (Raft logs only).
func (l *testLog) noop() {
	h := batch.Header{Type: batch.TypeNoop, BaseOffset: l.s.NextOffset(), Epoch: 1, AppendTimeUnixNanos: l.tm}
	l.add(batch.EncodeControl(nil, h, nil))
}

// compact seals what lies below d's point and runs a cleaner job at d.
func (l *testLog) compact(d batch.Compaction, limit uint64) Result {
	l.t.Helper()
	if err := l.s.SealBefore(d.Point); err != nil {
		l.t.Fatal(err)
	}
	c := NewCleaner(CleanerConfig{BytesPerSecond: -1})
	res := c.RunJob(context.Background(), Job{Name: "test", Log: l.s, Decision: d, Limit: limit})
	if res.Err != nil {
		l.t.Fatalf("compact at %+v: %v", d, res.Err)
	}
	return res
}

// reopen closes and opens the store again (recovery verifies the log).
func (l *testLog) reopen() {
	l.t.Helper()
	if err := l.s.Close(); err != nil {
		l.t.Fatal(err)
	}
	s, err := segment.Open(l.cfg)
	if err != nil {
		l.t.Fatalf("reopen: %v", err)
	}
	l.s = s
}

// rec is a record as a reader sees it, with its frame's fields.
type rec struct {
	off        uint64
	key, value string
	keyless    bool
	tomb       bool
	appendTime int64
	epoch      uint64
	producer   uint64
}

func (r rec) String() string {
	k := r.key
	if r.keyless {
		k = "-"
	}
	v := r.value
	if r.tomb {
		v = "~"
	}
	return fmt.Sprintf("%d:%s=%s", r.off, k, v)
}

// records reads the whole log by offset: its records (markers left out),
// and the offsets of the markers it holds.
func records(t testing.TB, s *segment.Store) (out []rec, markers []uint64) {
	t.Helper()
	for from := s.StartOffset(); from < s.NextOffset(); {
		b, err := s.ReadFrames(from, 1<<16, s.NextOffset())
		if err != nil || len(b) == 0 {
			t.Fatalf("ReadFrames(%d): %d bytes, %v", from, len(b), err)
		}
		for len(b) > 0 {
			n, _ := batch.FrameSize(b)
			h, recs, err := batch.Decode(b[:n])
			if err != nil {
				t.Fatal(err)
			}
			b = b[n:]
			from = h.NextOffset()
			if h.Type == batch.TypeCompact {
				markers = append(markers, h.BaseOffset)
				continue
			}
			for i := range recs {
				r := &recs[i]
				out = append(out, rec{off: h.Offset(r), key: string(r.Key), keyless: r.Key == nil, value: string(r.Value),
					tomb: r.Tombstone, appendTime: h.AppendTimeUnixNanos, epoch: h.Epoch, producer: h.ProducerID})
			}
		}
	}
	return out, markers
}

func recordsString(rs []rec) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(r.String())
	}
	return b.String()
}

// parseRecords reads "k=v k=~ -=v" (a tombstone, a record without key).
func parseRecords(t testing.TB, line string) []batch.Record {
	var out []batch.Record
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("record %q is not key=value", f)
		}
		r := batch.Record{Key: []byte(k), Value: []byte(v)}
		if k == "-" {
			r.Key = nil
		}
		if v == "~" {
			r.Value, r.Tombstone = nil, true
		}
		if len(r.Value) == 0 {
			r.Value = nil
		}
		out = append(out, r)
	}
	return out
}

func equalRecs(a, b []rec) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
