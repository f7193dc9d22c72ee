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

// epochRun is a run of delivered records of one epoch, from start.
type epochRun struct{ start, epoch uint64 }

// epochRunsMax bounds the runs a subscription remembers (epochs change
// rarely; past it the oldest are forgotten and a fork found before them
// is reported at the oldest remembered).
const epochRunsMax = 16

// forkSearchTimeout bounds the home reads that locate a fork, and
// homeReadTimeout each of them.
const (
	forkSearchTimeout = 30 * time.Second
	homeReadTimeout   = 5 * time.Second
)

// noteDelivered records the epoch of a record delivered at offset.
func (s *subscription) noteDelivered(offset, epoch uint64) {
	if n := len(s.runs); n > 0 && s.runs[n-1].epoch == epoch {
		return
	}
	if len(s.runs) == epochRunsMax {
		s.runs = append(s.runs[:0], s.runs[1:]...)
	}
	s.runs = append(s.runs, epochRun{start: offset, epoch: epoch})
}

// lastEpoch is the epoch of the last record delivered.
func (s *subscription) lastEpoch() uint64 { return s.runs[len(s.runs)-1].epoch }

// logEpochAt reads the log's record at offset with a home read: its epoch,
// or present false when the log (as its home confirms it) does not reach
// offset.
func (s *subscription) logEpochAt(ctx context.Context, offset uint64) (epoch uint64, present bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, homeReadTimeout)
	defer cancel()
	r, err := s.c.Read(ctx, s.stream, s.rng, offset, ReadOptions{MaxRecords: 1, Consistency: ConsistencyHome})
	var e *Error
	switch {
	case errors.As(err, &e) && e.Code == apierr.OffsetOutOfRange && e.TailOffset <= offset && offset >= e.StartOffset:
		return 0, false, nil
	case err != nil:
		return 0, false, err
	case len(r.Records) == 0 || r.Records[0].Offset != offset:
		return 0, false, nil
	}
	return r.Records[0].Epoch, true, nil
}

// checkLast asks the home whether the last delivered record is in the
// log: nil if it is, a *ForkError if not, another error if it could not
// tell.
func (s *subscription) checkLast(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, forkSearchTimeout)
	defer cancel()
	epoch, present, err := s.logEpochAt(cctx, s.next-1)
	if err != nil {
		return err
	}
	if present && epoch == s.lastEpoch() {
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
		DeliveredEnd: s.next, DeliveredEpoch: s.lastEpoch(), LogEpoch: logEpoch}
}

// forkPoint is the first delivered offset whose record the log does not
// hold. Epochs along a log never decrease, so within a run of delivered
// records of one epoch the log holds a prefix: the runs are checked from
// the newest back to the one whose first record the log holds, and that
// run is bisected. A home read that fails ends the search low: at the
// start of the run being searched (re-reading a few records is safe,
// skipping some is not).
func (s *subscription) forkPoint(ctx context.Context) uint64 {
	for i := len(s.runs) - 1; i >= 0; i-- {
		run := s.runs[i]
		end := s.next
		if i+1 < len(s.runs) {
			end = s.runs[i+1].start
		}
		holds := func(o uint64) (bool, error) {
			e, ok, err := s.logEpochAt(ctx, o)
			return ok && e == run.epoch, err
		}
		ok, err := holds(run.start)
		if err != nil {
			return run.start
		}
		if !ok {
			continue
		}
		// The log holds run.start and not end (or the next run's start).
		lo, hi := run.start+1, end
		for lo < hi {
			mid := lo + (hi-lo)/2
			ok, err := holds(mid)
			if err != nil {
				return run.start
			}
			if ok {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		return lo
	}
	return s.runs[0].start
}
