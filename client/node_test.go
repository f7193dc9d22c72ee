package client_test

// Integration tests against a real region node (regionsvc), in-process.
// Connection breaks are injected with a TCP proxy that cuts every
// connection, so the node's own dedup is what keeps retries exactly-once.

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/keyspace"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
)

func startNode(t *testing.T, dir, addr string) *regionsvc.Node {
	t.Helper()
	n, err := regionsvc.New(regionsvc.Config{
		DataDir:    dir,
		ListenAddr: addr,
		Fsync:      segment.FsyncNever, // the tests are about the protocol, not the disk
		Logger:     hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: testWriter{t}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// cutProxy forwards TCP to a target and can cut every connection at once.
type cutProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	cuts   int
}

func startProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{lis: lis, target: target, conns: make(map[net.Conn]struct{})}
	go p.serve()
	t.Cleanup(func() { lis.Close(); p.cut() })
	return p
}

func (p *cutProxy) Addr() string { return p.lis.Addr().String() }

func (p *cutProxy) serve() {
	for {
		down, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns[down], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(up, down)
		go pipe(down, up)
	}
}

// retarget sends new connections to target.
func (p *cutProxy) retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// cut closes every open connection through the proxy.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.cuts++
}

// readAll reads a whole range from a node.
func readAll(t *testing.T, c *client.Client, stream string, rng uint32) []client.StoredRecord {
	t.Helper()
	var out []client.StoredRecord
	var next uint64
	for {
		r, err := c.Read(testCtx(t), stream, rng, next, client.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Records...)
		if r.NextOffset >= r.TailOffset || len(r.Records) == 0 {
			return out
		}
		next = r.NextOffset
	}
}

func TestNodeRoundTrip(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, n.Addr())
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "chat", RangeCount: 4}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, "chat")
	var recs []*client.Record
	for i := range 200 {
		recs = append(recs, &client.Record{
			Key:     fmt.Appendf(nil, "room-%d", i%7),
			Value:   fmt.Appendf(nil, "msg %d", i),
			Headers: []client.Header{{Key: "i", Value: []byte(strconv.Itoa(i))}},
		})
	}
	res, err := p.ProduceSync(ctx, recs...)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Range != keyspace.RangeForKey(recs[i].Key, 4) || r.Epoch == 0 || r.AppendTime.IsZero() {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	d, err := c.DescribeStream(ctx, "chat")
	if err != nil {
		t.Fatal(err)
	}
	total := uint64(0)
	for _, r := range d.Ranges {
		total += r.TailOffset
		got := readAll(t, c, "chat", r.Range)
		if uint64(len(got)) != r.TailOffset {
			t.Fatalf("range %d: read %d records, tail %d", r.Range, len(got), r.TailOffset)
		}
		for _, rec := range got {
			i, _ := strconv.Atoi(string(rec.Headers[0].Value))
			if string(rec.Value) != fmt.Sprintf("msg %d", i) || res[i].Offset != rec.Offset || res[i].Range != r.Range {
				t.Fatalf("range %d offset %d holds %q", r.Range, rec.Offset, rec.Value)
			}
		}
	}
	if total != 200 {
		t.Fatalf("tails add up to %d", total)
	}

	// Subscribe from a time and from an offset.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r0 := res[0].Range
	count := 0
	for rec, err := range c.Subscribe(sctx, "chat", r0, client.StartAt{Offset: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		if rec.Offset != uint64(count+1) {
			t.Fatalf("subscribe delivered %d, want %d", rec.Offset, count+1)
		}
		if count++; count == 5 {
			break
		}
	}
	off, err := c.OffsetForTime(ctx, "chat", r0, time.Now().Add(time.Hour))
	if err != nil || off != d.Ranges[r0].TailOffset {
		t.Fatalf("OffsetForTime(future) = %d, %v", off, err)
	}
}

// TestNodeExactlyOnceThroughCuts: connections are cut again and again
// while a pipelined producer appends; each key's records land exactly once,
// in order.
func TestNodeExactlyOnceThroughCuts(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	proxy := startProxy(t, n.Addr())
	c := newClient(t, proxy.Addr(), client.RetriesMax(50))
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "s", RangeCount: 3}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, "s", client.InflightBatchesMax(5), client.BatchBytesMax(4<<10),
		client.ProducerRetryBackoff(time.Millisecond, 20*time.Millisecond))

	stopCuts := make(chan struct{})
	cutsDone := make(chan struct{})
	go func() {
		defer close(cutsDone)
		for i := 0; i < 500; i++ {
			select {
			case <-stopCuts:
				return
			case <-time.After(3 * time.Millisecond):
				proxy.cut()
			}
		}
	}()
	const keys, perKey = 10, 300
	rs := newResults()
	for seq := range perKey {
		for k := range keys {
			p.Produce(ctx, &client.Record{
				Key:   fmt.Appendf(nil, "key-%d", k),
				Value: fmt.Appendf(nil, "key-%d|%d|%s", k, seq, strings.Repeat("x", 100)),
			}, rs.cb(seq*keys+k))
		}
	}
	rs.wait(t)
	close(stopCuts)
	<-cutsDone
	if len(rs.errs) != 0 {
		for i, err := range rs.errs {
			t.Errorf("record %d: %v", i, err)
		}
		t.FailNow()
	}
	dups := 0
	for _, r := range rs.res {
		if r.Duplicate {
			dups++
		}
	}
	t.Logf("%d cuts, %d records acked as duplicates", proxy.cuts, dups)

	direct := newClient(t, n.Addr())
	next := map[string]int{}
	total := 0
	for rng := range uint32(3) {
		for _, rec := range readAll(t, direct, "s", rng) {
			parts := strings.SplitN(string(rec.Value), "|", 3)
			seq, _ := strconv.Atoi(parts[1])
			if parts[0] != string(rec.Key) || next[parts[0]] != seq {
				t.Fatalf("range %d offset %d: %s #%d, want #%d", rng, rec.Offset, parts[0], seq, next[parts[0]])
			}
			next[parts[0]]++
			total++
		}
	}
	if total != keys*perKey {
		t.Fatalf("log holds %d records, want %d", total, keys*perKey)
	}
}

