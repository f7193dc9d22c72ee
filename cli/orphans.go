package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/geolog/geolog/client"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

const orphansUsage = `usage:
  orphans list <stream> [--json]
      the forks of the stream's ranges (after failovers): where each log
      forked and how many acked-but-unreplicated records its orphan log holds.
      Ask nodes of every region (--addr $GEOLOG_ADDR_ALL): a fork is kept by
      the region whose log it cut.
  orphans republish <stream> [--range N] [--fork INDEX] [--dry-run]
      append orphaned records again, in their original order, to the stream's
      current home, each with a geolog-orphan header naming where it came
      from. Idempotent: a rerun is recognised and appends nothing twice.`

// orphanHeader marks a republished record with its origin.
const orphanHeader = "geolog-orphan"

type orphanFork struct {
	*geologv1.OrphanFork
	addr string // a node that holds it
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
	// Every node's view: forks are per region (each replica of the region
	// holds the same ones).
	found := map[[2]uint64]*orphanFork{}
	var lastErr error
	for _, addr := range a.addrs {
		ac, err := a.conn(addr)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, e.timeout)
		resp, err := ac.ListOrphans(cctx, &geologv1.ListOrphansRequest{Stream: stream})
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		for _, f := range resp.GetForks() {
			k := [2]uint64{uint64(f.GetRange()), f.GetForkIndex()}
			if _, ok := found[k]; !ok {
				found[k] = &orphanFork{OrphanFork: f, addr: addr}
			}
		}
	}
	if len(found) == 0 && lastErr != nil {
		return lastErr
	}
	forks := make([]*orphanFork, 0, len(found))
	for _, f := range found {
		forks = append(forks, f)
	}
	sort.Slice(forks, func(i, j int) bool {
		if forks[i].GetRange() != forks[j].GetRange() {
			return forks[i].GetRange() < forks[j].GetRange()
		}
		return forks[i].GetForkIndex() < forks[j].GetForkIndex()
	})
	if sub == "list" {
		if *asJSON {
			out := make([]*geologv1.OrphanFork, len(forks))
			for i, f := range forks {
				out[i] = f.OrphanFork
			}
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RANGE\tFORK\tFORK OFFSET\tNEW EPOCH\tRECORDS\tORPHANED OFFSETS\tBYTES\tNODE")
		total := uint64(0)
		for _, f := range forks {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t[%d, %d)\t%d\t%s\n", f.GetRange(), f.GetForkIndex(), f.GetForkOffset(), f.GetEpoch(),
				f.GetRecords(), f.GetFirstOffset(), f.GetNextOffset(), f.GetBytes(), f.addr)
			total += f.GetRecords()
		}
		tw.Flush()
		fmt.Fprintf(e.stdout, "%d forks, %d orphaned records\n", len(forks), total)
		return nil
	}

	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	var mu sync.Mutex // the produce callbacks run on the producer's goroutines
	republished, dups := 0, 0
	for _, f := range forks {
		if (*rng >= 0 && int(f.GetRange()) != *rng) || (*forkIdx != 0 && f.GetForkIndex() != *forkIdx) {
			continue
		}
		// One producer per fork, its id derived from the fork: a rerun
		// sends the same (producer, sequence) pairs, which the home
		// recognises as duplicates.
		h := fnv.New64a()
		fmt.Fprintf(h, "orphans/%s/%d/%d/%d", stream, f.GetRange(), f.GetForkIndex(), f.GetEpoch())
		pid := h.Sum64()&(1<<62-1) | 1
		var p *client.Producer
		if !*dry {
			if p, err = c.NewProducer(stream, client.ProducerID(pid), client.DeliveryTimeout(2*time.Minute)); err != nil {
				return err
			}
		}
		ac, err := a.conn(f.addr)
		if err != nil {
			return err
		}
		var perr error
		for from := f.GetFirstOffset(); from < f.GetNextOffset(); {
			cctx, cancel := context.WithTimeout(ctx, e.timeout)
			res, err := ac.ReadOrphans(cctx, &geologv1.ReadOrphansRequest{Stream: stream, Range: f.GetRange(), ForkIndex: f.GetForkIndex(), FromOffset: from})
			cancel()
			if err != nil {
				return err
			}
			for _, r := range res.GetRecords() {
				origin := fmt.Sprintf("range=%d offset=%d epoch=%d fork=%d", f.GetRange(), r.GetOffset(), r.GetEpoch(), f.GetForkIndex())
				if *dry {
					fmt.Fprintf(e.stdout, "%s\t%q\t%q\n", origin, r.GetKey(), r.GetValue())
					continue
				}
				rec := &client.Record{Key: r.GetKey(), Value: r.GetValue(), Headers: []client.Header{{Key: orphanHeader, Value: []byte(origin)}}}
				for _, hd := range r.GetHeaders() {
					rec.Headers = append(rec.Headers, client.Header{Key: hd.GetKey(), Value: hd.GetValue()})
				}
				if pt := r.GetProducerTimeUnixNanos(); pt != 0 {
					rec.ProducerTime = time.Unix(0, pt)
				}
				p.Produce(ctx, rec, func(res client.ProduceResult, err error) {
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						if perr == nil {
							perr = err
						}
					case res.Duplicate:
						dups++
					default:
						republished++
					}
				})
			}
			if res.GetNextOffset() <= from {
				break
			}
			from = res.GetNextOffset()
		}
		if p != nil {
			if err := p.Flush(ctx); err != nil {
				mu.Lock()
				perr = cmp.Or(perr, err)
				mu.Unlock()
			}
			p.Close()
		}
		mu.Lock()
		err = perr
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("republish range %d fork %d: %w", f.GetRange(), f.GetForkIndex(), err)
		}
	}
	if !*dry {
		fmt.Fprintf(e.stdout, "republished %d records (%d already republished before)\n", republished, dups)
	}
	return nil
}

