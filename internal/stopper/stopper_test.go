package stopper

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestStopWaitsForTasks: Stop cancels the tasks' context and returns only
// once every task has returned; Go after Stop runs nothing.
func TestStopWaitsForTasks(t *testing.T) {
	s := New()
	var done atomic.Int64
	for i := 0; i < 10; i++ {
		if !s.Go(func(ctx context.Context) {
			<-ctx.Done()
			time.Sleep(time.Millisecond)
			done.Add(1)
		}) {
			t.Fatal("Go refused before Stop")
		}
	}
	s.Stop()
	if n := done.Load(); n != 10 {
		t.Fatalf("Stop returned with %d of 10 tasks done", n)
	}
	ran := false
	if s.Go(func(context.Context) { ran = true }) || ran {
		t.Fatal("Go ran a task after Stop")
	}
	s.Stop() // again: no effect
	if s.Context().Err() == nil {
		t.Fatal("the root context is not done after Stop")
	}
}
