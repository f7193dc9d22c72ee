package client

import "context"

// StartPositionsFunc returns where a member starts fetching range rng of
// the group's stream, from a store of the application's own: ok false
// means the store has no position for it (the group's committed position
// is used, else StartFrom's end). An error ends the consumer (Records
// yields it).
type StartPositionsFunc func(ctx context.Context, rng uint32) (offset uint64, ok bool, err error)

// StartPositions makes the application's own store the source of truth
// for where each assigned range starts, overriding the default of the
// group's committed positions. It is for consumers that keep their
// position with their output, in one transaction (exactly once into a
// database: examples/pgsink): the group's positions may then lag the
// store's (a crash between the two commits), and the store's win. A
// position from fn is marked processed, so the next Commit raises the
// group's position to it (for lag and tools). fn runs on the range's
// fetching goroutine, once per assignment of the range.
func StartPositions(fn StartPositionsFunc) GroupOpt {
	return func(c *groupConfig) { c.startPositions = fn }
}

// externalStart asks StartPositions' function where gr starts; without
// one, or when it has none, from and known stay as the group's.
func (g *GroupConsumer) externalStart(ctx context.Context, gr *groupRange, from uint64, known bool) (uint64, bool, error) {
	if g.cfg.startPositions == nil {
		return from, known, nil
	}
	off, ok, err := g.cfg.startPositions(ctx, gr.rng)
	if err != nil {
		if ctx.Err() == nil {
			g.fail(err)
		}
		return 0, false, err
	}
	if !ok {
		return from, known, nil
	}
	g.mu.Lock()
	gr.marked = max(gr.marked, off)
	g.mu.Unlock()
	return off, true, nil
}
