package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/e2e"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/keyspace"
)

// The markers: secretMarker is in every sealed value and sealed header and
// must be found nowhere on any node; controlMarker is in one plaintext
// record per range, produced after the sealed ones, and must be found on
// every node (which shows that the search sees the records, and that the
// node holds everything before it).
const (
	secretMarker  = "E2E-SECRET-7f3a9c"
	controlMarker = "E2E-CONTROL-RANGE-"
)

// geoCluster is three regions of nodesPerRegion geologd processes each,
// every node reaching the other regions' nodes directly.
type geoCluster struct {
	regions []string
	procs   map[string][]*nodeproc.Proc
	dirs    map[string][]string
}

const nodesPerRegion = 3

func startGeoCluster(t *testing.T, regions []string) *geoCluster {
	g := &geoCluster{regions: regions, procs: map[string][]*nodeproc.Proc{}, dirs: map[string][]string{}}
	addrs := map[string][]string{}
	for _, r := range regions {
		for range nodesPerRegion {
			addrs[r] = append(addrs[r], nodeproc.FreeAddr(t))
			g.dirs[r] = append(g.dirs[r], t.TempDir())
		}
	}
	for _, r := range regions {
		var peers []string
		for i, a := range addrs[r] {
			peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
		}
		for i, a := range addrs[r] {
			args := []string{"--region", r, "--node-id", fmt.Sprint(i + 1), "--peers", strings.Join(peers, ","),
				"--tick", "50ms", "--fsync", "never"}
			for _, other := range regions {
				if other != r {
					args = append(args, "--region-addrs", other+"="+strings.Join(addrs[other], ","))
				}
			}
			g.procs[r] = append(g.procs[r], nodeproc.Start(t, g.dirs[r][i], a, args...))
		}
	}
	return g
}

func (g *geoCluster) regionAddrs(region string) string {
	var out []string
	for _, p := range g.procs[region] {
		out = append(out, p.Addr)
	}
	return strings.Join(out, ",")
}

func (g *geoCluster) client(t *testing.T, addrs string) *client.Client {
	c, err := client.New(addrs, client.RetryBackoff(20*time.Millisecond, 500*time.Millisecond), client.RetriesMax(50))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// conversationsPerRange returns n record keys of each range.
func conversationsPerRange(rangeCount uint32, n int) [][]byte {
	var out [][]byte
	count := make([]int, rangeCount)
	for i := 0; len(out) < int(rangeCount)*n; i++ {
		k := []byte(fmt.Sprintf("room-%d", i))
		if r := keyspace.RangeForKey(k, rangeCount); count[r] < n {
			count[r]++
			out = append(out, k)
		}
	}
	return out
}

// TestMultiRegionStoresCiphertextOnly runs three regions of three real
// geologd processes, a stream with one range homed in each, and producers
// in every region sealing with SealWith. Then a consumer in each region,
// reading only its own region's nodes, opens every record to what was
// produced, while no file under any node's data directory (segments,
// indexes, catalogue, everything) nor any node's log holds the plaintext.
func TestMultiRegionStoresCiphertextOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("real-process multi-region test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	regions := []string{"us", "eu", "ap"}
	const rangeCount = 3
	g := startGeoCluster(t, regions)
	createStream(t, ctx, g, rangeCount)

	keys := e2e.NewKeyring()
	convs := conversationsPerRange(rangeCount, 2)
	for _, conv := range convs {
		k, err := e2e.NewKey(string(conv) + "/1")
		if err != nil {
			t.Fatal(err)
		}
		keys.Add("chat", conv, k)
	}
	produced := produceSealed(t, ctx, g, keys, convs)
	tails := produceControl(t, ctx, g, rangeCount)

	for _, region := range regions {
		c := g.client(t, g.regionAddrs(region))
		for rng := range uint32(rangeCount) {
			readRegion(t, ctx, c, region, rng, tails[rng], keys, produced)
		}
	}
	for _, region := range regions {
		for i, dir := range g.dirs[region] {
			node := fmt.Sprintf("%s node %d", region, i+1)
			waitFor(t, ctx, node+" holds every range's control record", func() bool {
				found := scanDir(t, dir, controlMarker)
				return len(found) == rangeCount
			})
			if found := scanDir(t, dir, secretMarker); len(found) > 0 {
				t.Errorf("%s: plaintext in %v", node, found)
			}
			if strings.Contains(g.procs[region][i].Output(), secretMarker) {
				t.Errorf("%s: plaintext in its log", node)
			}
		}
	}
}

func createStream(t *testing.T, ctx context.Context, g *geoCluster, rangeCount uint32) {
	c := g.client(t, g.regionAddrs(g.regions[0]))
	waitFor(t, ctx, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "chat", RangeCount: rangeCount, Regions: g.regions, HomeRegion: "spread"})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	for _, region := range g.regions {
		for _, p := range g.procs[region] {
			pc := g.client(t, p.Addr)
			waitFor(t, ctx, "stream known on "+p.Addr, func() bool {
				_, err := pc.DescribeStream(ctx, "chat")
				return err == nil
			})
		}
	}
}

