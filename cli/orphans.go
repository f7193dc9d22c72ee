package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"text/tabwriter"

	"github.com/geolog/geolog/client"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
)

const orphansUsage = `usage:
  orphans list <stream> [--json]
      the forks of the stream's ranges (after failovers), in every region:
      where each log forked and how many acked-but-unreplicated records its
      orphan log holds. One node (the first of --addr that answers) asks
      every node of the stream's regions; nodes that did not answer are
      named on stderr (forks only they hold are then missing).
  orphans republish <stream> [--range N] [--fork INDEX] [--dry-run]
      append orphaned records again, in their original order, to the stream's
      current home, each with a geolog-orphan header naming where it came
      from. Idempotent: a rerun is recognised and appends nothing twice.`

// orphanHeader marks a republished record with its origin.
const orphanHeader = "geolog-orphan"

// orphanFork is one fork and a node that holds it (the JSON of list).
type orphanFork struct {
	Region string `json:"region"`
	NodeID uint64 `json:"node_id"`
	// Addr is the node's advertised address: ReadOrphans go there.
	Addr string `json:"address"`
	*geologv1.OrphanFork
}

// orphans runs the orphan-log commands.
func (e *env) orphans(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("%s", orphansUsage)
	}
	sub, args := args[0], args[1:]
	fs := e.flagSet("orphans " + sub)
	asJSON := fs.Bool("json", false, "print as JSON (list)")
	rng := fs.Int("range", -1, "only this range (republish)")
	forkIdx := fs.Uint64("fork", 0, "only this fork index (republish)")
	dry := fs.Bool("dry-run", false, "print what would be republished, append nothing")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (sub != "list" && sub != "republish") {
		return usagef("%s", orphansUsage)
	}
	stream := pos[0]
	a, err := e.adminDialer()
	if err != nil {
		return err
	}
	defer a.close()
	forks, err := e.listOrphans(ctx, a, stream)
	if err != nil {
		return err
	}
	if sub == "list" {
		if *asJSON {
			if forks == nil {
				forks = []*orphanFork{}
			}
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(forks)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REGION\tRANGE\tFORK\tFORK OFFSET\tNEW EPOCH\tRECORDS\tORPHANED OFFSETS\tBYTES\tNODE")
		total := uint64(0)
		for _, f := range forks {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t[%d, %d)\t%d\tn%d %s\n", f.Region, f.GetRange(), f.GetForkIndex(), f.GetForkOffset(), f.GetEpoch(),
				f.GetRecords(), f.GetFirstOffset(), f.GetNextOffset(), f.GetBytes(), f.NodeID, f.Addr)
			total += f.GetRecords()
		}
		tw.Flush()
		fmt.Fprintf(e.stdout, "%d forks, %d orphaned records\n", len(forks), total)
		return nil
	}

	republished, dups := 0, 0
	for _, f := range forks {
		if (*rng >= 0 && int(f.GetRange()) != *rng) || (*forkIdx != 0 && f.GetForkIndex() != *forkIdx) {
			continue
		}
		// One producer per fork, its id derived from the fork, and one
		// append per orphaned batch, as the batch was: a rerun sends the
		// very same (producer, sequence) batches, which the home recognises
		// as duplicates (or, past its idempotence window, as appended
		// before).
		h := fnv.New64a()
		fmt.Fprintf(h, "orphans/%s/%d/%d/%d", stream, f.GetRange(), f.GetForkIndex(), f.GetEpoch())
		pid := h.Sum64()&(1<<62-1) | 1
		ac, err := a.conn(f.Addr)
		if err != nil {
			return err
		}
		seq := uint64(0)
		for from := f.GetFirstOffset(); from < f.GetNextOffset(); {
			cctx, cancel := context.WithTimeout(ctx, e.timeout)
			res, err := ac.ReadOrphans(cctx, &geologv1.ReadOrphansRequest{Stream: stream, Range: f.GetRange(), ForkIndex: f.GetForkIndex(), FromOffset: from})
			cancel()
			if err != nil {
				return err
			}
			// Group the records back into their original batches (same
			// epoch and append time, consecutive offsets).
			recs := res.GetRecords()
			for len(recs) > 0 {
				n := 1
				for n < len(recs) && recs[n].GetAppendTimeUnixNanos() == recs[0].GetAppendTimeUnixNanos() && recs[n].GetEpoch() == recs[0].GetEpoch() {
					n++
				}
				group := recs[:n]
				recs = recs[n:]
				if *dry {
					for _, r := range group {
						fmt.Fprintf(e.stdout, "range=%d offset=%d epoch=%d\t%q\t%q\n", f.GetRange(), r.GetOffset(), r.GetEpoch(), r.GetKey(), r.GetValue())
					}
					seq += uint64(n)
					continue
				}
				req := &geologv1.AppendRequest{Stream: stream, Range: f.GetRange(), ProducerId: pid, BaseSequence: seq}
				for _, r := range group {
					rec := &geologv1.Record{Key: r.GetKey(), Value: r.GetValue(), ProducerTimeUnixNanos: r.GetProducerTimeUnixNanos(), Tombstone: r.GetTombstone(),
						Headers: append([]*geologv1.Header{{Key: orphanHeader, Value: []byte(fmt.Sprintf("range=%d offset=%d epoch=%d fork=%d",
							f.GetRange(), r.GetOffset(), r.GetEpoch(), f.GetForkIndex()))}}, r.GetHeaders()...)}
					req.Records = append(req.Records, rec)
				}
				var resp *geologv1.AppendResponse
				err := a.callConn(ctx, e.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
					var err error
					resp, err = geologv1.NewLogClient(c).Append(ctx, req)
					return err
				})
				switch {
				case err == nil && resp.GetDuplicate():
					dups += n
				case err == nil:
					republished += n
				case client.CodeOf(err) == client.CodeDuplicateOutOfWindow:
					dups += n // appended by an earlier run, before the home's idempotence window
				default:
					return fmt.Errorf("republish range %d fork %d offset %d: %w", f.GetRange(), f.GetForkIndex(), group[0].GetOffset(), err)
				}
				seq += uint64(n)
			}
			if res.GetNextOffset() <= from {
				break
			}
			from = res.GetNextOffset()
		}
	}
	if !*dry {
		fmt.Fprintf(e.stdout, "republished %d records (%d already republished before)\n", republished, dups)
	}
	return nil
}

