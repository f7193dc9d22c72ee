package regionsvc

import (
	"context"
	"sync"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Where an append's time goes on its range leader (docs/operations.md,
// "Where an append's time goes"). Each stage runs from the end of the one
// before:
//
//	admission     the request decoded → validated, admitted by quotas and
//	              budgets, encoded as a batch (appendAsync → submit)
//	queue         the range's inbox → the driver proposes it
//	leader_write  the proposal → the leader's log write and fdatasync that
//	              made it durable (a group commit of whatever was queued)
//	quorum        the leader's write → the commit: what the followers' write,
//	              fdatasync and the network to them add beyond it
//	ack           the commit → the reply (apply, the lease check at the ack)
//
// Each is a series of geolog.append.stage_duration (attribute stage);
// geolog.segment.fsync_duration's role attribute tells a leader's write
// rounds from a follower's (its write and fdatasync of what the leader
// sent). A request with want_timing gets its stages in the reply
// (AppendResponse.timing), which is how `geolog bench --breakdown` puts
// the client's queue and the network beside them; a traced append carries
// them as attributes of its geolog.append span.

// appendStages is one append's time per stage.
type appendStages struct {
	admission, queue, leaderWrite, quorum, ack time.Duration
}

// stagesOf computes an append's stages from its timestamps: received by
// the handler, queued at the range, proposed, durable in the leader's log
// (zero if not known at the commit: the followers were faster, or the
// write is older than the driver remembers), committed, and answered.
func stagesOf(received, queued, proposed, durable, committed, answered time.Time) appendStages {
	if durable.IsZero() || durable.After(committed) {
		durable = committed
	}
	if durable.Before(proposed) {
		durable = proposed
	}
	return appendStages{
		admission:   nonNegative(queued.Sub(received)),
		queue:       nonNegative(proposed.Sub(queued)),
		leaderWrite: nonNegative(durable.Sub(proposed)),
		quorum:      nonNegative(committed.Sub(durable)),
		ack:         nonNegative(answered.Sub(committed)),
	}
}

func nonNegative(d time.Duration) time.Duration { return max(d, 0) }

// timing is the stages as the reply carries them.
func (s appendStages) timing() *geologv1.AppendTiming {
	return &geologv1.AppendTiming{
		AdmissionNanos: uint64(s.admission), QueueNanos: uint64(s.queue), LeaderWriteNanos: uint64(s.leaderWrite),
		QuorumNanos: uint64(s.quorum), AckNanos: uint64(s.ack),
	}
}

// The stage attribute of geolog.append.stage_duration, one option each.
var (
	stageAdmission   = metric.WithAttributes(attribute.String("stage", "admission"))
	stageQueue       = metric.WithAttributes(attribute.String("stage", "queue"))
	stageLeaderWrite = metric.WithAttributes(attribute.String("stage", "leader_write"))
	stageQuorum      = metric.WithAttributes(attribute.String("stage", "quorum"))
	stageAck         = metric.WithAttributes(attribute.String("stage", "ack"))
	roleLeader       = metric.WithAttributes(attribute.String("role", "leader"))
	roleFollower     = metric.WithAttributes(attribute.String("role", "follower"))
)

// appendStagesDone records an answered append's stages.
func (m *nodeMetrics) appendStagesDone(s appendStages) {
	ctx := context.Background()
	m.stageSeconds.Record(ctx, s.admission.Seconds(), stageAdmission)
	m.stageSeconds.Record(ctx, s.queue.Seconds(), stageQueue)
	m.stageSeconds.Record(ctx, s.leaderWrite.Seconds(), stageLeaderWrite)
	m.stageSeconds.Record(ctx, s.quorum.Seconds(), stageQuorum)
	m.stageSeconds.Record(ctx, s.ack.Seconds(), stageAck)
}

// durableMarksMax is how many of its log writes a range driver remembers
// (the leader_write stage of the appends they covered).
const durableMarksMax = 64

// durableLog remembers when the range's log became durable up to which
// offset, for the last durableMarksMax writes: the log writer adds, the
// driver looks up an append's end at its commit.
type durableLog struct {
	mu    sync.Mutex
	marks [durableMarksMax]durableMark
	n     int // marks held (≤ durableMarksMax)
	next  int // where the next mark goes
	// dropped is set once a mark was overwritten: a lookup below the
	// oldest mark held is then unknown, not that mark's.
	dropped bool
}

type durableMark struct {
	end uint64
	at  time.Time
}

// add records that the log was durable up to end at at. A log cut back
// (a truncation) forgets what was before.
func (l *durableLog) add(end uint64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 && end < l.marks[(l.next+durableMarksMax-1)%durableMarksMax].end {
		l.n, l.next, l.dropped = 0, 0, false
	}
	if l.n == durableMarksMax {
		l.dropped = true
	} else {
		l.n++
	}
	l.marks[l.next] = durableMark{end: end, at: at}
	l.next = (l.next + 1) % durableMarksMax
}

// durableAt is when the log first was durable up to end, or zero if it is
// not yet, or not known. It scans from the newest write back: an append is
// looked up at its commit, which comes soon after the write that covered
// it, so the scan is short.
func (l *durableLog) durableAt(end uint64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var at time.Time
	newest := l.next + durableMarksMax - 1
	for i := 0; i < l.n; i++ {
		m := l.marks[(newest-i)%durableMarksMax]
		if m.end < end {
			return at // the write after this one covered end first
		}
		if i == l.n-1 && l.dropped {
			return time.Time{} // the write that covered end may be gone
		}
		at = m.at
	}
	return at
}
