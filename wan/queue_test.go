package wan

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms float64) time.Time { return epoch.Add(time.Duration(ms * float64(time.Millisecond))) }

func msSince(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%gms", float64(t.Sub(epoch))/float64(time.Millisecond))
}

// queueHarness drives a delayQueue as the driver would and checks that the
// bytes taken are exactly the bytes pushed, in order: push writes a running
// counter (mod 251) into the space, take checks it.
type queueHarness struct {
	q        delayQueue
	nextIn   int64 // counter of the next byte pushed
	nextOut  int64 // counter of the next byte taken
	inFlight int   // taken and not released
}

func (h *queueHarness) push(n int, due time.Time) (time.Time, error) {
	for n > 0 {
		space := h.q.space()
		k := min(n, len(space))
		for i := 0; i < k; i++ {
			space[i] = byte((h.nextIn + int64(i)) % 251)
		}
		due = h.q.push(k, due)
		h.nextIn += int64(k)
		n -= k
	}
	return due, nil
}

func (h *queueHarness) take(now time.Time) (int, time.Time, bool, error) {
	if h.inFlight > 0 {
		return 0, time.Time{}, false, errors.New("take before release")
	}
	bufs, next, end := h.q.take(now)
	n := 0
	for _, b := range bufs {
		for i, v := range b {
			if want := byte((h.nextOut + int64(n+i)) % 251); v != want {
				return 0, next, end, fmt.Errorf("byte %d = %d, want %d", h.nextOut+int64(n+i), v, want)
			}
		}
		n += len(b)
	}
	h.nextOut += int64(n)
	h.inFlight = n
	return n, next, end, nil
}

// release frees n of the bytes taken; the rest will be taken again.
func (h *queueHarness) release(n int) {
	h.q.release(n)
	h.nextOut -= int64(h.inFlight - n)
	h.inFlight = 0
}

// TestDelayQueueScript runs testdata/queue.txt: one harness per file.
func TestDelayQueueScript(t *testing.T) {
	var h *queueHarness
	datadriven.RunTest(t, "testdata/queue.txt", func(t *testing.T, d *datadriven.TestData) string {
		var ms float64
		if d.HasArg("at") {
			d.ScanArgs(t, "at", &ms)
		}
		switch d.Cmd {
		case "reset":
			if h != nil {
				h.q.free()
			}
			h = &queueHarness{}
			return "ok"
		case "push":
			var n int
			var delay float64
			d.ScanArgs(t, "n", &n)
			d.ScanArgs(t, "delay", &delay)
			due, err := h.push(n, at(ms+delay))
			if err != nil {
				return err.Error()
			}
			return fmt.Sprintf("due=%s queued=%d marks=%d", msSince(due), h.q.queuedBytes(), len(h.q.marks)-h.q.marksOff)
		case "finish":
			var err error
			if d.HasArg("error") {
				err = errors.New("reset by peer")
			}
			var delay float64
			d.ScanArgs(t, "delay", &delay)
			h.q.finish(err, at(ms+delay))
			return fmt.Sprintf("end due=%s", msSince(h.q.endDue))
		case "take":
			n, next, end, err := h.take(at(ms))
			if err != nil {
				return err.Error()
			}
			return fmt.Sprintf("bytes=%d next=%s end=%t", n, msSince(next), end)
		case "release":
			n := h.inFlight
			if d.HasArg("n") {
				d.ScanArgs(t, "n", &n)
			}
			h.release(n)
			return fmt.Sprintf("queued=%d marks=%d blocks=%d", h.q.queuedBytes(), len(h.q.marks)-h.q.marksOff, len(h.q.blocks))
		default:
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		}
	})
}

// TestDelayQueueModel drives the queue with random pushes, takes and
// releases against a model: bytes come out complete and in order, never
// before they are due, and at most mergeWindow after; the marks stay
// bounded by the delay span over mergeWindow.
func TestDelayQueueModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			h := &queueHarness{}
			defer h.q.free()
			type pending struct {
				end int64     // counter after the chunk
				due time.Time // as pushed (before clamping)
			}
			var model []pending
			now := epoch
			maxMarks := 0
			latency := time.Duration(rng.IntN(50)) * time.Millisecond
			jitter := time.Duration(rng.IntN(30)) * time.Millisecond
			for step := 0; step < 3000; step++ {
				now = now.Add(time.Duration(rng.IntN(400)) * time.Microsecond)
				switch rng.IntN(3) {
				case 0:
					n := 1 + rng.IntN(3*blockBytes/2)
					if rng.IntN(4) > 0 {
						n = 1 + rng.IntN(2000)
					}
					due, _ := h.push(n, now.Add(drawDelay(rng, latency, jitter)))
					model = append(model, pending{end: h.nextIn, due: due})
				default:
					n, next, _, err := h.take(now)
					if err != nil {
						t.Fatal(err)
					}
					// Every byte taken must be due; the first byte not
					// taken must not be due more than mergeWindow ago.
					for len(model) > 0 && model[0].end <= h.nextOut {
						if model[0].due.After(now) {
							t.Fatalf("step %d: bytes due at %s taken at %s", step, msSince(model[0].due), msSince(now))
						}
						model = model[1:]
					}
					if len(model) > 0 && now.Sub(model[0].due) > mergeWindow && h.q.queuedBytes()-int64(n) > 0 && n < takeBytesMax {
						t.Fatalf("step %d: bytes due at %s still held at %s (next %s)", step, msSince(model[0].due), msSince(now), msSince(next))
					}
					if !next.IsZero() && !next.After(now) {
						t.Fatalf("step %d: next %s is not after now %s", step, msSince(next), msSince(now))
					}
					// Partial writes happen: release a prefix, sometimes.
					k := n
					if n > 0 && rng.IntN(5) == 0 {
						k = rng.IntN(n + 1)
					}
					h.release(k)
				}
				maxMarks = max(maxMarks, len(h.q.marks)-h.q.marksOff)
				if h.q.queuedBytes() != h.nextIn-h.nextOut {
					t.Fatalf("step %d: queued %d, model %d", step, h.q.queuedBytes(), h.nextIn-h.nextOut)
				}
				if want := (h.q.queuedBytes()+int64(h.q.headOff)+blockBytes-1)/blockBytes + 1; int64(len(h.q.blocks)) > want {
					t.Fatalf("step %d: %d blocks for %d queued bytes", step, len(h.q.blocks), h.q.queuedBytes())
				}
			}
			// Drain: everything comes out once due.
			h.q.finish(nil, now)
			for i := 0; ; i++ {
				now = now.Add(time.Duration(latency + jitter + time.Second))
				n, _, end, err := h.take(now)
				if err != nil {
					t.Fatal(err)
				}
				h.release(n)
				if end {
					break
				}
				if i > 10000 {
					t.Fatal("queue does not drain")
				}
			}
			if h.nextOut != h.nextIn {
				t.Fatalf("drained %d bytes of %d", h.nextOut, h.nextIn)
			}
			span := latency + jitter
			if bound := int(span/mergeWindow) + 2; maxMarks > bound {
				t.Fatalf("%d marks pending at once, bound %d", maxMarks, bound)
			}
		})
	}
}

