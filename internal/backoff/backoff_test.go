package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestBaseAgainstModel checks Base against a dumb model: lo times 2 to the
// attempt, as a big enough integer, capped at hi.
func TestBaseAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		lo := time.Duration(rng.Int64N(int64(time.Second))) + 1
		hi := time.Duration(rng.Int64N(int64(10 * time.Second)))
		attempt := rng.IntN(80)
		want := max(hi, lo)
		if attempt < 40 && float64(lo)*float64(uint64(1)<<attempt) < float64(want) {
			want = lo << attempt
		}
		if got := Base(attempt, lo, hi); got != want {
			t.Fatalf("Base(%d, %v, %v) = %v, want %v", attempt, lo, hi, got, want)
		}
	}
	if Base(3, 0, time.Second) != 0 || Base(1<<30, time.Millisecond, time.Second) != time.Second {
		t.Fatal("edges")
	}
}

func TestDelayWithinBoundsAndSeeded(t *testing.T) {
	a, b := rand.New(rand.NewPCG(7, 7)), rand.New(rand.NewPCG(7, 7))
	sawLow, sawHigh := false, false
	for i := range 2000 {
		attempt := i % 12
		base := Base(attempt, 10*time.Millisecond, time.Second)
		d := Delay(attempt, 10*time.Millisecond, time.Second, a)
		if d < base/2 || d > base {
			t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, base/2, base)
		}
		if d != Delay(attempt, 10*time.Millisecond, time.Second, b) {
			t.Fatal("the same seed drew another delay")
		}
		sawLow = sawLow || d < base*3/4
		sawHigh = sawHigh || d > base*3/4
		if g := Delay(attempt, 10*time.Millisecond, time.Second, nil); g < base/2 || g > base {
			t.Fatalf("process-wide: %v outside [%v, %v]", g, base/2, base)
		}
	}
	if !sawLow || !sawHigh {
		t.Fatal("no spread")
	}
}

func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if err := Sleep(ctx, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	cancel()
	done := make(chan error, 1)
	go func() { done <- Sleep(ctx, time.Hour) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Sleep outlived its context")
	}
	if err := Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("a done context: %v", err)
	}
}
