package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// splitAttemptsMax bounds the calls one split fault makes (nodes of the
// home region in turn, leader hints followed, retriable errors retried).
const splitAttemptsMax = 20

// splitWaitMax bounds one split fault, past the fault window if need be.
const splitWaitMax = time.Minute

// split splits range rng at its midpoint (Admin SplitRange), asking the
// nodes of its home region in turn and following leader hints, as
// `geolog ranges split` does; it returns what it did.
func (in *injector) split(ctx context.Context, rng uint32, mark func()) (string, error) {
	// A child of a split is homed where its parent is; the split
	// scenarios home every range in one region, the first range's.
	home, err := in.region(ctx, "home", min(rng, uint32(len(in.homes)-1)))
	if err != nil {
		return "", err
	}
	// A split asked for is seen through even when the fault window closes
	// meanwhile: an abandoned attempt may still take effect, and the
	// fault's event should say so.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), splitWaitMax)
	defer cancel()
	nodes := regionNodes(in.cl, home)
	req := &geologv1.SplitRangeRequest{Stream: in.stream, Range: rng}
	mark()
	var errs []error
	hint := ""
	for attempt := range splitAttemptsMax {
		n := nodes[attempt%len(nodes)]
		for _, m := range nodes {
			if hint != "" && (m.ClientAddr == hint || m.Addr == hint) {
				n = m
			}
		}
		c, err := in.conn(n.Addr)
		if err != nil {
			return "", err
		}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		resp, err := geologv1.NewAdminClient(c).SplitRange(cctx, req)
		cancel()
		if err == nil {
			return fmt.Sprintf("split r%d at offset %d (hash %#x): children %d and %d, map version %d", rng,
				resp.GetSplitOffset(), resp.GetAt(), resp.GetLeft(), resp.GetRight(), resp.GetRangeMapVersion()), nil
		}
		ae := rpcerr.FromError(err)
		errs = append(errs, fmt.Errorf("%s: %w", n.NodeRef, ae))
		if ae.Code == apierr.RangeSplit && attempt > 0 {
			// An earlier attempt whose answer was lost (a timeout) took
			// effect.
			return fmt.Sprintf("split r%d (an attempt without answer took effect: %v)", rng, errors.Join(errs...)), nil
		}
		// SPLIT_IN_PROGRESS: the stream's previous split is still being
		// recorded (its catalogue record, its claim); it passes.
		if !ae.Retriable && ae.Code != apierr.SplitInProgress {
			break
		}
		hint = ae.LeaderHint
		if !sleepUntil(ctx, time.Now().Add(min(time.Duration(attempt+1)*200*time.Millisecond, 2*time.Second))) {
			break
		}
	}
	return "", fmt.Errorf("chaos: split r%d: %w", rng, errors.Join(errs...))
}
