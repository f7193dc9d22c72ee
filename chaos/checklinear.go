package chaos

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/cespare/xxhash/v2"
)

// ChainHash extends the hash of a log's records [0, offset) with the
// record at offset: the hash of records [0, n) names that prefix, so a read
// of a whole range compares with the model's state in O(1).
func ChainHash(prev, offset, epoch uint64, value string) uint64 {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], prev)
	binary.LittleEndian.PutUint64(b[8:], offset)
	binary.LittleEndian.PutUint64(b[16:], epoch)
	d := xxhash.New()
	_, _ = d.Write(b[:])
	_, _ = d.WriteString(value)
	return d.Sum64()
}

// logState is the model of one range: its tail, the chained hash of its
// records and the newest epoch appended under.
type logState struct {
	tail, hash, epoch uint64
}

type linInput struct {
	read  bool
	value string // appends
}

type linOutput struct {
	offset, epoch uint64 // appends
	tail, hash    uint64 // reads
}

// rangeModel is the sequential specification of a range: an append lands
// at the tail, under an epoch no older than the newest before it; a home
// read returns the tail and the hash of everything below it.
var rangeModel = porcupine.Model{
	Init: func() any { return logState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(logState), input.(linInput), output.(linOutput)
		if in.read {
			return out.tail == s.tail && out.hash == s.hash, s
		}
		if out.offset != s.tail || out.epoch < s.epoch {
			return false, s
		}
		return true, logState{tail: s.tail + 1, hash: ChainHash(s.hash, out.offset, out.epoch, in.value), epoch: out.epoch}
	},
	Hash: func(state any) uint64 {
		s := state.(logState)
		return s.hash ^ s.tail*0x9e3779b97f4a7c15 ^ s.epoch
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		if in.read {
			return fmt.Sprintf("read -> tail %d hash %x", out.tail, out.hash)
		}
		return fmt.Sprintf("append %.24q -> @%d e%d", in.value, out.offset, out.epoch)
	},
	DescribeState: func(state any) string {
		s := state.(logState)
		return fmt.Sprintf("tail %d hash %x epoch %d", s.tail, s.hash, s.epoch)
	},
}

// LinearResult is the linearizability verdict of every range.
type LinearResult struct {
	// Result is porcupine's verdict over all ranges: Illegal if any range
	// is, else Unknown if any timed out or could not be checked, else Ok.
	Result porcupine.CheckResult
	// Ranges holds each range's verdict; Details the why of the others.
	Ranges  []porcupine.CheckResult
	Details []string
	// Ops is the number of operations checked.
	Ops int
	// OrphanedAcks and OrphanReads count the acks and home reads of
	// divergent tails (later forked off into orphan logs) left out: the
	// range's log is the final timeline; CheckQueue accounts for them.
	OrphanedAcks, OrphanReads int
}