type rangeOffset struct {
	rng    uint32
	offset uint64
}

// produceSealed produces, from a producer in each region, ten records to
// each conversation with a sealed header, and returns them by position.
func produceSealed(t *testing.T, ctx context.Context, g *geoCluster, keys *e2e.Keyring, convs [][]byte) map[rangeOffset]*client.Record {
	produced := map[rangeOffset]*client.Record{}
	for _, region := range g.regions {
		p, err := g.client(t, g.regionAddrs(region)).NewProducer("chat", client.SealWith(keys, "sender"))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var recs []*client.Record
		for _, conv := range convs {
			for i := range 10 {
				recs = append(recs, &client.Record{Key: conv,
					Value: []byte(fmt.Sprintf("%s message %d from %s to %s", secretMarker, i, region, conv)),
					Headers: []client.Header{{Key: "sender", Value: []byte(secretMarker + "-sender-" + region)},
						{Key: "client", Value: []byte("e2e-test")}}})
			}
		}
		res, err := p.ProduceSync(ctx, recs...)
		if err != nil {
			t.Fatalf("produce in %s: %v", region, err)
		}
		for _, r := range res {
			produced[rangeOffset{r.Range, r.Offset}] = r.Record
		}
	}
	return produced
}

// produceControl appends one plaintext record per range and returns each
// range's tail after it.
func produceControl(t *testing.T, ctx context.Context, g *geoCluster, rangeCount uint32) []uint64 {
	p, err := g.client(t, g.regionAddrs(g.regions[0])).NewProducer("chat")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tails := make([]uint64, rangeCount)
	for i, key := range conversationsPerRange(rangeCount, 1) {
		res, err := p.ProduceSync(ctx, &client.Record{Key: key, Value: []byte(fmt.Sprintf("%s%d", controlMarker, i))})
		if err != nil {
			t.Fatal(err)
		}
		tails[res[0].Range] = res[0].Offset + 1
	}
	return tails
}

// readRegion reads range rng up to tail from region's own nodes with
// OpenWith: every sealed record opens to what was produced, and the
// control record is reported unsealed.
func readRegion(t *testing.T, ctx context.Context, c *client.Client, region string, rng uint32, tail uint64, keys *e2e.Keyring, produced map[rangeOffset]*client.Record) {
	var unsealed []uint64
	skip := client.SkipUnopenable(func(rec client.StoredRecord, err error) {
		if !errors.Is(err, e2e.ErrNotSealed) || !bytes.HasPrefix(rec.Value, []byte(controlMarker)) {
			t.Errorf("%s range %d offset %d: %v", region, rng, rec.Offset, err)
		}
		unsealed = append(unsealed, rec.Offset)
	})
	opened := 0
	for next := uint64(0); next < tail; {
		res, err := c.Read(ctx, "chat", rng, next, client.ReadOptions{Consistency: client.ConsistencyMinOffset, MinOffset: tail},
			client.OpenWith(keys), skip)
		if err != nil {
			t.Fatalf("%s range %d at %d: %v", region, rng, next, err)
		}
		for _, rec := range res.Records {
			want := produced[rangeOffset{rng, rec.Offset}]
			if want == nil || !bytes.Equal(rec.Value, want.Value) || !bytes.Equal(rec.Key, want.Key) ||
				fmt.Sprint(rec.Headers) != fmt.Sprint(want.Headers) {
				t.Fatalf("%s range %d offset %d opened to %q %v, want %v", region, rng, rec.Offset, rec.Value, rec.Headers, want)
			}
			opened++
		}
		next = res.NextOffset
	}
	if opened != int(tail)-1 || fmt.Sprint(unsealed) != fmt.Sprint([]uint64{tail - 1}) {
		t.Fatalf("%s range %d: opened %d of %d, unsealed at %v", region, rng, opened, tail, unsealed)
	}
	t.Logf("%s range %d: %d records opened from the region's own copy", region, rng, opened)
}

// scanDir returns the files under dir that hold marker, and for
// controlMarker the distinct ranges whose control record was found.
func scanDir(t *testing.T, dir, marker string) []string {
	found := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking (a rolled temp file)
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for rest := b; ; {
			i := bytes.Index(rest, []byte(marker))
			if i < 0 {
				break
			}
			rest = rest[i+len(marker):]
			if marker == controlMarker && len(rest) > 0 {
				found[marker+string(rest[:1])] = true
			} else {
				found[path] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k := range found {
		out = append(out, k)
	}
	return out
}
