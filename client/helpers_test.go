package client_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
)

// testLogger routes client logs to t.Log.
func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   t.Name(),
		Level:  hclog.Info,
		Output: testWriter{t},
	})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func startFake(t testing.TB, cfg clienttest.Config) *clienttest.Server {
	t.Helper()
	s, err := clienttest.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// newClient returns a client with fast retries, closed at the end of the
// test.
func newClient(t testing.TB, addr string, opts ...client.Opt) *client.Client {
	t.Helper()
	opts = append([]client.Opt{
		client.Logger(testLogger(t)),
		client.RetryBackoff(time.Millisecond, 20*time.Millisecond),
	}, opts...)
	c, err := client.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newProducer makes a producer with a window of 5 batches per range (the
// default is 1), so that the tests exercise pipelining, rewinds and
// out-of-order replies; opts may override it.
func newProducer(t testing.TB, c *client.Client, stream string, opts ...client.ProducerOpt) *client.Producer {
	t.Helper()
	opts = append([]client.ProducerOpt{client.InflightBatchesMax(5)}, opts...)
	p, err := c.NewProducer(stream, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds, for up to a minute: slack for a busy
// machine (it returns as soon as cond holds), not a bound being tested.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// results collects produce callbacks by record index.
type results struct {
	mu   sync.Mutex
	wg   sync.WaitGroup
	res  map[int]client.ProduceResult
	errs map[int]error
}

func newResults() *results {
	return &results{res: make(map[int]client.ProduceResult), errs: make(map[int]error)}
}

func (r *results) cb(i int) func(client.ProduceResult, error) {
	r.wg.Add(1)
	return func(res client.ProduceResult, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, dup := r.res[i]; dup {
			panic(fmt.Sprintf("callback for record %d ran twice", i))
		}
		if _, dup := r.errs[i]; dup {
			panic(fmt.Sprintf("callback for record %d ran twice", i))
		}
		if err != nil {
			r.errs[i] = err
		} else {
			r.res[i] = res
		}
		r.wg.Done()
	}
}

func (r *results) wait(t testing.TB) {
	t.Helper()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("callbacks did not all run")
	}
}