// CheckLinearizable checks, per range, that the acknowledged appends
// (offset and epoch as acked), the ambiguous appends found in the home's
// final read (at the offset found, completing at the end of the history;
// the absent ones never happened), and the home reads (tail and chained
// hash) have a linearization in rangeModel. Failed appends are left out,
// and so are the acks found in an orphan log and the home reads that
// returned a prefix ending in such a divergent tail, if they were invoked
// before the first ack under a newer epoch returned (after it, such a
// read is stale and stays in, to be found).
// A range whose home final read is incomplete is Unknown (its ambiguous
// appends cannot be resolved). timeout bounds each range's search
// (porcupine's search is exponential in the worst case). With vizDir set,
// an Illegal range writes porcupine's visualisation there.
func CheckLinearizable(h *History, timeout time.Duration, vizDir string) LinearResult {
	res := LinearResult{Result: porcupine.Ok, Ranges: make([]porcupine.CheckResult, h.RangeCount())}
	type place struct{ offset, epoch uint64 }
	final := make([]map[string]place, h.RangeCount())
	finalHash := make([][]uint64, h.RangeCount()) // finalHash[r][n]: ChainHash of the final log's [0, n)
	for rng := range h.RangeCount() {
		if h.FinalRead[FinalKey(h.FinalHome(rng), rng)] {
			final[rng] = map[string]place{}
			finalHash[rng] = []uint64{0}
		}
	}
	for _, o := range h.Reads {
		if o.Final && o.Region == h.FinalHome(o.Range) && final[o.Range] != nil {
			final[o.Range][o.Value] = place{o.Offset, o.Epoch}
			if fh := finalHash[o.Range]; uint64(len(fh)-1) == o.Offset {
				finalHash[o.Range] = append(fh, ChainHash(fh[len(fh)-1], o.Offset, o.Epoch, o.Value))
			}
		}
	}
	orphans := indexOrphans(h, func(Anomaly) {}) // CheckQueue reports its anomalies
	// newerAck[r][e]: when range r's first ack under an epoch newer than e
	// returned (reads of e's divergent tail are stale from then on).
	newerAck := func(rng uint32, e uint64) int64 {
		first := int64(math.MaxInt64)
		for _, op := range h.Ops {
			if op.Kind == OpAppend && op.Outcome == OK && op.Range == rng && op.Epoch > e {
				first = min(first, op.Return)
			}
		}
		return first
	}
	// orphanRead reports whether a home read returned a prefix that ends
	// in a divergent tail (later forked off), while that tail's home was
	// still the newest in service.
	orphanRead := func(op Op) bool {
		fh := finalHash[op.Range]
		if op.Tail < uint64(len(fh)) && fh[op.Tail] == op.Hash {
			return false
		}
		for _, f := range orphans.forks {
			if f.rng != op.Range || f.at >= uint64(len(fh)) || op.Tail <= f.at {
				continue
			}
			hash := fh[f.at]
			for off := f.at; off < op.Tail; off++ {
				v, ok := f.values[off]
				if !ok {
					break
				}
				hash = ChainHash(hash, off, f.epoch, v)
				if off+1 == op.Tail && hash == op.Hash {
					return op.Call < newerAck(op.Range, f.epoch)
				}
			}
		}
		return false
	}
	ops := make([][]porcupine.Operation, h.RangeCount())
	for _, op := range h.Ops {
		if op.Range >= h.RangeCount() {
			continue
		}
		var in linInput
		var out linOutput
		ret := op.Return
		switch {
		case op.Kind == OpRead && op.Outcome == OK && final[op.Range] != nil && orphanRead(op):
			// The old home's timeline before the fork: not the log's
			// any more (CheckQueue checks the orphan logs).
			res.OrphanReads++
			continue
		case op.Kind == OpRead && op.Outcome == OK:
			in, out = linInput{read: true}, linOutput{tail: op.Tail, hash: op.Hash}
		case op.Kind == OpAppend && op.Outcome == OK && orphans.holds(op.Range, op.Offset, op.Epoch, op.Value):
			res.OrphanedAcks++
			continue
		case op.Kind == OpAppend && op.Outcome == OK:
			in, out = linInput{value: op.Value}, linOutput{offset: op.Offset, epoch: op.Epoch}
		case op.Kind == OpAppend && op.Outcome == Info && final[op.Range] != nil:
			p, present := final[op.Range][op.Value]
			if !present {
				continue
			}
			// It took effect at some unknown time after its call: it may
			// linearize anywhere after it.
			in, out, ret = linInput{value: op.Value}, linOutput{offset: p.offset, epoch: p.epoch}, math.MaxInt64
		default:
			continue
		}
		ops[op.Range] = append(ops[op.Range], porcupine.Operation{ClientId: op.Process, Input: in, Call: op.Call, Output: out, Return: ret})
	}
	worse := func(r porcupine.CheckResult) {
		if r == porcupine.Illegal || (r == porcupine.Unknown && res.Result == porcupine.Ok) {
			res.Result = r
		}
	}
	for rng := range h.RangeCount() {
		if final[rng] == nil {
			res.Ranges[rng] = porcupine.Unknown
			res.Details = append(res.Details, fmt.Sprintf("range %d: the home's final read is incomplete; ambiguous appends unresolved", rng))
			worse(porcupine.Unknown)
			continue
		}
		res.Ops += len(ops[rng])
		r := porcupine.CheckOperationsTimeout(rangeModel, ops[rng], timeout)
		res.Ranges[rng] = r
		worse(r)
		switch r {
		case porcupine.Unknown:
			res.Details = append(res.Details, fmt.Sprintf("range %d: no verdict within %v (%d operations)", rng, timeout, len(ops[rng])))
		case porcupine.Illegal:
			res.Details = append(res.Details, fmt.Sprintf("range %d: %s", rng, explainIllegal(ops[rng], timeout, vizDir, rng)))
		}
	}
	return res
}

// explainIllegal reruns the check verbosely and names where the longest
// partial linearization stops.
func explainIllegal(ops []porcupine.Operation, timeout time.Duration, vizDir string, rng uint32) string {
	_, info := porcupine.CheckOperationsVerbose(rangeModel, ops, timeout)
	longest := 0
	var state logState
	for _, partition := range info.PartialLinearizationsOperations() {
		for _, lin := range partition {
			if len(lin) <= longest {
				continue
			}
			longest = len(lin)
			state = logState{}
			for _, op := range lin {
				_, next := rangeModel.Step(state, op.Input, op.Output)
				state = next.(logState)
			}
		}
	}
	msg := fmt.Sprintf("not linearizable: at most %d of %d operations linearize, up to %s", longest, len(ops), rangeModel.DescribeState(state))
	if vizDir != "" {
		path := filepath.Join(vizDir, fmt.Sprintf("linearizability-r%d.html", rng))
		if err := porcupine.VisualizePath(rangeModel, info, path); err == nil {
			msg += " (see " + path + ")"
		}
	}
	return msg
}
