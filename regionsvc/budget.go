package regionsvc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// byteBudget is a node-wide bound on bytes held for some purpose (appends
// in flight, reads being answered): a counting semaphore in bytes. A
// request larger than the whole budget is taken only when nothing else
// holds any, so that it is bounded by the request size limits alone.
type byteBudget struct {
	name string
	max  int64

	mu      sync.Mutex
	used    int64
	changed chan struct{} // closed and replaced on every release
	// refused counts tryAcquire and acquire refusals, for tests and stats.
	refused atomic.Uint64
}

func newByteBudget(name string, max int64) *byteBudget {
	return &byteBudget{name: name, max: max, changed: make(chan struct{})}
}

// fits reports whether n more bytes fit; b.mu is held.
func (b *byteBudget) fits(n int64) bool {
	return b.used+n <= b.max || b.used == 0
}

// tryAcquire takes n bytes if they fit now.
func (b *byteBudget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.fits(n) {
		b.refused.Add(1)
		return false
	}
	b.used += n
	return true
}

// acquire takes n bytes, waiting for them until ctx ends or wait passes
// (false then).
func (b *byteBudget) acquire(ctx context.Context, n int64, wait time.Duration) bool {
	var timer <-chan time.Time
	for {
		b.mu.Lock()
		if b.fits(n) {
			b.used += n
			b.mu.Unlock()
			return true
		}
		ch := b.changed
		b.mu.Unlock()
		if timer == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-ch:
		case <-timer:
			b.refused.Add(1)
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// release returns n bytes.
func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		panic("regionsvc: budget " + b.name + " released more than it lent")
	}
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// inUse returns the bytes held now.
func (b *byteBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// slots is a counting semaphore without waiting: a request takes a slot
// or is refused.
type slots struct {
	ch chan struct{}
}

func newSlots(n int) *slots { return &slots{ch: make(chan struct{}, n)} }

func (s *slots) tryTake() bool {
	select {
	case s.ch <- struct{}{}:
		return true
	default:
		return false
	}
}

// take takes a slot, waiting up to wait for one; false if none came
// free or ctx ended first.
func (s *slots) take(ctx context.Context, wait time.Duration) bool {
	if s.tryTake() {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s.ch <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

func (s *slots) give() { <-s.ch }

// inUse returns the slots taken now.
func (s *slots) inUse() int { return len(s.ch) }

// rpcHold is what one RPC holds of the node's limits: a waiting slot
// until it holds a receive slot, a receive slot until its request is
// decoded (receive.go), and budget bytes until it ends. The limits'
// InTapHandle creates it, handlers add to it (holdOf), and it is all
// returned when the RPC ends (the stats handler's End, or the stream's
// context ending, whichever comes first).
type rpcHold struct {
	mu       sync.Mutex
	wait     *slots // the waiting slot held, nil once given back
	slot     *slots // the receive slot held, nil once given back
	budgets  []heldBytes
	released bool
}

type heldBytes struct {
	b *byteBudget
	n int64
}

type rpcHoldKey struct{}

// holdOf returns the RPC's hold, or nil outside an RPC (in-process calls).
func holdOf(ctx context.Context) *rpcHold {
	h, _ := ctx.Value(rpcHoldKey{}).(*rpcHold)
	return h
}

// waiting reports whether the RPC holds a waiting slot: it was admitted
// to wait for a receive slot, and has not taken one yet.
func (h *rpcHold) waiting() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wait != nil
}

// receiveWith records the receive slot taken from s, and gives the
// waiting slot back; it returns false (and records nothing) if the RPC
// has ended already.
func (h *rpcHold) receiveWith(s *slots) bool {
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return false
	}
	w := h.wait
	h.wait, h.slot = nil, s
	h.mu.Unlock()
	if w != nil {
		w.give()
	}
	return true
}

// received gives the receive slot (and a waiting slot still held) back:
// the request is decoded.
func (h *rpcHold) received() {
	h.mu.Lock()
	s, w := h.slot, h.wait
	h.slot, h.wait = nil, nil
	h.mu.Unlock()
	if s != nil {
		s.give()
	}
	if w != nil {
		w.give()
	}
}

// keep records that the RPC holds n bytes of b until it ends; it returns
// false (and holds nothing) if the RPC has ended already.
func (h *rpcHold) keep(b *byteBudget, n int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return false
	}
	h.budgets = append(h.budgets, heldBytes{b, n})
	return true
}

// release gives everything back; later calls do nothing.
func (h *rpcHold) release() {
	h.received()
	h.mu.Lock()
	held := h.budgets
	h.budgets, h.released = nil, true
	h.mu.Unlock()
	for _, hb := range held {
		hb.b.release(hb.n)
	}
}
