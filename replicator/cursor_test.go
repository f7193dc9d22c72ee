package replicator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
)

// TestCursor runs the datadriven scripts of testdata/cursor: each command
// feeds the cursor one event and prints the actions it then returns and
// its status. Regenerate the expected output with -rewrite.
//
//	new epoch=E [window=B] [requests=N] [batch=B] [hints=N]
//	start | tick | read-empty | read-failed | stream-failed | stop
//	tail end=N
//	connected applied=N [epoch=E]
//	read-done first=N end=N bytes=B
//	read-blocked bytes=B
//	ack applied=N [epoch=E]
//	refuse code=gap|stale|diverged|malformed|not-leader|unavailable [expected=N] [hint=A]
//	open-refused code=... [hint=A]
func TestCursor(t *testing.T) {
	datadriven.Walk(t, "testdata/cursor", func(t *testing.T, path string) {
		var c *Cursor
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				cfg := CursorConfig{
					Rand:       rand.New(rand.NewPCG(1, 2)),
					BackoffMin: 10 * time.Millisecond,
					BackoffMax: 80 * time.Millisecond,
				}
				d.ScanArgs(t, "epoch", &cfg.Epoch)
				d.MaybeScanArgs(t, "window", &cfg.WindowBytes)
				d.MaybeScanArgs(t, "requests", &cfg.WindowRequestsMax)
				d.MaybeScanArgs(t, "batch", &cfg.BatchBytesMax)
				d.MaybeScanArgs(t, "hints", &cfg.HintsFollowMax)
				var err error
				if c, err = NewCursor(cfg); err != nil {
					return err.Error()
				}
				return printCursor(c)
			}
			if c == nil {
				d.Fatalf(t, "no cursor: start with new")
			}
			u64 := func(key string) uint64 {
				var v uint64
				d.ScanArgs(t, key, &v)
				return v
			}
			epochArg := func() uint64 {
				e := c.cfg.Epoch
				d.MaybeScanArgs(t, "epoch", &e)
				return e
			}
			switch d.Cmd {
			case "start":
				c.Start()
			case "tick":
				c.Tick()
			case "stop":
				c.Stop(errors.New("owner stopped"))
			case "tail":
				c.TailAdvanced(u64("end"))
			case "connected":
				c.Connected(u64("applied"), epochArg())
				if d.HasArg("resend") {
					c.Resend()
				}
			case "read-done":
				var bytes int
				d.ScanArgs(t, "bytes", &bytes)
				c.ReadDone(u64("first"), u64("end"), bytes)
			case "read-empty":
				c.ReadEmpty()
			case "read-blocked":
				var bytes int
				d.ScanArgs(t, "bytes", &bytes)
				c.ReadBlocked(bytes)
			case "read-failed":
				c.ReadFailed(errors.New("disk says no"))
			case "stream-failed":
				c.StreamFailed(errors.New("connection reset"))
			case "ack":
				c.Response(u64("applied"), epochArg())
			case "refuse", "open-refused":
				r := testRefusal(t, d)
				if d.Cmd == "refuse" {
					c.Refused(r)
				} else {
					c.OpenRefused(r)
				}
			default:
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			return printCursor(c)
		})
	})
}

// testRefusal builds the refusal a command describes.
func testRefusal(t *testing.T, d *datadriven.TestData) *Refusal {
	var code, hint string
	var expected uint64
	d.ScanArgs(t, "code", &code)
	d.MaybeScanArgs(t, "hint", &hint)
	d.MaybeScanArgs(t, "expected", &expected)
	var r *Refusal
	switch code {
	case "gap":
		r = gapRefusal(expected+1, expected)
	case "stale":
		r = newRefusal(ErrStaleEpoch, "test")
	case "diverged":
		r = newRefusal(ErrDiverged, "test")
	case "malformed":
		r = newRefusal(ErrMalformed, "test")
	case "not-leader":
		r = fromAPI(apierr.New(apierr.NotLeader, "test"))
	case "unavailable":
		r = fromAPI(apierr.New(apierr.Unavailable, "test"))
	default:
		d.Fatalf(t, "unknown code %s", code)
	}
	r.API.LeaderHint = hint
	// Through the wire form, as the driver gets it.
	return fromDetail(rpcerr.Detail(r.API))
}

// printCursor prints the actions Ready returns and the cursor's state.
func printCursor(c *Cursor) string {
	var b strings.Builder
	for _, a := range c.Ready() {
		fmt.Fprintln(&b, a)
	}
	s := c.Status()
	fmt.Fprintf(&b, "%s next=%d acked=%d tail=%d inflight=%dB/%d attempts=%d",
		s.Phase, s.Next, s.Acked, s.Tail, s.InflightBytes, s.InflightRequests, s.Attempts)
	return b.String()
}

