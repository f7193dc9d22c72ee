// Package stopper is a node's one way to start background work: a root
// context and a task group (CockroachDB's Stopper, reduced). Every
// goroutine that outlives the call that starts it is started through Go;
// Stop cancels the root context and waits for all of them, so that Close
// returns with nothing of the node still running.
package stopper

import (
	"context"
	"sync"
)

// Stopper is a root context and the tasks started under it. The zero
// value is not usable: use New.
type Stopper struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	stopping bool
	wg       sync.WaitGroup
}

// New returns a running Stopper.
func New() *Stopper {
	ctx, cancel := context.WithCancel(context.Background())
	return &Stopper{ctx: ctx, cancel: cancel}
}

// Context is the root context: done once Stop is called.
func (s *Stopper) Context() context.Context { return s.ctx }

// Go runs fn on a new goroutine with the root context, unless Stop was
// called: then fn does not run and Go returns false. fn must return soon
// after its context is done.
func (s *Stopper) Go(fn func(ctx context.Context)) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return false
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		fn(s.ctx)
	}()
	return true
}

// Stop cancels the root context and waits for every task started by Go.
// Later calls to Go run nothing; Stop may be called more than once.
func (s *Stopper) Stop() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}
