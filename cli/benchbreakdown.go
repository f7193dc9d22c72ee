package cli

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/geolog/geolog/client"
)

// geolog bench --breakdown: where each record's time went, from the
// producer's Produce to its ack, in the order it was spent:
//
//	producer wait  Produce → its batch's last send (the producer's queue,
//	               and earlier attempts if the batch was resent)
//	network        the round trip less the leader's stages: the network
//	               and gRPC, both ways
//	admission, queue, leader write, quorum, ack
//	               the range leader's stages (AppendResponse.timing;
//	               docs/operations.md, "Where an append's time goes")
//	other          the rest of the end-to-end time: waiting for earlier
//	               batches' acks (callbacks run in offset order), the
//	               callback's dispatch, and with --rate the time a record
//	               was behind its schedule
//
// Each is a distribution over records; percentiles of the stages do not
// add up to the end-to-end percentile (the slowest records are not slow
// in every stage), but their means do.

// benchStageNames are the stages in the order a record spends them.
var benchStageNames = []string{"producer wait", "network", "admission", "queue", "leader write", "quorum", "ack", "other", "end to end"}

// benchStages holds one histogram per stage, in microseconds.
type benchStages struct {
	mu    sync.Mutex
	hists []*hdrhistogram.Histogram
	// missing counts acks without the leader's timing (duplicates, or a
	// leader that does not time appends).
	missing int64
}

func newBenchStages() *benchStages {
	s := &benchStages{hists: make([]*hdrhistogram.Histogram, len(benchStageNames))}
	for i := range s.hists {
		s.hists[i] = hdrhistogram.New(0, benchLatencyMaxMicros, 3)
	}
	return s
}

// record adds one acknowledged record: took end to end, t its timing.
// A nil s records nothing.
func (s *benchStages) record(took time.Duration, t *client.Timing) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t == nil || t.Leader() == 0 {
		s.missing++
		return
	}
	other := took - t.Waited - t.RoundTrip
	for i, d := range []time.Duration{t.Waited, t.Network(), t.Admission, t.Queue, t.LeaderWrite, t.Quorum, t.Ack, other, took} {
		_ = s.hists[i].RecordValue(min(max(d.Microseconds(), 0), benchLatencyMaxMicros))
	}
}

// StageSummary is one stage of a bench's breakdown, in milliseconds over
// the records that carried a timing.
type StageSummary struct {
	Stage   string  `json:"stage"`
	Records int64   `json:"records"`
	Mean    float64 `json:"mean"`
	P50     float64 `json:"p50"`
	P90     float64 `json:"p90"`
	P99     float64 `json:"p99"`
	Max     float64 `json:"max"`
}

// summaries is the breakdown and the records without a timing; nil for
// a nil s.
func (s *benchStages) summaries() ([]StageSummary, int64) {
	if s == nil {
		return nil, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ms := func(us int64) float64 { return float64(us) / 1000 }
	out := make([]StageSummary, len(benchStageNames))
	for i, h := range s.hists {
		out[i] = StageSummary{Stage: benchStageNames[i], Records: h.TotalCount(), Mean: h.Mean() / 1000,
			P50: ms(h.ValueAtQuantile(50)), P90: ms(h.ValueAtQuantile(90)), P99: ms(h.ValueAtQuantile(99)), Max: ms(h.Max())}
	}
	return out, s.missing
}

// printBreakdown prints the breakdown as a table (nothing if empty).
func printBreakdown(w io.Writer, stages []StageSummary, untimed int64) {
	if len(stages) == 0 {
		return
	}
	fmt.Fprintf(w, "breakdown   per record, ms (%d records timed by their leader, %d not: duplicates)\n", stages[0].Records, untimed)
	fmt.Fprintf(w, "  %-14s %9s %9s %9s %9s %9s\n", "stage", "mean", "p50", "p90", "p99", "max")
	for _, s := range stages {
		fmt.Fprintf(w, "  %-14s %9.3f %9.3f %9.3f %9.3f %9.3f\n", s.Stage, s.Mean, s.P50, s.P90, s.P99, s.Max)
	}
}
