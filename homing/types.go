package homing

import (
	"fmt"
	"math"
	"regexp"
	"time"
	"unicode/utf8"
)

// Bounds on names and requests.
const (
	// StreamNameBytesMax bounds a stream name (as regionsvc does).
	StreamNameBytesMax = 128
	// RegionNameBytesMax bounds a region name.
	RegionNameBytesMax = 64
	// RangesPerRequestMax bounds the ranges of one CreateHomes, Homes or
	// Takeover call: each is one transaction, and a transaction must stay
	// small enough to commit quickly.
	RangesPerRequestMax = 10_000
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// streamRE is a stream name: a user's (as nameRE), or a node's internal
// stream, which starts with '_' ("_cursors").
var streamRE = regexp.MustCompile(`^_?[A-Za-z0-9][A-Za-z0-9._-]*$`)

// RangeKey names one range of one stream.
type RangeKey struct {
	Stream string
	Range  uint32
}

func (k RangeKey) String() string { return fmt.Sprintf("%s/%d", k.Stream, k.Range) }

func (k RangeKey) less(o RangeKey) bool {
	if k.Stream != o.Stream {
		return k.Stream < o.Stream
	}
	return k.Range < o.Range
}

// Liveness is one node's liveness record. A node heartbeats its own record:
// it extends ExpirationNanos (a reading of its own clock plus the TTL),
// conditional on Epoch being unchanged. A takeover of ranges homed in the
// node's region increments Epoch, which voids the node's earlier heartbeats.
type Liveness struct {
	NodeID uint64
	Region string
	// Epoch is the node's liveness epoch, 1 for a new node.
	Epoch uint64
	// ExpirationNanos is the node's lease expiration in Unix nanoseconds by
	// the node's own clock; 0 before the first heartbeat.
	ExpirationNanos int64
	// HomesSeen is the homes version of the node's region that the node had
	// published (was acting on) when it sent its last heartbeat. Planned
	// rehomes wait for it (see CompleteRehome).
	HomesSeen uint64
}

// Home is a range's home record.
type Home struct {
	Key RangeKey
	// Region is the home region: the one region whose range leader may ack
	// appends to the range while Epoch is current.
	Region string
	// Epoch is the homing epoch (fencing number): 1 at creation, +1 on
	// every change of home.
	Epoch uint64
	// StartOffset is the first offset appended under Epoch: where the home
	// continued the log (the fork point after an unplanned failover).
	StartOffset uint64
	// PrevRegion is the home before Epoch ("" for epoch 1).
	PrevRegion string
	// MovingTo is the target of a planned rehome in progress ("" if none).
	// While it is set, the home region does not ack the range.
	MovingTo string
	// DrainVersion is the home region's homes version that announced the
	// planned rehome; 0 if none.
	DrainVersion uint64
}

// EpochRecord is one grant of a homing epoch, kept as history so a returning
// home can learn where each later epoch forked off.
type EpochRecord struct {
	Key          RangeKey
	Epoch        uint64
	Region       string
	StartOffset  uint64
	PrevRegion   string
	Kind         string // "create", "takeover" or "rehome"
	GrantedNanos int64  // the granter's clock
}

// The epoch record kinds.
const (
	KindCreate   = "create"
	KindTakeover = "takeover"
	KindRehome   = "rehome"
)

// HeartbeatRequest extends a node's liveness.
type HeartbeatRequest struct {
	NodeID uint64
	Region string
	// Epoch is the liveness epoch the node believes it holds; the record is
	// extended only if it still has this epoch. 0 registers the node (a new
	// record at epoch 1) or learns its current epoch, extending nothing.
	Epoch uint64
	// ExpirationNanos is the node's clock, read before sending, plus the TTL.
	ExpirationNanos int64
	// NowNanos is the node's clock reading, recorded for operators.
	NowNanos int64
	// HomesSeen is the homes version the node had published when it sent
	// this heartbeat (stored in the record; see Liveness.HomesSeen).
	HomesSeen uint64
	// HomesKnown is the homes version the node holds; the region's homes are
	// returned only if the region's version differs.
	HomesKnown uint64
}

// HeartbeatResult is the outcome of a heartbeat.
type HeartbeatResult struct {
	// Liveness is the node's record after the heartbeat.
	Liveness Liveness
	// Extended reports whether the record was extended to the request's
	// expiration (false: the epoch differed, or Epoch was 0).
	Extended bool
	// HomesVersion is the region's homes version, read in the same
	// transaction.
	HomesVersion uint64
	// HomesChanged reports that HomesVersion differs from the request's
	// HomesKnown and Homes holds every range homed in the region, sorted.
	HomesChanged bool
	Homes        []Home
}

// HomeSpec creates a range's home at epoch 1.
type HomeSpec struct {
	Key         RangeKey
	Region      string
	StartOffset uint64
}

// TakeoverRequest moves ranges away from a failed region (unplanned
// failover), all in one transaction.
type TakeoverRequest struct {
	// From is the failed home region, To the new home.
	From, To string
	// NowNanos is the taker's clock reading, taken before the request.
	NowNanos int64
	// MaxOffsetNanos is the cluster's maximum clock offset. A node of From
	// counts as possibly live while NowNanos <= its expiration + this.
	MaxOffsetNanos int64
	Ranges         []TakeoverRange
}

// TakeoverRange is one range to take over.
type TakeoverRange struct {
	Key RangeKey
	// Epoch is the homing epoch the taker expects the range to be at (the
	// epoch of the last batch it replicated); the range moves to Epoch+1.
	Epoch uint64
	// StartOffset is where the new home continues: its replicated tail.
	StartOffset uint64
}

// Outcome is what happened to one range of a takeover.
type Outcome int

// The takeover outcomes.
const (
	// Granted: the range is now homed at To, at the expected epoch + 1.
	Granted Outcome = iota + 1
	// OutcomeEpochMismatch: the range is at another epoch; unchanged.
	OutcomeEpochMismatch
	// OutcomeWrongRegion: the range is not homed in From; unchanged.
	OutcomeWrongRegion
	// OutcomeNotFound: the range has no home record.
	OutcomeNotFound
)

func (o Outcome) String() string {
	switch o {
	case Granted:
		return "granted"
	case OutcomeEpochMismatch:
		return "epoch-mismatch"
	case OutcomeWrongRegion:
		return "wrong-region"
	case OutcomeNotFound:
		return "not-found"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// TakeoverResult is the outcome of a takeover, per range in request order.
type TakeoverResult struct {
	Ranges []RangeOutcome
	// Fenced are the liveness records of From's nodes whose epochs the
	// takeover incremented (empty if nothing was granted).
	Fenced []Liveness
}

// Granted returns how many ranges were granted.
func (r TakeoverResult) Granted() int {
	n := 0
	for _, o := range r.Ranges {
		if o.Outcome == Granted {
			n++
		}
	}
	return n
}

// RangeOutcome is one range's takeover outcome and its home afterwards (a
// zero Epoch for OutcomeNotFound).
type RangeOutcome struct {
	Key     RangeKey
	Outcome Outcome
	Home    Home
}

// RehomeRequest is one step of a planned rehome of one range.
type RehomeRequest struct {
	Key RangeKey
	// Epoch is the range's current homing epoch, as the caller expects it.
	Epoch uint64
	// To is the target region (PrepareRehome, CompleteRehome).
	To string
	// StartOffset is where the target continues (CompleteRehome): the old
	// home's tail, which the target has caught up to.
	StartOffset uint64
	// NowNanos and MaxOffsetNanos decide which nodes of the old home may
	// still be live (CompleteRehome).
	NowNanos       int64
	MaxOffsetNanos int64
}

// Validation. Everything that reaches the lease store is checked first, so
// that bad input gets ErrInvalidArgument and never reaches SQL or panics.

func validateStream(s string) error {
	if s == "" {
		return invalidf("stream name is empty")
	}
	if len(s) > StreamNameBytesMax {
		return invalidf("stream name is %d bytes, over the maximum of %d", len(s), StreamNameBytesMax)
	}
	if !utf8.ValidString(s) || !streamRE.MatchString(s) {
		return invalidf("stream name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", s)
	}
	return nil
}

func validateRegion(what, r string) error {
	if r == "" {
		return invalidf("%s region is empty", what)
	}
	if len(r) > RegionNameBytesMax || !nameRE.MatchString(r) {
		return invalidf("%s region %q is not a valid region name", what, r)
	}
	return nil
}

func validateKey(k RangeKey) error { return validateStream(k.Stream) }

func validateNodeID(id uint64) error {
	if id == 0 || id > math.MaxInt64 {
		return invalidf("node id %d: must be in [1, 2^63)", id)
	}
	return nil
}

func validateEpoch(e uint64) error {
	// The epoch is stored in an INT8 and incremented: keep room for +1.
	if e == 0 || e >= math.MaxInt64 {
		return invalidf("epoch %d: must be in [1, 2^63-1)", e)
	}
	return nil
}

func validateOffset(o uint64) error {
	if o > math.MaxInt64 {
		return invalidf("offset %d: must be below 2^63", o)
	}
	return nil
}

func validateNanos(what string, n int64) error {
	if n < 0 {
		return invalidf("%s %d: must not be negative", what, n)
	}
	return nil
}

func validateKeys(keys []RangeKey) error {
	if len(keys) == 0 {
		return invalidf("no ranges")
	}
	if len(keys) > RangesPerRequestMax {
		return invalidf("%d ranges: at most %d per request", len(keys), RangesPerRequestMax)
	}
	seen := make(map[RangeKey]struct{}, len(keys))
	for _, k := range keys {
		if err := validateKey(k); err != nil {
			return err
		}
		if _, dup := seen[k]; dup {
			return invalidf("range %s is listed twice", k)
		}
		seen[k] = struct{}{}
	}
	return nil
}

func (r HeartbeatRequest) validate() error {
	if err := validateNodeID(r.NodeID); err != nil {
		return err
	}
	if err := validateRegion("node", r.Region); err != nil {
		return err
	}
	if r.Epoch >= math.MaxInt64 {
		return invalidf("liveness epoch %d: must be below 2^63-1", r.Epoch)
	}
	if err := validateNanos("expiration", r.ExpirationNanos); err != nil {
		return err
	}
	if err := validateNanos("now", r.NowNanos); err != nil {
		return err
	}
	if r.HomesSeen > math.MaxInt64 || r.HomesKnown > math.MaxInt64 {
		return invalidf("homes version out of range")
	}
	return nil
}

func validateSpecs(specs []HomeSpec) error {
	keys := make([]RangeKey, len(specs))
	for i, s := range specs {
		keys[i] = s.Key
		if err := validateRegion("home", s.Region); err != nil {
			return err
		}
		if err := validateOffset(s.StartOffset); err != nil {
			return err
		}
	}
	return validateKeys(keys)
}

func (r TakeoverRequest) validate() error {
	if err := validateRegion("from", r.From); err != nil {
		return err
	}
	if err := validateRegion("to", r.To); err != nil {
		return err
	}
	if r.From == r.To {
		return invalidf("takeover from %s to itself", r.From)
	}
	if err := validateNanos("now", r.NowNanos); err != nil {
		return err
	}
	if err := validateNanos("max clock offset", r.MaxOffsetNanos); err != nil {
		return err
	}
	keys := make([]RangeKey, len(r.Ranges))
	for i, rr := range r.Ranges {
		keys[i] = rr.Key
		if err := validateEpoch(rr.Epoch); err != nil {
			return fmt.Errorf("range %s: %w", rr.Key, err)
		}
		if err := validateOffset(rr.StartOffset); err != nil {
			return err
		}
	}
	return validateKeys(keys)
}

// validate checks a rehome step; needTo: the step names a target.
func (r RehomeRequest) validate(needTo bool) error {
	if err := validateKey(r.Key); err != nil {
		return err
	}
	if err := validateEpoch(r.Epoch); err != nil {
		return err
	}
	if needTo {
		if err := validateRegion("target", r.To); err != nil {
			return err
		}
	}
	if err := validateOffset(r.StartOffset); err != nil {
		return err
	}
	if err := validateNanos("now", r.NowNanos); err != nil {
		return err
	}
	return validateNanos("max clock offset", r.MaxOffsetNanos)
}

// fmtNanos formats a clock reading for messages: Unix nanoseconds as UTC.
func fmtNanos(n int64) string {
	return time.Unix(0, n).UTC().Format("15:04:05.000000000")
}

// EpochStarts maps each epoch of an epoch history to its start offset
// (the highest recorded, should a history hold an epoch twice).
func EpochStarts(recs []EpochRecord) map[uint64]uint64 {
	starts := make(map[uint64]uint64, len(recs))
	for _, r := range recs {
		starts[r.Epoch] = max(starts[r.Epoch], r.StartOffset)
	}
	return starts
}
