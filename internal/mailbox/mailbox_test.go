package mailbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// ready reports whether Ready is readable now (and consumes the token, as
// the consumer's select would).
func ready(b *Box[int]) bool {
	select {
	case <-b.Ready():
		return true
	default:
		return false
	}
}

// TestOrderAndBound: items come out in order; past the bound TryPut
// refuses; the ring wraps and grows without reordering.
func TestOrderAndBound(t *testing.T) {
	b := New[int](20)
	next, want := 0, 0
	for round := 0; round < 5; round++ {
		for b.TryPut(next) {
			next++
		}
		if b.Len() != 20 {
			t.Fatalf("round %d: %d queued at refusal, want the bound 20", round, b.Len())
		}
		for i := 0; i < 13; i++ { // leave some behind so the ring wraps
			v, ok := b.Take()
			if !ok || v != want {
				t.Fatalf("took %d %v, want %d", v, ok, want)
			}
			want++
		}
	}
	for {
		v, ok := b.Take()
		if !ok {
			break
		}
		if v != want {
			t.Fatalf("took %d, want %d", v, want)
		}
		want++
	}
	if want != next {
		t.Fatalf("took %d items, put %d", want, next)
	}
}

// TestReadyFollowsContents: Ready is readable exactly while something is
// queued, including after a Take that leaves items behind.
func TestReadyFollowsContents(t *testing.T) {
	b := New[int](8)
	if ready(b) {
		t.Fatal("an empty box is ready")
	}
	b.TryPut(1)
	b.TryPut(2)
	if !ready(b) {
		t.Fatal("a box with two items is not ready")
	}
	if v, _ := b.Take(); v != 1 {
		t.Fatalf("took %d", v)
	}
	if !ready(b) {
		t.Fatal("one item left behind, the box is not ready again")
	}
	if v, _ := b.Take(); v != 2 {
		t.Fatalf("took %d", v)
	}
	if ready(b) {
		t.Fatal("an emptied box is still ready")
	}
	if _, ok := b.Take(); ok {
		t.Fatal("took from an empty box")
	}
}

// TestMemoryFollowsContents: no buffer in a new box; a large buffer is
// kept while bursts use it and let go after one that used under a
// quarter; a small one is kept.
func TestMemoryFollowsContents(t *testing.T) {
	b := New[int](4096)
	if b.buf != nil {
		t.Fatalf("a new box holds %d slots", len(b.buf))
	}
	burst := func(n int) {
		for i := 0; i < n; i++ {
			b.TryPut(i)
		}
		for {
			if _, ok := b.Take(); !ok {
				return
			}
		}
	}
	burst(1000)
	if len(b.buf) < 1000 || len(b.buf) > 4096 {
		t.Fatalf("%d slots kept after a burst of 1000", len(b.buf))
	}
	kept := &b.buf[0]
	burst(900)
	if len(b.buf) == 0 || &b.buf[0] != kept {
		t.Fatal("a burst of the same size reallocated the buffer")
	}
	burst(10)
	if b.buf != nil {
		t.Fatalf("a box drained after a small burst keeps %d slots", len(b.buf))
	}
	burst(1)
	if len(b.buf) == 0 || len(b.buf) > keepSlots {
		t.Fatalf("a small buffer of %d slots", len(b.buf))
	}
}

// TestPutWaitsForSpace: a Put into a full box returns once the consumer
// takes, and gives up with ctx's error or ErrStopped.
func TestPutWaitsForSpace(t *testing.T) {
	b := New[int](1)
	b.TryPut(0)
	done := make(chan error, 1)
	go func() { done <- b.Put(context.Background(), nil, 1) }()
	select {
	case err := <-done:
		t.Fatalf("Put into a full box returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	if v, _ := b.Take(); v != 0 {
		t.Fatalf("took %d", v)
	}
	if err := <-done; err != nil {
		t.Fatalf("Put after a Take: %v", err)
	}
	if v, _ := b.Take(); v != 1 {
		t.Fatalf("took %d, want the waiting Put's 1", v)
	}

	b.TryPut(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Put(ctx, nil, 3); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled context: %v", err)
	}
	stop := make(chan struct{})
	close(stop)
	if err := b.Put(context.Background(), stop, 3); !errors.Is(err, ErrStopped) {
		t.Fatalf("Put after stop: %v", err)
	}
	if b.Len() != 1 {
		t.Fatalf("%d queued after two refused Puts", b.Len())
	}
}

// TestManyProducers: every item of several blocking producers arrives
// once, each producer's in its order, through a small box.
func TestManyProducers(t *testing.T) {
	const producers, each = 8, 2000
	b := New[int](16)
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if err := b.Put(context.Background(), nil, p*each+i); err != nil {
					t.Errorf("put: %v", err)
					return
				}
			}
		}()
	}
	next := make([]int, producers)
	for got := 0; got < producers*each; {
		<-b.Ready()
		for {
			v, ok := b.Take()
			if !ok {
				break
			}
			p, i := v/each, v%each
			if i != next[p] {
				t.Fatalf("producer %d: item %d after %d", p, i, next[p]-1)
			}
			next[p]++
			got++
		}
	}
	wg.Wait()
	if ready(b) {
		t.Fatal("ready after everything was taken")
	}
}

// BenchmarkBox and BenchmarkChannel: eight producers, one consumer that
// takes everything queued, as a range's driver does.
func BenchmarkBox(b *testing.B) {
	box := New[*int](4096)
	v := new(int)
	var wg sync.WaitGroup
	per := b.N/8 + 1
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				box.Put(context.Background(), nil, v)
			}
		}()
	}
	for got := 0; got < 8*per; {
		<-box.Ready()
		for {
			if _, ok := box.Take(); !ok {
				break
			}
			got++
		}
	}
	wg.Wait()
}

func BenchmarkChannel(b *testing.B) {
	ch := make(chan *int, 4096)
	v := new(int)
	var wg sync.WaitGroup
	per := b.N/8 + 1
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				ch <- v
			}
		}()
	}
	for got := 0; got < 8*per; got++ {
		<-ch
	}
	wg.Wait()
}
