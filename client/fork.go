package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/geolog/geolog/apierr"
)

// Forks seen by a subscription (DESIGN.md invariant 8, "Divergent tails";
// docs/reads-never-go-backwards.md). After an unplanned failover, records
// the old home acknowledged and served before it could know of the new
// home are not in the range's log: the new home continued at its own tail,
// and the old home's tail went to its orphan log. A subscription that
// delivered some of them must not carry on past them as if nothing
// happened (the log holds other records at those offsets now), nor
// deliver an offset below one it delivered. It ends with a *ForkError
// saying where the log and what it delivered part; the application reads
// again from there (and may reconcile with the orphan log).
//
// A subscription finds out from epochs, which identify records: one home
// per epoch, so a record is its (offset, epoch). It checks the record at
// its last delivered offset whenever it resubscribes (it resumes one
// record early and compares that record's epoch), and when a node answers
// that it serves less than the subscription's position (asking the home,
// with a linearizable read, for that record).

// ErrForked matches (errors.Is) the *ForkError that ends a subscription
// that delivered records the range's log no longer holds.
var ErrForked = errors.New("client: delivered records are not in the range's log (a failover forked it)")

// ForkError ends a subscription that delivered records the range's log no
// longer holds: from Offset on, the records it delivered (up to
// DeliveredEnd) were of a divergent tail, now in an orphan log; the log
// holds other records there. Read again from Offset. errors.Is(err,
// ErrForked) holds.
type ForkError struct {
	Stream string
	Range  uint32
	// Offset is the first delivered offset whose record the log does not
	// hold (exact when the home answered the search; lower, never higher,
	// when it could not).
	Offset uint64
	// DeliveredEnd is the offset after the last record delivered;
	// DeliveredEpoch that record's epoch, and LogEpoch the epoch of the
	// log's record there (0 if the log does not reach it).
	DeliveredEnd, DeliveredEpoch, LogEpoch uint64
}

func (e *ForkError) Error() string {
	return fmt.Sprintf("%s/%d: records delivered from offset %d to %d (epoch %d at %d) are not in the range's log (it holds epoch %d there): a failover forked it; read again from %d",
		e.Stream, e.Range, e.Offset, e.DeliveredEnd, e.DeliveredEpoch, e.DeliveredEnd-1, e.LogEpoch, e.Offset)
}

// Is makes errors.Is(err, ErrForked) hold.
func (e *ForkError) Is(target error) bool { return target == ErrForked }

// forkSearchTimeout bounds the home reads that locate a fork, and
// homeReadTimeout each of them.
const (
	forkSearchTimeout = 30 * time.Second
	homeReadTimeout   = 5 * time.Second
)

// errBelowStart: an offset below the range's retained start.
var errBelowStart = errors.New("client: offset below the range's retained start")

// logEpochAt reads the log's record at offset with a home read: its epoch,
// or present false when the log (as its home confirms it) does not reach
// offset. A hole at offset (compaction by key removed the record since)
// answers the epoch of the next record, with hole true (epoch 0: none).
func (s *subscription) logEpochAt(ctx context.Context, offset uint64) (epoch uint64, present, hole bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, homeReadTimeout)
	defer cancel()
	r, err := s.c.Read(ctx, s.stream, s.rng, offset, ReadOptions{MaxRecords: 1, Consistency: ConsistencyHome})
	var e *Error
	switch {
	case errors.As(err, &e) && e.Code == apierr.OffsetOutOfRange && offset < e.StartOffset:
		return 0, false, false, errBelowStart
	case errors.As(err, &e) && e.Code == apierr.OffsetOutOfRange && e.TailOffset <= offset:
		return 0, false, false, nil
	case err != nil:
		return 0, false, false, err
	case len(r.Records) == 0:
		return 0, r.TailOffset > offset, true, nil
	case r.Records[0].Offset != offset:
		return r.Records[0].Epoch, true, true, nil
	}
	return r.Records[0].Epoch, true, false, nil
}

// heldAt reports whether the log holds at offset what the subscription
// delivered there, or, for an offset it did not deliver, the timeline it
// delivered from (epoch at most lastEpoch). exact asks for the record's
// epoch to be lastEpoch. A hole is held when a later record is of the
// delivered timeline (epochs never decrease along a log), else not
// (re-reading is safe). logEpoch is the log's epoch there (0: unknown).
func (s *subscription) heldAt(ctx context.Context, offset uint64, exact bool) (held bool, logEpoch uint64, err error) {
	epoch, present, hole, err := s.logEpochAt(ctx, offset)
	switch {
	case err != nil || !present:
		return false, 0, err
	case hole:
		return epoch != 0 && epoch <= s.lastEpoch, 0, nil
	case exact:
		return epoch == s.lastEpoch, epoch, nil
	}
	return epoch <= s.lastEpoch, epoch, nil
}

// checkLast asks the home whether the last delivered record is in the
// log: nil if it is, a *ForkError if not, another error if it could not
// tell.
func (s *subscription) checkLast(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, forkSearchTimeout)
	defer cancel()
	held, epoch, err := s.heldAt(cctx, s.last, true)
	if err != nil {
		return err
	}
	if held {
		return nil
	}
	return s.forked(ctx, epoch)
}

// forked builds the *ForkError for a last delivered record that the log
// holds under logEpoch (0: not at all), locating the first delivered
// offset the log does not hold with home reads (forkPoint).
func (s *subscription) forked(ctx context.Context, logEpoch uint64) *ForkError {
	cctx, cancel := context.WithTimeout(ctx, forkSearchTimeout)
	defer cancel()
	return &ForkError{Stream: s.stream, Range: s.rng, Offset: s.forkPoint(cctx),
		DeliveredEnd: s.next, DeliveredEpoch: s.lastEpoch, LogEpoch: logEpoch}
}

// forkPoint is the first offset whose record, as the caller received it,
// the log does not hold: a bisection of [0, next) with home reads (about
// log2(next) of them). What the caller received comes from one copy's log
// (a resubscription, and StartAt.Epoch, check the record it resumes
// after), whose epochs never decrease; its divergent records were
// replaced by a newer epoch's, above the last epoch it received; below the
// fork the log holds what it received, of that epoch or older. So the
// log's record at an offset is of a newer epoch than lastEpoch, or
// missing, exactly from the fork on. Offsets below the log's retained
// start count as held. A home read that fails ends the search low
// (re-reading a few records is safe, skipping some is not).
func (s *subscription) forkPoint(ctx context.Context) uint64 {
	replaced := func(o uint64) (bool, error) {
		held, _, err := s.heldAt(ctx, o, false)
		if errors.Is(err, errBelowStart) {
			return false, nil
		}
		return !held, err
	}
	lo, hi := uint64(0), s.last // replaced(hi) holds
	for lo < hi {
		mid := lo + (hi-lo)/2
		r, err := replaced(mid)
		if err != nil {
			return lo
		}
		if r {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}
