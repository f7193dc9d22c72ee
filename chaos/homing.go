package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// The harness's side of homing (clusters with a lease store): where each
// range is homed now, planned rehomes, and the orphan logs.

// rangeHome is a range's home region and homing epoch.
type rangeHome struct {
	region string
	epoch  uint64
}

// currentHomes asks every node that answers (at most one per region is
// enough) for the stream's ranges and keeps, per range, the answer with
// the highest epoch: a node cut off from the lease store may still
// believe in an older home. Ranges nobody described keep "".
func currentHomes(ctx context.Context, conn func(string) (geologv1.LogClient, error), nodes []Node, stream string, ranges int) []rangeHome {
	out := make([]rangeHome, ranges)
	asked := map[string]bool{}
	for _, n := range nodes {
		if asked[n.Region] {
			continue
		}
		api, err := conn(n.Addr)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := api.DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
		cancel()
		if err != nil {
			continue
		}
		asked[n.Region] = true
		for _, ri := range resp.GetRanges() {
			r := int(ri.GetRange())
			if r < ranges && ri.GetHomeRegion() != "" && (out[r].region == "" || ri.GetEpoch() > out[r].epoch) {
				out[r] = rangeHome{ri.GetHomeRegion(), ri.GetEpoch()}
			}
		}
	}
	return out
}

func (in *injector) logClient(addr string) (geologv1.LogClient, error) {
	c, err := in.conn(addr)
	if err != nil {
		return nil, err
	}
	return geologv1.NewLogClient(c), nil
}

// homes is where each range is homed now: asked of the cluster when it
// runs homing, else the stream's homes as created (they never move).
func (in *injector) currentHomes(ctx context.Context) []rangeHome {
	out := make([]rangeHome, len(in.homes))
	if in.cl.Caps().LeaseTTL > 0 {
		out = currentHomes(ctx, in.logClient, in.cl.Nodes(), in.stream, len(in.homes))
	}
	for r := range out {
		if out[r].region == "" {
			out[r].region = in.homes[r]
		}
	}
	return out
}

// homeEpochs returns the ranges homed in region now, with their epochs.
func (in *injector) homeEpochs(ctx context.Context, regions []string) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for r, h := range in.currentHomes(ctx) {
		if slices.Contains(regions, h.region) {
			out[uint32(r)] = h.epoch
		}
	}
	return out
}

// rehome moves range rng (every range with all) to region through the
// Admin Rehome RPC of the target region's nodes (the first that answers)
// and returns the pause each range reported.
func (in *injector) rehome(ctx context.Context, rng uint32, all bool, region string, mark func()) ([]Duration, error) {
	req := &geologv1.RehomeRequest{Stream: in.stream, AllRanges: all, Region: region}
	if !all {
		req.Ranges = []uint32{rng}
	}
	mark()
	var errs []error
	for _, n := range regionNodes(in.cl, region) {
		c, err := in.conn(n.Addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := geologv1.NewAdminClient(c).Rehome(cctx, req)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.NodeRef, err))
			continue
		}
		var pauses []Duration
		var failed []error
		for _, r := range resp.GetRanges() {
			switch r.GetStatus() {
			case "moved":
				pauses = append(pauses, D(time.Duration(r.GetPauseMicros())*time.Microsecond))
			case "already home":
			default:
				failed = append(failed, fmt.Errorf("range %d to %s: %s", r.GetRange(), region, r.GetStatus()))
			}
		}
		return pauses, errors.Join(failed...)
	}
	return nil, fmt.Errorf("chaos: rehome to %s: %w", region, errors.Join(errs...))
}

// readOrphans reads the stream's orphan logs on every node (Admin
// ListOrphans, ReadOrphans); the errors name the nodes that did not answer.
func (in *injector) readOrphans(ctx context.Context) ([]OrphanRecord, []string) {
	var out []OrphanRecord
	var errs []string
	for _, n := range in.cl.Nodes() {
		recs, err := in.nodeOrphans(ctx, n)
		if err != nil {
			errs = append(errs, fmt.Sprintf("orphans of %s: %v", n.NodeRef, err))
			continue
		}
		out = append(out, recs...)
	}
	return out, errs
}

func (in *injector) nodeOrphans(ctx context.Context, n Node) ([]OrphanRecord, error) {
	c, err := in.conn(n.Addr)
	if err != nil {
		return nil, err
	}
	admin := geologv1.NewAdminClient(c)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	forks, err := admin.ListOrphans(cctx, &geologv1.ListOrphansRequest{Stream: in.stream})
	if err != nil {
		return nil, err
	}
	var out []OrphanRecord
	for _, f := range forks.GetForks() {
		for from := f.GetFirstOffset(); from < f.GetNextOffset(); {
			res, err := admin.ReadOrphans(cctx, &geologv1.ReadOrphansRequest{Stream: in.stream, Range: f.GetRange(), ForkIndex: f.GetForkIndex(), FromOffset: from})
			if err != nil {
				return nil, err
			}
			for _, r := range res.GetRecords() {
				out = append(out, OrphanRecord{Node: n.NodeRef.String(), Range: f.GetRange(), ForkIndex: f.GetForkIndex(), ForkOffset: f.GetForkOffset(),
					Offset: r.GetOffset(), Epoch: r.GetEpoch(), Key: string(r.GetKey()), Value: string(r.GetValue())})
			}
			if res.GetNextOffset() <= from {
				return nil, fmt.Errorf("range %d fork %d: no progress at offset %d", f.GetRange(), f.GetForkIndex(), from)
			}
			from = res.GetNextOffset()
		}
	}
	return out, nil
}