func TestShaper(t *testing.T) {
	var s shaper
	// 1 MB/s: 1000 bytes take 1 ms; back-to-back chunks queue.
	if got := s.depart(at(0), 1000, 1_000_000); !got.Equal(at(1)) {
		t.Fatalf("first chunk departs at %s, want 1ms", msSince(got))
	}
	if got := s.depart(at(0.5), 1000, 1_000_000); !got.Equal(at(2)) {
		t.Fatalf("queued chunk departs at %s, want 2ms", msSince(got))
	}
	// After idling, no queue.
	if got := s.depart(at(10), 2000, 1_000_000); !got.Equal(at(12)) {
		t.Fatalf("chunk after idle departs at %s, want 12ms", msSince(got))
	}
	// No cap: now.
	if got := s.depart(at(11), 1<<16, 0); !got.Equal(at(11)) {
		t.Fatalf("uncapped chunk departs at %s", msSince(got))
	}
}

func TestDrawDelayBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[bool]bool{}
	for i := 0; i < 10000; i++ {
		d := drawDelay(rng, 40*time.Millisecond, 5*time.Millisecond)
		if d < 40*time.Millisecond || d > 45*time.Millisecond {
			t.Fatalf("delay %s outside [40ms, 45ms]", d)
		}
		seen[d > 42500*time.Microsecond] = true
	}
	if !seen[true] || !seen[false] {
		t.Fatal("jitter does not spread over its range")
	}
	if d := drawDelay(rng, 7*time.Millisecond, 0); d != 7*time.Millisecond {
		t.Fatalf("no jitter: %s", d)
	}
}

func TestSymmetricLatency(t *testing.T) {
	regions := []string{"us-east", "eu-west", "ap-south", "pg"}
	distinct := map[time.Duration]bool{}
	for _, a := range regions {
		for _, b := range regions {
			d := SymmetricLatency(3, a, b, 30*time.Millisecond, 80*time.Millisecond)
			if d != SymmetricLatency(3, b, a, 30*time.Millisecond, 80*time.Millisecond) {
				t.Fatalf("%s/%s not symmetric", a, b)
			}
			if d < 30*time.Millisecond || d > 80*time.Millisecond || d%time.Millisecond != 0 {
				t.Fatalf("%s/%s = %s", a, b, d)
			}
			distinct[d] = true
		}
	}
	if len(distinct) < 4 {
		t.Fatalf("only %d distinct latencies over %d pairs", len(distinct), len(regions)*len(regions))
	}
	if SymmetricLatency(1, "a", "b", 30*time.Millisecond, 80*time.Millisecond) == SymmetricLatency(2, "a", "b", 30*time.Millisecond, 80*time.Millisecond) &&
		SymmetricLatency(1, "a", "c", 30*time.Millisecond, 80*time.Millisecond) == SymmetricLatency(2, "a", "c", 30*time.Millisecond, 80*time.Millisecond) {
		t.Fatal("the seed does not change the matrix")
	}
	if d := SymmetricLatency(1, "a", "b", 40*time.Millisecond, 10*time.Millisecond); d != 40*time.Millisecond {
		t.Fatalf("max < min gives %s", d)
	}
}

func TestRegionsFromName(t *testing.T) {
	for _, tc := range []struct{ name, from, to string }{
		{"us-east->eu-west", "us-east", "eu-west"},
		{"us-east->eu-west.n2", "us-east", "eu-west"},
		{"eu-west->pg", "eu-west", "pg"},
		{"plain", "", ""},
		{"->x", "", ""},
		{"a->", "", ""},
		{"a->b->c", "", ""},
		{"a.b->c", "", ""},
		{"a->.c", "", ""},
	} {
		from, to, ok := RegionsFromName(tc.name)
		if from != tc.from || to != tc.to || ok != (tc.from != "") {
			t.Errorf("RegionsFromName(%q) = %q, %q, %t", tc.name, from, to, ok)
		}
	}
}