func TestNodeSubscribeResumesThroughCut(t *testing.T) {
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	proxy := startProxy(t, n.Addr())
	direct := newClient(t, n.Addr())
	ctx := testCtx(t)
	if _, err := direct.CreateStream(ctx, client.StreamConfig{Name: "s", RangeCount: 1}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, direct, "s")
	produceN(t, p, 0, 100)

	c := newClient(t, proxy.Addr(), client.RetriesMax(50))
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next uint64
	for rec, err := range c.Subscribe(sctx, "s", 0, client.StartAt{}) {
		if err != nil {
			if sctx.Err() != nil {
				break
			}
			t.Fatal(err)
		}
		if rec.Offset != next || string(rec.Value) != strconv.FormatUint(next, 10) {
			t.Fatalf("got %d (%q), want %d", rec.Offset, rec.Value, next)
		}
		next++
		switch next {
		case 50, 100:
			proxy.cut()
			if next == 100 {
				produceN(t, p, 100, 20)
			}
		case 120:
			cancel()
		}
	}
	if next != 120 {
		t.Fatalf("stopped at %d", next)
	}
}

// TestNodeRestart: the node goes away and comes back on the same data while
// a producer has records outstanding; they are delivered once, after the
// restart. (The proxy cuts the connections first, as a crash would, so that
// the node's graceful stop does not wait for the producer's streams.)
func TestNodeRestart(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, "127.0.0.1:0")
	proxy := startProxy(t, n.Addr())
	c := newClient(t, proxy.Addr(), client.RetriesMax(50))
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "s", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, "s", client.ProducerRetryBackoff(5*time.Millisecond, 50*time.Millisecond))
	produceN(t, p, 0, 50)
	proxy.cut()
	n.Close()

	rs := newResults()
	for i := 50; i < 100; i++ {
		p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))}, rs.cb(i))
	}
	n2 := startNode(t, dir, "127.0.0.1:0")
	proxy.retarget(n2.Addr())
	rs.wait(t)
	if len(rs.errs) != 0 {
		t.Fatalf("errors after restart: %v", rs.errs)
	}
	r := keyspace.RangeForKey([]byte("k"), 2)
	got := readAll(t, c, "s", r)
	for i, rec := range got {
		if string(rec.Value) != strconv.Itoa(i) {
			t.Fatalf("offset %d holds %q", i, rec.Value)
		}
	}
	if len(got) != 100 {
		t.Fatalf("log holds %d records", len(got))
	}
	proxy.cut() // let the cleanup's graceful stop finish at once
}
