package regionsvc_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
)

// ackedRecord is what a producer callback learned about one record.
type ackedRecord struct {
	rng    uint32
	offset uint64
	value  string
}

// TestKill9DuringProduce kills geologd with SIGKILL several times while an
// idempotent producer runs, restarting it on the same data each time. After
// the last restart every acknowledged record must be readable at the offset
// it was acked with, no record may appear twice, and per key the log holds
// the producer's sequence in order.
func TestKill9DuringProduce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	dataDir := t.TempDir()
	addr := nodeproc.FreeAddr(t)
	proc := nodeproc.Start(t, dataDir, addr)

	c, err := client.New(addr, client.RetryBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	waitReady(t, ctx, c)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "crash", RangeCount: 4}); err != nil {
		t.Fatal(err)
	}
	p, err := c.NewProducer("crash",
		client.ProducerRetryBackoff(20*time.Millisecond, 200*time.Millisecond),
		client.DeliveryTimeout(2*time.Minute),
		client.InflightBatchesMax(5)) // pipelined: retries must rewind a window
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu        sync.Mutex
		acked     []ackedRecord
		failures  []error
		produced  int
		stop      = make(chan struct{})
		producing sync.WaitGroup
	)
	const keys = 16
	producing.Add(1)
	go func() {
		defer producing.Done()
		seq := make([]int, keys)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := i % keys
			value := fmt.Sprintf("k%02d/%08d/%s", k, seq[k], strings.Repeat("x", 200))
			seq[k]++
			mu.Lock()
			produced++
			mu.Unlock()
			p.Produce(ctx, &client.Record{Key: []byte(fmt.Sprintf("key-%02d", k)), Value: []byte(value)},
				func(r client.ProduceResult, err error) {
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						failures = append(failures, err)
						return
					}
					acked = append(acked, ackedRecord{r.Range, r.Offset, value})
				})
		}
	}()
	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }

	const kills = 4
	for k := 0; k < kills; k++ {
		// Let traffic flow: wait for at least 2,000 more acks.
		target := ackedCount() + 2000
		waitFor(t, ctx, fmt.Sprintf("2000 acks before kill %d", k+1), func() bool { return ackedCount() >= target })
		proc.Kill()
		t.Logf("kill %d: SIGKILL after %d acks", k+1, ackedCount())
		proc.Restart()
	}
	target := ackedCount() + 2000
	waitFor(t, ctx, "acks after the last restart", func() bool { return ackedCount() >= target })
	close(stop)
	producing.Wait()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	p.Close()

	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d records failed (first: %v); a retrying idempotent producer must deliver all", len(failures), failures[0])
	}
	if len(acked) != produced {
		t.Fatalf("%d records produced, %d acked", produced, len(acked))
	}

	// Read every range back in full and check it against the acks.
	lc := regionClients(t, []*nodeproc.Proc{proc})[proc.Addr]
	total := 0
	for rng := uint32(0); rng < 4; rng++ {
		log := readRange(t, ctx, lc, "crash", rng, 0)
		verifyLog(t, rng, log, acked)
		total += len(log)
	}
	if total != len(acked) {
		t.Fatalf("log holds %d records, %d were acked", total, len(acked))
	}
	t.Logf("%d kills, %d records acked and verified", kills, len(acked))
}

func waitReady(t *testing.T, ctx context.Context, c *client.Client) {
	t.Helper()
	waitFor(t, ctx, "node ready", func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.ListStreams(cctx)
		return err == nil
	})
}

// waitFor polls cond every 10 ms until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}