// listOrphans asks the first node of --addr that answers for the stream's
// forks in the whole cluster (ListOrphans, scope cluster), warns on stderr
// of the nodes that did not answer, and returns each fork with a node of
// its region that holds it, by region, range and fork.
func (e *env) listOrphans(ctx context.Context, a *adminDialer, stream string) ([]*orphanFork, error) {
	var resp *geologv1.ListOrphansResponse
	var lastErr error
	for _, addr := range a.addrs {
		ac, err := a.conn(addr)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, e.timeout)
		resp, err = ac.ListOrphans(cctx, &geologv1.ListOrphansRequest{Stream: stream, Scope: geologv1.OrphanScope_ORPHAN_SCOPE_CLUSTER})
		cancel()
		if err == nil {
			break
		}
		if lastErr = err; !client.IsRetriable(err) {
			return nil, err
		}
	}
	if resp == nil {
		return nil, lastErr
	}
	var forks []*orphanFork
	found := map[string]bool{}
	for _, no := range resp.GetNodes() {
		if no.GetError() != "" {
			fmt.Fprintf(e.stderr, "warning: %s node %d (%s) did not answer: %s; forks only it holds are missing\n", no.GetRegion(), no.GetNodeId(), no.GetAddress(), no.GetError())
			continue
		}
		for _, f := range no.GetForks() {
			k := fmt.Sprintf("%s/%d/%d", no.GetRegion(), f.GetRange(), f.GetForkIndex())
			if !found[k] {
				found[k] = true
				forks = append(forks, &orphanFork{Region: no.GetRegion(), NodeID: no.GetNodeId(), Addr: no.GetAddress(), OrphanFork: f})
			}
		}
	}
	sort.SliceStable(forks, func(i, j int) bool {
		fi, fj := forks[i], forks[j]
		if fi.Region != fj.Region {
			return fi.Region < fj.Region
		}
		if fi.GetRange() != fj.GetRange() {
			return fi.GetRange() < fj.GetRange()
		}
		return fi.GetForkIndex() < fj.GetForkIndex()
	})
	return forks, nil
}
