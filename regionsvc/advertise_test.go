package regionsvc

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"google.golang.org/grpc"
)

// advertisedWorld is a world whose nodes advertise, to clients, the
// address of a proxy in front of each ("client->us:n1"), not the address
// they listen at nor those their peers reach them at.
func advertisedWorld(t *testing.T, regions []string, size int) (*world, map[string]map[uint64]string) {
	adv := map[string]map[uint64]string{}
	w := newWorldWith(t, regions, size, 5*time.Millisecond, 0, func(w *world) {
		for i, r := range regions {
			adv[r] = map[uint64]string{}
			for id := uint64(1); id <= uint64(size); id++ {
				l, err := w.net.Add(wan.Config{Name: fmt.Sprintf("client->%s:n%d", r, id), From: "client", To: r,
					Upstream: w.addrs[r][id], Seed: uint64(500 + 10*i + int(id))})
				if err != nil {
					t.Fatal(err)
				}
				adv[r][id] = l.Addr()
			}
		}
	}, func(region string, id uint64, cfg *Config) {
		cfg.AdvertiseAddr = adv[region][id]
	})
	return w, adv
}

// strictDialer dials only the advertised addresses and records every
// other address a client tried.
type strictDialer struct {
	allowed map[string]bool
	mu      sync.Mutex
	refused []string
}

func (d *strictDialer) option() grpc.DialOption {
	var nd net.Dialer
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if !d.allowed[addr] {
			d.mu.Lock()
			d.refused = append(d.refused, addr)
			d.mu.Unlock()
			return nil, fmt.Errorf("test: %s is not an advertised address", addr)
		}
		return nd.DialContext(ctx, "tcp", addr)
	})
}

func (d *strictDialer) check(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.refused) > 0 {
		t.Fatalf("a client was sent to addresses that are not advertised: %v", d.refused)
	}
}

// TestHintsAreAdvertisedAddresses: in two regions of three nodes whose
// advertised addresses differ from their listen and peer addresses, a
// client that can dial only the advertised addresses, and starts from one
// region's, creates a stream homed in the other and produces to it: every
// NOT_HOME and NOT_LEADER hint it follows is an advertised address. The
// hints and leaders the nodes give (raw Append, DescribeStream) are all
// advertised addresses too.
func TestHintsAreAdvertisedAddresses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, adv := advertisedWorld(t, []string{"us", "eu"}, 3)
	dialer := &strictDialer{allowed: map[string]bool{}}
	var euAdv []string
	for r, ids := range adv {
		for id, a := range ids {
			dialer.allowed[a] = true
			if r == "eu" {
				euAdv = append(euAdv, a)
			}
			if a == w.addrs[r][id] {
				t.Fatalf("advertised and listen addresses must differ")
			}
		}
	}
	c, err := client.New(strings.Join(euAdv, ","), client.DialOptions(dialer.option()),
		client.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "adv", RangeCount: 3, Regions: []string{"us", "eu"}, HomeRegion: "us"}); err != nil {
		t.Fatal(err)
	}
	p, err := c.NewProducer("adv", client.DeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var recsOut []*client.Record
	for i := range 300 {
		recsOut = append(recsOut, &client.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprint(i))})
	}
	res, err := p.ProduceSync(ctx, recsOut...)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	ranges := map[uint32]bool{}
	for _, r := range res {
		ranges[r.Range] = true
	}
	if len(ranges) != 3 {
		t.Fatalf("records landed in ranges %v, want all 3", ranges)
	}
	dialer.check(t)

	usAdv := slices.Collect(mapValues(adv["us"]))
	for rng := uint32(0); rng < 3; rng++ {
		checkRangeHints(t, ctx, w, adv, usAdv, rng)
	}
}

// checkRangeHints asks the nodes directly (at their listen addresses) for
// the hints and leaders of one range, until they know them, and checks
// that each is an advertised address.
func checkRangeHints(t *testing.T, ctx context.Context, w *world, adv map[string]map[uint64]string, usAdv []string, rng uint32) {
	t.Helper()
	leader := uint64(0)
	waitUntil(t, ctx, 30*time.Second, "DescribeStream names advertised leaders", func() bool {
		for id, conn := range w.conns["us"] {
			d, err := conn.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "adv"})
			if err != nil {
				return false
			}
			ri := d.GetRanges()[rng]
			if ri.GetLeader() == "" || ri.GetHomeLeader() != ri.GetLeader() {
				return false // not known yet
			}
			if !slices.Contains(usAdv, ri.GetLeader()) {
				t.Fatalf("range %d: us names the leader %s, not an advertised address of us %v", rng, ri.GetLeader(), usAdv)
			}
			if ri.GetLeader() == adv["us"][id] {
				leader = id
			}
		}
		// In a mirror region only the mirror's leader hears the home's
		// heartbeats, which name the home leader.
		known := 0
		for _, conn := range w.conns["eu"] {
			d, err := conn.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "adv"})
			if err != nil {
				return false
			}
			if hl := d.GetRanges()[rng].GetHomeLeader(); hl != "" {
				if !slices.Contains(usAdv, hl) {
					t.Fatalf("range %d: eu names the home leader %s, not an advertised address of us %v", rng, hl, usAdv)
				}
				known++
			}
		}
		return leader != 0 && known > 0
	})
	for id, conn := range w.conns["us"] {
		if id == leader {
			continue
		}
		_, err := conn.Append(ctx, &geologv1.AppendRequest{Stream: "adv", Range: rng, Records: recs("x", 1)})
		if e := rpcerr.FromError(err); e.Code != apierr.NotLeader || e.LeaderHint != adv["us"][leader] {
			t.Fatalf("range %d: append to us follower n%d: %v, want NOT_LEADER naming %s", rng, id, err, adv["us"][leader])
		}
	}
	for id, conn := range w.conns["eu"] {
		_, err := conn.Append(ctx, &geologv1.AppendRequest{Stream: "adv", Range: rng, Records: recs("x", 1)})
		if e := rpcerr.FromError(err); e.Code != apierr.NotHome || !slices.Contains(usAdv, e.LeaderHint) {
			t.Fatalf("range %d: append to eu n%d: %v, want NOT_HOME naming one of %v", rng, id, err, usAdv)
		}
	}
}

func mapValues(m map[uint64]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}
