package cli

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

const rangesSplitUsage = `usage: ranges split --stream S --range R [--at HASH]
      split range R of stream S at hash boundary HASH (decimal or 0x hex;
      default: the range's midpoint) into two children (docs/split.md):
      the range's log ends at its split offset, its keys' later records go
      to the child owning their hash. Ask a node of the range's home
      region. SPLIT_IN_PROGRESS: another split of the stream is under way;
      RANGE_SPLIT: the range split already`

// splitAttemptsMax bounds the nodes and retries one split is asked of.
const splitAttemptsMax = 10

// rangesSplit runs `ranges split` (Admin.SplitRange).
func (e *env) rangesSplit(ctx context.Context, args []string) error {
	fs := e.flagSet("ranges split")
	stream := fs.String("stream", "", "the stream")
	rng := fs.Int64("range", -1, "the range to split")
	atText := fs.String("at", "0", "the hash boundary (0: the range's midpoint)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *stream == "" || *rng < 0 || *rng > int64(^uint32(0)) {
		return usagef("%s", rangesSplitUsage)
	}
	at, err := strconv.ParseUint(*atText, 0, 64)
	if err != nil {
		return usagef("--at %q is not a hash (a number, decimal or 0x hex)", *atText)
	}
	a, err := e.adminDialer()
	if err != nil {
		return err
	}
	defer a.close()
	req := &geologv1.SplitRangeRequest{Stream: *stream, Range: uint32(*rng), At: at}
	resp, err := e.splitRange(ctx, a, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "stream %s range %d split at offset %d (hash boundary %#x, epoch %d): children %d and %d, range map version %d\n",
		*stream, req.Range, resp.GetSplitOffset(), resp.GetAt(), resp.GetEpoch(), resp.GetLeft(), resp.GetRight(), resp.GetRangeMapVersion())
	return nil
}

// splitRange asks the nodes in turn, following leader hints, and retries
// what is retriable except SPLIT_IN_PROGRESS and RANGE_SPLIT: those are
// the answer (another split holds the stream; the range split already).
func (e *env) splitRange(ctx context.Context, a *adminDialer, req *geologv1.SplitRangeRequest) (*geologv1.SplitRangeResponse, error) {
	hint := ""
	var last error
	for attempt := 0; attempt < splitAttemptsMax; attempt++ {
		addr := hint
		if addr == "" {
			addr = a.addrs[attempt%len(a.addrs)]
		}
		c, err := a.conn(addr)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, e.timeout)
		resp, err := c.SplitRange(cctx, req)
		cancel()
		if err == nil {
			return resp, nil
		}
		ae := rpcerr.FromError(err)
		if !ae.Retriable || ae.Code == apierr.SplitInProgress || ae.Code == apierr.RangeSplit {
			return nil, ae
		}
		last, hint = ae, ae.LeaderHint
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return nil, last
}
