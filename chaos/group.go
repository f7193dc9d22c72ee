package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/keyspace"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
)

// GroupWorkload runs a consumer group on the scenario's stream: Members
// client.GroupConsumers (in the harness's process, each with its own SDK
// client knowing Region's nodes), which record every record they process
// and commit automatically. Member faults (member-kill,
// member-partition) hit them; "cursors:leader" kills the coordinator.
type GroupWorkload struct {
	// Members is how many members run at once; 0 runs no group.
	Members int `json:"members,omitempty"`
	// SessionTimeout of every member, default 3s.
	SessionTimeout Duration `json:"session_timeout,omitempty"`
	// Region whose nodes the members know, default the first region.
	Region string `json:"region,omitempty"`
}

func (g *GroupWorkload) setDefaults(shape Shape) {
	if g.SessionTimeout <= 0 {
		g.SessionTimeout = D(3 * time.Second)
	}
	if g.Region == "" {
		g.Region = shape.Regions[0]
	}
}

// The group's part of a History.
type GroupHistory struct {
	Group string `json:"group"`
	// Processed: every record a member's Records loop received.
	Processed []Processed `json:"processed"`
	// Assigned: every OnAssigned call.
	Assigned []Assignment `json:"assigned"`
	// CursorLog holds what cursors.CheckLog found in the group's range of
	// the cursor stream, read at the end (CursorLogRead), of
	// CursorRecords records.
	CursorLog     []string `json:"cursor_log,omitempty"`
	CursorLogRead bool     `json:"cursor_log_read"`
	CursorLogErr  string   `json:"cursor_log_err,omitempty"`
	CursorRecords int      `json:"cursor_records"`
	// CaughtUp says whether the members processed every acked record
	// before the harness stopped waiting.
	CaughtUp bool `json:"caught_up"`
}

// Processed is one record a member received.
type Processed struct {
	Member string `json:"member"`
	Range  uint32 `json:"range"`
	Offset uint64 `json:"offset"`
	Value  string `json:"value"`
	At     int64  `json:"at"`
}

// Assignment is one OnAssigned call.
type Assignment struct {
	Member string   `json:"member"`
	Ranges []uint32 `json:"ranges"`
	At     int64    `json:"at"`
}

// groupRun is the running group: its live members and what they did.
type groupRun struct {
	gw     GroupWorkload
	cl     Cluster
	stream string
	rec    *recorder
	log    hclog.Logger

	mu       sync.Mutex
	hist     GroupHistory
	live     []*member
	started  int
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	gateDial func(context.Context, string) (net.Conn, error)
}

// member is one group member: a GroupConsumer with its own client, whose
// connections go through its own gate (member-partition cuts it).
type member struct {
	id   string
	g    *client.GroupConsumer
	c    *client.Client
	gate *gate
}

func groupName(stream string) string { return "g-" + stream }

func newGroupRun(ctx context.Context, gw GroupWorkload, cl Cluster, stream string, rec *recorder, log hclog.Logger) (*groupRun, error) {
	gr := &groupRun{gw: gw, cl: cl, stream: stream, rec: rec, log: log.Named("group"), hist: GroupHistory{Group: groupName(stream)}}
	gr.ctx, gr.cancel = context.WithCancel(ctx)
	var d net.Dialer // hints name the nodes' advertised (client) addresses: dialled as they are
	gr.gateDial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	for range gw.Members {
		if err := gr.startMember(); err != nil {
			gr.close()
			return nil, err
		}
	}
	return gr, nil
}

// startMember starts a member under a new id (a new incarnation).
func (gr *groupRun) startMember() error {
	gr.mu.Lock()
	gr.started++
	id := fmt.Sprintf("m%d", gr.started)
	gr.mu.Unlock()
	m := &member{id: id, gate: &gate{conns: map[net.Conn]struct{}{}}}
	opts := []client.Opt{client.DialOptions(grpc.WithContextDialer(m.gate.dialer(gr.gateDial))),
		client.RetryBackoff(20*time.Millisecond, 500*time.Millisecond), client.RequestTimeout(5 * time.Second)}
	if cfg := gr.cl.ClientTLS(); cfg != nil {
		opts = append(opts, client.TLSConfig(cfg)) // as newClient's
	}
	c, err := client.New(clientAddrs(gr.cl, gr.gw.Region), opts...)
	if err != nil {
		return err
	}
	m.c = c
	m.g, err = c.NewGroupConsumer(gr.stream, gr.hist.Group, client.GroupMemberID(id), client.SessionTimeout(gr.gw.SessionTimeout.Std()),
		client.AutoCommitInterval(200*time.Millisecond), client.OnAssigned(func(r []uint32) {
			gr.mu.Lock()
			gr.hist.Assigned = append(gr.hist.Assigned, Assignment{Member: id, Ranges: r, At: gr.rec.now()})
			gr.mu.Unlock()
		}))
	if err != nil {
		c.Close()
		return err
	}
	gr.mu.Lock()
	gr.live = append(gr.live, m)
	gr.mu.Unlock()
	gr.wg.Add(1)
	go gr.consume(m)
	gr.log.Info("member started", "member", id)
	return nil
}

func (gr *groupRun) consume(m *member) {
	defer gr.wg.Done()
	for rec, err := range m.g.Records(gr.ctx) {
		if err != nil {
			if !errors.Is(err, client.ErrClosed) && gr.ctx.Err() == nil {
				gr.log.Warn("member ended", "member", m.id, "error", err)
			}
			return
		}
		gr.mu.Lock()
		gr.hist.Processed = append(gr.hist.Processed, Processed{Member: m.id, Range: rec.Range, Offset: rec.Offset,
			Value: string(rec.Value), At: gr.rec.now()})
		gr.mu.Unlock()
	}
}

