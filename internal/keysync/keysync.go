// Package keysync is the workload of the per-key sync figures (make
// bench-keysync): a chat range of many conversations whose records are
// spread evenly over the whole range, each conversation holding exactly
// Records/Conversations of them, and the percentiles the figures print.
// The benchmarks that use it are in package segment (the store alone) and
// package regionsvc (a node's Read RPC).
package keysync

import (
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/geolog/geolog/batch"
)

// spread is odd and not a multiple of 5, so that x -> x*spread mod N is a
// bijection of [0, N) for N of the form 2^a * 5^b (10 million, say).
const spread = 2654435761

// Workload describes the range to build.
type Workload struct {
	// Records is the number of records in the range.
	Records uint64
	// Conversations is the number of keys; Records must be a multiple of
	// it, and of the form 2^a * 5^b.
	Conversations uint64
	// ValueBytes is the size of each record's value (a chat message).
	ValueBytes int
	// BatchRecords is the number of records per batch (frame).
	BatchRecords int
}

// Check reports a workload whose conversations would not all have the same
// number of records.
func (w Workload) Check() error {
	n := w.Records
	for n%2 == 0 {
		n /= 2
	}
	for n%5 == 0 {
		n /= 5
	}
	if w.Records == 0 || n != 1 || w.Conversations == 0 || w.Records%w.Conversations != 0 || w.BatchRecords <= 0 {
		return fmt.Errorf("keysync: %d records in %d conversations, batches of %d: want 2^a*5^b records, a multiple of the conversations",
			w.Records, w.Conversations, w.BatchRecords)
	}
	return nil
}

// Conversation returns the conversation of the record at offset off: the
// records of one conversation are spread over the whole range.
func (w Workload) Conversation(off uint64) uint64 {
	return (off * spread % w.Records) % w.Conversations
}

// Key returns the key of conversation c.
func Key(c uint64) []byte { return fmt.Appendf(nil, "conv-%09d", c) }

// Batch returns the records at offsets [base, base+n).
func (w Workload) Batch(base uint64, n int) []batch.Record {
	recs := make([]batch.Record, n)
	for i := range recs {
		off := base + uint64(i)
		v := make([]byte, w.ValueBytes)
		copy(v, fmt.Appendf(nil, "message %d of the range; ", off))
		for j := range v {
			if v[j] == 0 {
				v[j] = 'a' + byte((off+uint64(j))%26)
			}
		}
		recs[i] = batch.Record{Key: Key(w.Conversation(off)), Value: v, ProducerTimeUnixNanos: int64(off)}
	}
	return recs
}

// Percentiles returns the p-th percentiles (0 < p <= 100) of ds, which it
// sorts.
func Percentiles(ds []time.Duration, ps ...float64) []time.Duration {
	slices.Sort(ds)
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		if len(ds) == 0 {
			continue
		}
		k := int(p/100*float64(len(ds))+0.5) - 1
		out[i] = ds[max(0, min(k, len(ds)-1))]
	}
	return out
}

// CPUTime returns the user and system CPU time this process has used, so
// that a benchmark can report the CPU an operation costs, which the load
// of a shared machine does not inflate as it does latency.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
