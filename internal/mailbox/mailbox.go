// Package mailbox is a bounded first-in first-out queue with many
// producers and one consumer goroutine, whose memory follows what it
// holds. A buffered channel of the same bound allocates its whole buffer
// when it is made: a range's append inbox of 4,096 slots is 32 KiB, kept
// for every range on the node whether it ever sees an append or not. A
// Box starts with no buffer, grows by doubling up to its bound, and lets
// a large buffer go once a burst that used under a quarter of it has
// drained (so steady bursts of one size do not reallocate it each time).
//
// The consumer selects on Ready (beside its other channels) and then
// calls Take until it reports nothing or the consumer has taken enough;
// Ready is readable exactly while something is queued, so nothing left
// behind is missed and an empty box never wakes the consumer.
package mailbox

import (
	"context"
	"errors"
	"sync"
)

// ErrStopped is Put's answer when its stop channel closed first.
var ErrStopped = errors.New("mailbox: stopped")

// keepSlots is the largest buffer always kept once the box is empty
// again: an active range keeps a small one instead of growing it on every
// burst. A larger one is kept while bursts still use a quarter of it.
const keepSlots = 64

// Box is the queue. The zero value is not usable: use New.
type Box[T any] struct {
	max   int
	ready chan struct{} // one slot, full exactly while n > 0

	mu    sync.Mutex
	buf   []T // a ring: n items from head
	head  int
	n     int
	peak  int           // the most items held since the box was last empty
	space chan struct{} // closed when a Take frees a slot; nil: no Put waits
}

// New returns an empty box that holds at most max items (max >= 1).
func New[T any](max int) *Box[T] {
	if max < 1 {
		max = 1
	}
	return &Box[T]{max: max, ready: make(chan struct{}, 1)}
}

// Ready is readable while the box holds an item. Only the consumer
// receives from it.
func (b *Box[T]) Ready() <-chan struct{} { return b.ready }

// Len is the number of items queued.
func (b *Box[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// TryPut queues v unless the box is full; it never blocks.
func (b *Box[T]) TryPut(v T) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == b.max {
		return false
	}
	b.push(v)
	return true
}

// Put queues v, waiting while the box is full until a slot frees, ctx ends
// (its error is returned) or stop closes (ErrStopped). Items are queued in
// the order their Puts succeed.
func (b *Box[T]) Put(ctx context.Context, stop <-chan struct{}, v T) error {
	for {
		b.mu.Lock()
		if b.n < b.max {
			b.push(v)
			b.mu.Unlock()
			return nil
		}
		if b.space == nil {
			b.space = make(chan struct{})
		}
		space := b.space
		b.mu.Unlock()
		select {
		case <-space:
		case <-stop:
			return ErrStopped
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Take removes and returns the oldest item; ok is false when the box is
// empty. Only the consumer calls it.
func (b *Box[T]) Take() (v T, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		b.setReady(false)
		return v, false
	}
	var zero T
	v = b.buf[b.head]
	b.buf[b.head] = zero // the item is the consumer's now: keep no reference
	b.head = (b.head + 1) % len(b.buf)
	b.n--
	if b.n == 0 {
		b.head = 0
		if len(b.buf) > keepSlots && 4*b.peak <= len(b.buf) {
			b.buf = nil // the last burst used under a quarter: let it go
		}
		b.peak = 0
	}
	b.setReady(b.n > 0)
	if b.space != nil {
		close(b.space)
		b.space = nil
	}
	return v, true
}

// push appends v; b.mu is held and the box is not full.
func (b *Box[T]) push(v T) {
	if b.n == len(b.buf) {
		b.grow()
	}
	b.buf[(b.head+b.n)%len(b.buf)] = v
	b.n++
	b.peak = max(b.peak, b.n)
	if b.n == 1 {
		b.setReady(true)
	}
}

// grow doubles the ring (from 8 slots, up to max), oldest item first.
func (b *Box[T]) grow() {
	size := min(max(8, 2*len(b.buf)), b.max)
	buf := make([]T, size)
	for i := 0; i < b.n; i++ {
		buf[i] = b.buf[(b.head+i)%len(b.buf)]
	}
	b.buf, b.head = buf, 0
}

// setReady makes Ready's slot full (on) or empty (off); b.mu is held, so
// the slot agrees with n for every caller but the consumer between its
// receive from Ready and its next Take.
func (b *Box[T]) setReady(on bool) {
	if on {
		select {
		case b.ready <- struct{}{}:
		default:
		}
		return
	}
	select {
	case <-b.ready:
	default:
	}
}