// victim picks the rep-th live member (round robin), and its ranges.
func (gr *groupRun) victim(rep int) (*member, []uint32, error) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if len(gr.live) == 0 {
		return nil, nil, errors.New("chaos: no live group member")
	}
	m := gr.live[rep%len(gr.live)]
	return m, m.g.Assigned(), nil
}

// kill crashes a member (no commit, no leave: the coordinator removes it
// after its session); the revert starts a new one.
func (gr *groupRun) kill(rep int, mark func()) (string, []uint32, func(context.Context) error, error) {
	m, owned, err := gr.victim(rep)
	if err != nil {
		return "", nil, nil, err
	}
	mark()
	m.g.Abandon()
	m.c.Close()
	gr.mu.Lock()
	gr.live = slices.DeleteFunc(gr.live, func(x *member) bool { return x == m })
	gr.mu.Unlock()
	return "member-kill " + m.id, owned, func(context.Context) error { return gr.startMember() }, nil
}

// partition cuts a member's connections to every node (reset, refused):
// it fences itself after a session without answers and joins again once
// healed.
func (gr *groupRun) partition(rep int, mark func()) (string, []uint32, func(context.Context) error, error) {
	m, owned, err := gr.victim(rep)
	if err != nil {
		return "", nil, nil, err
	}
	mark()
	m.gate.cut()
	return "member-partition " + m.id, owned, func(context.Context) error { m.gate.heal(); return nil }, nil
}

// healAll heals every member's gate.
func (gr *groupRun) healAll() {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for _, m := range gr.live {
		m.gate.heal()
	}
}

// processedValues is the set of values processed so far.
func (gr *groupRun) processedValues() map[string]bool {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	out := make(map[string]bool, len(gr.hist.Processed))
	for _, p := range gr.hist.Processed {
		out[p.Value] = true
	}
	return out
}

// finish waits until the members processed every value of acked (or
// timeout), closes them (commit, leave), and reads the group's range of
// the cursor stream for the checker.
func (gr *groupRun) finish(ctx context.Context, acked []string, timeout time.Duration) GroupHistory {
	gr.healAll()
	deadline := time.Now().Add(timeout)
	for {
		seen := gr.processedValues()
		missing := slices.ContainsFunc(acked, func(v string) bool { return !seen[v] })
		if !missing {
			gr.hist.CaughtUp = true
			break
		}
		if time.Now().After(deadline) || !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			break
		}
	}
	gr.close()
	gr.readCursorLog(ctx)
	gr.mu.Lock()
	defer gr.mu.Unlock()
	return gr.hist
}

// close stops every member gracefully and waits for their loops.
func (gr *groupRun) close() {
	gr.mu.Lock()
	live := gr.live
	gr.live = nil
	gr.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.g.Close()
			m.c.Close()
		}()
	}
	wg.Wait()
	gr.cancel()
	gr.wg.Wait()
}

// readCursorLog reads the group's range of the cursor stream at its home
// (consistency home) and runs cursors.CheckLog over it.
func (gr *groupRun) readCursorLog(ctx context.Context) {
	c, err := newClient(gr.cl, gr.gw.Region)
	if err != nil {
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d, err := c.DescribeStream(ctx, cursorStream)
	if err != nil || d.Stream.RangeCount == 0 {
		gr.log.Warn("cursor stream not described", "error", err)
		gr.mu.Lock()
		gr.hist.CursorLogErr = fmt.Sprintf("describe %s: %v", cursorStream, err)
		gr.mu.Unlock()
		return
	}
	rng := keyspace.RangeForKey([]byte(gr.hist.Group), d.Stream.RangeCount)
	home := gr.gw.Region
	if int(rng) < len(d.Ranges) && d.Ranges[rng].HomeRegion != "" {
		home = d.Ranges[rng].HomeRegion
	}
	hc, err := newClient(gr.cl, home)
	if err != nil {
		return
	}
	defer hc.Close()
	violations, n, err := checkCursorRange(ctx, hc, rng)
	if err != nil {
		gr.log.Warn("cursor stream not checked", "range", rng, "error", err)
		gr.mu.Lock()
		gr.hist.CursorLogErr = err.Error()
		gr.mu.Unlock()
		return
	}
	gr.mu.Lock()
	gr.hist.CursorLog, gr.hist.CursorRecords, gr.hist.CursorLogRead = violations, n, true
	gr.mu.Unlock()
}

// gate is a member's network: cut, it closes every connection and
// refuses new ones (a partition the member sees as resets), until healed.
type gate struct {
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

func (g *gate) dialer(inner func(context.Context, string) (net.Conn, error)) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		g.mu.Lock()
		closed := g.closed
		g.mu.Unlock()
		if closed {
			return nil, errors.New("chaos: member partitioned")
		}
		conn, err := inner(ctx, addr)
		if err != nil {
			return nil, err
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.closed {
			conn.Close()
			return nil, errors.New("chaos: member partitioned")
		}
		g.conns[conn] = struct{}{}
		return &gateConn{Conn: conn, g: g}, nil
	}
}

func (g *gate) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for c := range g.conns {
		c.Close()
	}
	clear(g.conns)
}

func (g *gate) heal() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
}

// gateConn forgets itself in its gate when closed.
type gateConn struct {
	net.Conn
	g *gate
}

func (c *gateConn) Close() error {
	c.g.mu.Lock()
	delete(c.g.conns, c.Conn)
	c.g.mu.Unlock()
	return c.Conn.Close()
}