// TestCursorWindowProperty drives a cursor with a seeded random mix of
// events against a model mirror and checks, after every step, that
// in-flight bytes stay within the window (but for a lone frame), that
// requests in flight stay within their bound, and that the mirror the
// model keeps is always a dense prefix that ends equal to the source.
func TestCursorWindowProperty(t *testing.T) {
	var cuts, gaps int
	for seed := uint64(1); seed <= 50; seed++ {
		c, g := runCursorModel(t, seed)
		cuts += c
		gaps += g
	}
	if cuts < 10 || gaps < 10 {
		t.Fatalf("the model cut the mirror %d times and refused %d gaps: too few to test rewinds", cuts, gaps)
	}
}

func runCursorModel(t *testing.T, seed uint64) (cuts, gaps int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	const window, batchMax, reqMax = 4000, 1000, 6
	c, err := NewCursor(CursorConfig{Epoch: 1, Rand: rand.New(rand.NewPCG(seed, 8)),
		WindowBytes: window, WindowRequestsMax: reqMax, BatchBytesMax: batchMax})
	if err != nil {
		t.Fatal(err)
	}
	// The source: frames of 1..4 offsets and 100..1500 bytes (some larger
	// than a batch), 5% much larger than the window.
	type frame struct {
		base, end uint64
		bytes     int
	}
	var frames []frame
	var next uint64
	for range 300 {
		n := 1 + uint64(rng.IntN(4))
		size := 100 + rng.IntN(1400)
		if rng.IntN(20) == 0 {
			size = window * 2
		}
		frames = append(frames, frame{next, next + n, size})
		next += n
	}
	committed := uint64(0)
	// The mirror: its applied end and the requests it has not answered.
	type req struct {
		first, end uint64
		heartbeat  bool
	}
	var applied uint64
	var queue []req
	connected := false

	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+format, append([]any{seed}, args...)...)
	}
	c.Start()
	for step := 0; step < 20000 && (applied < next || committed < next); step++ {
		// Execute the actions.
		for acts := c.Ready(); len(acts) > 0; acts = c.Ready() {
			for _, a := range acts {
				switch a.Kind {
				case ActionConnect:
					queue, connected = nil, false
					if rng.IntN(4) > 0 {
						c.Connected(applied, 1)
						connected = true
					} else {
						c.StreamFailed(errors.New("dial failed"))
					}
				case ActionRead:
					// The frame holding From, then more within MaxBytes.
					i := 0
					for frames[i].end <= a.From {
						i++
					}
					first, end, bytes := frames[i].base, frames[i].base, 0
					for ; i < len(frames) && frames[i].base < committed; i++ {
						if bytes > 0 && bytes+frames[i].bytes > a.MaxBytes {
							break
						}
						bytes += frames[i].bytes
						end = frames[i].end
					}
					switch {
					case bytes == 0:
						c.ReadEmpty()
					case bytes > a.FitBytes:
						c.ReadBlocked(bytes)
					default:
						queue = append(queue, req{first: first, end: end})
						c.ReadDone(first, end, bytes)
					}
				case ActionHeartbeat:
					queue = append(queue, req{heartbeat: true})
				case ActionStop:
					fail("stopped: %v", a.Err)
				}
			}
		}
		st := c.Status()
		batches := 0
		for _, r := range queue {
			if !r.heartbeat {
				batches++
			}
		}
		if st.InflightBytes > window && batches > 1 {
			fail("step %d: %d bytes in flight in %d batches, window %d", step, st.InflightBytes, batches, window)
		}
		if st.InflightRequests > reqMax {
			fail("step %d: %d requests in flight", step, st.InflightRequests)
		}
		// One random event.
		switch k := rng.IntN(10); {
		case k < 3 && committed < next:
			committed = min(next, committed+uint64(1+rng.IntN(20)))
			// Commits land on frame boundaries.
			for _, f := range frames {
				if f.base < committed && committed < f.end {
					committed = f.end
				}
			}
			c.TailAdvanced(committed)
		case k < 8 && connected && len(queue) > 0:
			r := queue[0]
			queue = queue[1:]
			switch {
			case r.heartbeat:
				c.Response(applied, 1)
			case r.first > applied:
				gaps++
				c.Refused(gapRefusal(r.first, applied))
			default:
				applied = max(applied, r.end)
				c.Response(applied, 1)
			}
		case k == 8 && connected && rng.IntN(10) == 0:
			connected = false
			c.StreamFailed(errors.New("reset"))
		case k == 8 && rng.IntN(10) == 0:
			// The mirror loses its tail back to a frame boundary (homing
			// cut a divergent tail): later batches are gaps.
			for i := len(frames) - 1; i >= 0; i-- {
				if frames[i].end <= applied && rng.IntN(3) == 0 {
					if applied != frames[i].end {
						cuts++
					}
					applied = frames[i].end
					break
				}
			}
		case k == 9:
			c.Tick()
		}
	}
	if applied != next {
		fail("mirror reached %d of %d (cursor %+v)", applied, next, c.Status())
	}
	return cuts, gaps
}
