package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Outcome is how an operation ended, as its client saw it.
type Outcome string

// The outcomes (Jepsen's :ok, :fail and :info).
const (
	// OK: the operation took effect (an append acknowledged at an offset,
	// a read answered).
	OK Outcome = "ok"
	// Fail: the operation certainly did not take effect (the server
	// refused the record before appending it).
	Fail Outcome = "fail"
	// Info: the outcome is unknown (a timeout, a closed producer, a lost
	// reply): the record may or may not be in the log.
	Info Outcome = "info"
)

// OpKind tells appends from linearizable tail reads.
type OpKind string

// The operation kinds.
const (
	OpAppend OpKind = "append"
	// OpRead is a read of a range's whole log at the home with
	// consistency "home" (linearizable): its result is the tail and the
	// chained hash of every record below it.
	OpRead OpKind = "read"
)

// Op is one operation of a history. Times are nanoseconds since the
// history's start, on the monotonic clock.
type Op struct {
	Kind    OpKind  `json:"kind"`
	Process int     `json:"process"` // producer or reader index
	Range   uint32  `json:"range"`
	Call    int64   `json:"call"`
	Return  int64   `json:"return"` // for Info: when the client gave up
	Outcome Outcome `json:"outcome"`
	Err     string  `json:"err,omitempty"`

	// Appends: the record (Value is unique in the history) and, when OK,
	// where it landed.
	Key    string `json:"key,omitempty"`
	Value  string `json:"value,omitempty"`
	Offset uint64 `json:"offset,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
	// Duplicate: the server acked a resent batch with its original offsets
	// (the first ack was lost).
	Duplicate bool `json:"duplicate,omitempty"`

	// Reads: the tail and the chained hash (ChainHash) of records [0, Tail).
	Tail uint64 `json:"tail,omitempty"`
	Hash uint64 `json:"hash,omitempty"`
}

// Observation is one record as some reader saw it: a consumer following a
// range in a region, a tail reader, or a final read.
type Observation struct {
	// Source names the reader: "consume/<region>", "tail" (then "tail#1", ...
	// when the reader starts over after a fork), "final/<region>";
	// one source reads each range in offset order.
	Source string `json:"source"`
	Region string `json:"region"`
	// Final marks the final read after the faults healed.
	Final  bool   `json:"final,omitempty"`
	Range  uint32 `json:"range"`
	Offset uint64 `json:"offset"`
	Epoch  uint64 `json:"epoch"`
	Key    string `json:"key"`
	Value  string `json:"value"`
	// At is when the reader got it (ns since the history's start);
	// AppendUnixNanos the home leader's append time.
	At              int64 `json:"at"`
	AppendUnixNanos int64 `json:"append_unix_nanos"`
}

// FaultEvent is one injected fault, as it happened.
type FaultEvent struct {
	Fault Fault  `json:"fault"`
	What  string `json:"what"` // the resolved target, e.g. "kill us:n2"
	Range uint32 `json:"range"`
	// LeaderFault marks a fault on the range's leader or home (kill, pause
	// or isolation of the leader): failover is measured from its Start.
	LeaderFault bool   `json:"leader_fault,omitempty"`
	Start       int64  `json:"start"`
	End         int64  `json:"end"`
	Err         string `json:"err,omitempty"`
	// HomeEpochs is set by a fault that takes a whole home region away
	// (every node killed, or cut off from the lease store): each range
	// homed there when it started, and its homing epoch then. Failover
	// is measured per such range up to the first ack under a newer epoch;
	// the lease check (Stale) and the orphan allowance read it too.
	HomeEpochs map[uint32]uint64 `json:"home_epochs,omitempty"`
	// LeaseCut marks a lease-store outage of the ranges in HomeEpochs:
	// no ack under their epoch may return later than Start + the
	// history's LeaseTTL.
	LeaseCut bool `json:"lease_cut,omitempty"`
	// Pauses are the per-range pauses a planned rehome reported.
	Pauses []Duration `json:"pauses,omitempty"`
	// MemberRanges are the ranges a member fault's victim owned when it
	// was hit; Coordinator marks a fault on the group's coordinator.
	MemberRanges []uint32 `json:"member_ranges,omitempty"`
	Coordinator  bool     `json:"coordinator,omitempty"`
	// NotReplaced are the ranges that still named the killed node as a
	// replica just before a Params.Replaced kill was reverted.
	NotReplaced []uint32 `json:"not_replaced,omitempty"`
	// Sides are the two resolved sides of a link fault (partition,
	// latency, replicator-stop, lease-store cut): regions ("us"), nodes
	// ("us:n2"), "client" or "pg".
	Sides [][]string `json:"sides,omitempty"`
}

// OrphanRecord is one record of a range's orphan log, as a node's Admin
// ReadOrphans returned it: the divergent tail a returning home forked off
// (DESIGN.md "Divergent tails"), with its original offset and epoch.
type OrphanRecord struct {
	Node      string `json:"node"` // "us:n2"
	Range     uint32 `json:"range"`
	ForkIndex uint64 `json:"fork_index"`
	// ForkOffset is where the log continued in the newer epoch.
	ForkOffset uint64 `json:"fork_offset"`
	Offset     uint64 `json:"offset"`
	Epoch      uint64 `json:"epoch"`
	Key        string `json:"key"`
	Value      string `json:"value"`
}

// History is what a scenario's run recorded, everything the checkers read.
type History struct {
	Start  time.Time `json:"start"`
	End    int64     `json:"end"` // ns since Start when recording stopped
	Stream string    `json:"stream"`
	// Homes is each range's home region; Regions the stream's regions.
	Homes   []string      `json:"homes"`
	Regions []string      `json:"regions"`
	Ops     []Op          `json:"ops"`
	Reads   []Observation `json:"reads"`
	Faults  []FaultEvent  `json:"faults"`
	// FinalRead says, per "region/range", whether the final read of that
	// copy completed; the checkers judge loss only against a complete
	// final read of the home.
	FinalRead map[string]bool `json:"final_read"`
	// FinalHomes is each range's home region at the end (homing may have
	// moved it: a takeover, a rehome); empty means Homes.
	FinalHomes []string `json:"final_homes,omitempty"`
	// Orphans are the orphan logs of every node that answered, read after
	// the final reads; OrphansRead says that they were read at all.
	Orphans     []OrphanRecord `json:"orphans,omitempty"`
	OrphansRead bool           `json:"orphans_read,omitempty"`
	// LeaseTTL is the nodes' lease TTL (0: homing off).
	LeaseTTL Duration `json:"lease_ttl,omitempty"`
	// ProducerRegions is, per producer (Op.Process), the region whose
	// nodes its client knows.
	ProducerRegions []string `json:"producer_regions,omitempty"`
	// Group is what the consumer group did (nil without one).
	Group *GroupHistory `json:"group,omitempty"`
	// Spans are the stream's ranges at the end, from its range map, when
	// any of them split (empty: ranges 0..len(Homes)-1 as created). Homes
	// then covers every range id, children included.
	Spans []RangeSpan `json:"spans,omitempty"`
	// ReplicationFactor, when set (scenarios that join, drain or replace
	// nodes), is the voters every range must end with in every region;
	// Replicas are what the ranges' leaders described at the end.
	ReplicationFactor int          `json:"replication_factor,omitempty"`
	Replicas          []ReplicaSet `json:"replicas,omitempty"`
}

// RangeSpan is one range of the stream's range map at the end of a run:
// the hash slice it owns (inclusive bounds), and for a range that split,
// its children and split offset (its log is [0, SplitOffset)).
type RangeSpan struct {
	Range       uint32   `json:"range"`
	HashStart   uint64   `json:"hash_start"`
	HashEnd     uint64   `json:"hash_end"`
	Children    []uint32 `json:"children,omitempty"`
	SplitOffset uint64   `json:"split_offset,omitempty"`
}

// span is range rng's RangeSpan, or nil when the history has none.
func (h *History) span(rng uint32) *RangeSpan {
	for i := range h.Spans {
		if h.Spans[i].Range == rng {
			return &h.Spans[i]
		}
	}
	return nil
}

// FinalHome is range rng's home at the end: where its log is judged.
func (h *History) FinalHome(rng uint32) string {
	if int(rng) < len(h.FinalHomes) && h.FinalHomes[rng] != "" {
		return h.FinalHomes[rng]
	}
	if int(rng) < len(h.Homes) {
		return h.Homes[rng]
	}
	return "" // no such range in the history
}

// RangeCount is the number of ranges.
func (h *History) RangeCount() uint32 { return uint32(len(h.Homes)) }

// FinalKey is the FinalRead key of a region's copy of a range.
func FinalKey(region string, rng uint32) string {
	return region + "/" + strconv.FormatUint(uint64(rng), 10)
}

// recorder builds a History from many goroutines.
type recorder struct {
	mu sync.Mutex
	h  History
}

func newRecorder(stream string, homes, regions []string, leaseTTL time.Duration) *recorder {
	return &recorder{h: History{Start: time.Now(), Stream: stream, Homes: homes, Regions: regions, FinalRead: map[string]bool{}, LeaseTTL: D(leaseTTL)}}
}

// now is the history's clock.
func (r *recorder) now() int64 { return int64(time.Since(r.h.Start)) }

// wall converts a history time to wall-clock Unix nanoseconds.
func (r *recorder) wall(at int64) int64 { return r.h.Start.UnixNano() + at }

func (r *recorder) addOp(op Op) {
	r.mu.Lock()
	r.h.Ops = append(r.h.Ops, op)
	r.mu.Unlock()
}

func (r *recorder) addReads(obs ...Observation) {
	r.mu.Lock()
	r.h.Reads = append(r.h.Reads, obs...)
	r.mu.Unlock()
}

func (r *recorder) addFault(ev FaultEvent) {
	r.mu.Lock()
	r.h.Faults = append(r.h.Faults, ev)
	r.mu.Unlock()
}

func (r *recorder) setProducerRegions(regions []string) {
	r.mu.Lock()
	r.h.ProducerRegions = regions
	r.mu.Unlock()
}

func (r *recorder) setFinalHomes(homes []string) {
	r.mu.Lock()
	r.h.FinalHomes = homes
	r.mu.Unlock()
}

func (r *recorder) setOrphans(recs []OrphanRecord) {
	r.mu.Lock()
	r.h.Orphans, r.h.OrphansRead = recs, true
	r.mu.Unlock()
}

// setSpans records the stream's ranges at the end (split ones and their
// children) and the home of every range id.
func (r *recorder) setSpans(spans []RangeSpan, homes []string) {
	r.mu.Lock()
	r.h.Spans, r.h.Homes = spans, homes
	r.mu.Unlock()
}

func (r *recorder) setReplicas(sets []ReplicaSet, factor int) {
	r.mu.Lock()
	r.h.Replicas, r.h.ReplicationFactor = sets, factor
	r.mu.Unlock()
}

func (r *recorder) setFinal(region string, rng uint32, complete bool) {
	r.mu.Lock()
	r.h.FinalRead[FinalKey(region, rng)] = complete
	r.mu.Unlock()
}

// finish stops recording and returns the history.
// setGroup records what the consumer group did.
func (r *recorder) setGroup(g GroupHistory) {
	r.mu.Lock()
	r.h.Group = &g
	r.mu.Unlock()
}

// finalValues is the value of every record of the final home reads.
func (r *recorder) finalValues() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, o := range r.h.Reads {
		if o.Final && o.Region == r.h.FinalHome(o.Range) {
			out = append(out, o.Value)
		}
	}
	return out
}

func (r *recorder) finish() *History {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.End = r.now()
	h := r.h
	return &h
}

// Values encode what the checkers need to know of a record without the
// history: "p<producer>|<key>|<seq>|" then padding. The key is the
// record's key, so one value names one (producer, key, seq).

// EncodeValue returns the unique value of producer's seq-th record of key,
// padded with pad bytes.
func EncodeValue(producer int, key string, seq uint64, pad int) string {
	return fmt.Sprintf("p%d|%s|%d|%s", producer, key, seq, strings.Repeat(".", pad))
}

// DecodeValue parses what EncodeValue wrote; ok is false for anything else.
func DecodeValue(v string) (producer int, key string, seq uint64, ok bool) {
	parts := strings.SplitN(v, "|", 4)
	if len(parts) != 4 || !strings.HasPrefix(parts[0], "p") {
		return 0, "", 0, false
	}
	p, err1 := strconv.Atoi(parts[0][1:])
	s, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || parts[1] == "" {
		return 0, "", 0, false
	}
	return p, parts[1], s, true
}
