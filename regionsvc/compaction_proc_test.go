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

// readAll reads a whole range through the SDK from the given client's
// nodes, following next offsets over holes: "offset:key=value" per record
// (a tombstone's value "~"), and the records themselves.
func readAll(ctx context.Context, c *client.Client, stream string) ([]string, []client.StoredRecord, error) {
	var texts []string
	var all []client.StoredRecord
	for from := uint64(0); ; {
		res, err := c.Read(ctx, stream, 0, from, client.ReadOptions{MaxRecords: 50})
		if err != nil {
			return nil, nil, err
		}
		for _, r := range res.Records {
			v := string(r.Value)
			if r.Tombstone {
				v = "~"
			}
			texts = append(texts, fmt.Sprintf("%d:%s=%s", r.Offset, r.Key, v))
			all = append(all, r)
		}
		if res.NextOffset >= res.TailOffset || res.NextOffset <= from {
			return texts, all, nil
		}
		from = res.NextOffset
	}
}

// TestCompactedStreamRealProcesses: two regions of one geologd process
// each, a compacted stream homed in us and mirrored in eu. Records are
// produced in us while eu's process is killed (SIGKILL) and restarted in
// the middle; once compaction ran, reading the range end to end through
// the API in us and in eu gives the same records at the same offsets (the
// newest of each key, tombstones gone), field for field.
func TestCompactedStreamRealProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	us, eu := nodeproc.FreeAddr(t), nodeproc.FreeAddr(t)
	flags := []string{"--node-id", "1", "--segment-bytes-max", "4096", "--maintenance-interval", "50ms", "--compaction-interval", "100ms"}
	nodeproc.Start(t, t.TempDir(), us, append(flags, "--region", "us", "--peers", "1="+us, "--region-addrs", "eu="+eu)...)
	pEU := nodeproc.Start(t, t.TempDir(), eu, append(flags, "--region", "eu", "--peers", "1="+eu, "--region-addrs", "us="+us)...)
	cUS, err := client.New(us)
	if err != nil {
		t.Fatal(err)
	}
	defer cUS.Close()
	cEU, err := client.New(eu)
	if err != nil {
		t.Fatal(err)
	}
	defer cEU.Close()
	waitFor(t, ctx, "the stream created in both regions", func() bool {
		_, err := cUS.CreateStream(ctx, client.StreamConfig{Name: "kv", RangeCount: 1, Regions: []string{"us", "eu"}, HomeRegion: "us",
			Cleanup: client.CleanupCompact, DeleteRetention: -1, MinCompactionLag: -1})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	p, err := cUS.NewProducer("kv")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var mu sync.Mutex
	latest := map[string]string{}
	offsets := map[string]uint64{}
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			key := fmt.Sprintf("k%d", i%19)
			rec := &client.Record{Key: []byte(key), Value: []byte(fmt.Sprintf("%s@%d", key, i)), Tombstone: i%13 == 12}
			if rec.Tombstone {
				rec.Value = nil
			}
			p.Produce(ctx, rec, func(res client.ProduceResult, err error) {
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if off, ok := offsets[key]; !ok || res.Offset > off {
					offsets[key], latest[key] = res.Offset, string(rec.Value)
					if rec.Tombstone {
						latest[key] = "~"
					}
				}
			})
			if i%20 == 0 {
				if err := p.Flush(ctx); err != nil { // batches of about 20 records
					t.Fatal(err)
				}
			}
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	produce(0, 300)
	pEU.Kill()
	produce(300, 500)
	pEU.Restart()
	produce(500, 600)
	want := strings.Join(latestOf(offsets, latest), " ")
	for name, c := range map[string]*client.Client{"us": cUS, "eu": cEU} {
		waitFor(t, ctx, name+" to hold the compacted range", func() bool {
			got, _, err := readAll(ctx, c, "kv")
			return err == nil && strings.Join(got, " ") == want
		})
	}
	_, a, err := readAll(ctx, cUS, "kv")
	if err != nil {
		t.Fatal(err)
	}
	_, b, err := readAll(ctx, cEU, "kv")
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("us holds %d records, eu %d", len(a), len(b))
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Offset != y.Offset || string(x.Key) != string(y.Key) || string(x.Value) != string(y.Value) || x.Tombstone != y.Tombstone ||
			x.Epoch != y.Epoch || !x.AppendTime.Equal(y.AppendTime) || !x.ProducerTime.Equal(y.ProducerTime) {
			t.Fatalf("record %d differs: us %+v, eu %+v", i, x, y)
		}
	}
	t.Logf("%d records of 600 kept, identical in both regions", len(a))
}

// latestOf is the newest record of each key, tombstones gone, in offset
// order, as "offset:key=value".
func latestOf(offsets map[string]uint64, values map[string]string) []string {
	type kv struct {
		off  uint64
		text string
	}
	var all []kv
	for k, off := range offsets {
		if values[k] != "~" {
			all = append(all, kv{off, fmt.Sprintf("%d:%s=%s", off, k, values[k])})
		}
	}
	for i := 1; i < len(all); i++ {
		for j := i; j > 0 && all[j].off < all[j-1].off; j-- {
			all[j], all[j-1] = all[j-1], all[j]
		}
	}
	out := make([]string, len(all))
	for i, e := range all {
		out[i] = e.text
	}
	return out
}
