package client

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
)

// GroupOpt configures a GroupConsumer. Options are validated together in
// NewGroupConsumer.
type GroupOpt func(*groupConfig)

// StartPolicy says where a member starts a range the group never
// committed a position for.
type StartPolicy int

const (
	// StartEarliest starts at the range's first retained offset.
	StartEarliest StartPolicy = iota
	// StartLatest starts at the range's tail: only records appended from
	// then on.
	StartLatest
)

type groupConfig struct {
	memberID           string
	instanceID         string
	sessionTimeout     time.Duration
	rebalanceTimeout   time.Duration
	autoCommitInterval time.Duration
	manualCommit       bool
	start              StartPolicy
	onAssigned         func([]uint32)
	onRevoked          func([]uint32)
	onLost             func([]uint32)
	fetchBytesMax      uint32
	bufferedBatchesMax int
	startPositions     StartPositionsFunc // groupstart.go
}

func defaultGroupConfig() groupConfig {
	return groupConfig{
		sessionTimeout:     10 * time.Second,
		rebalanceTimeout:   30 * time.Second,
		autoCommitInterval: time.Second,
		bufferedBatchesMax: 64,
	}
}

// GroupMemberID sets the member id, overriding the default of a random
// 128-bit hex id. It must be unique in the group; 1 to 256 bytes.
func GroupMemberID(id string) GroupOpt { return func(c *groupConfig) { c.memberID = id } }

// GroupInstanceID makes the member static, overriding the default of a
// dynamic member: a restarted process with the same instance id takes its
// predecessor's ranges at once, with no rebalance, if it joins within the
// session timeout (Close of a static member leaves temporarily).
func GroupInstanceID(id string) GroupOpt { return func(c *groupConfig) { c.instanceID = id } }

// SessionTimeout overrides the default of 10s: the coordinator removes a
// member it has not heard from for this long (and the member stops
// consuming on its own when it has had no answer for this long). Between
// 500ms and 5m.
func SessionTimeout(d time.Duration) GroupOpt { return func(c *groupConfig) { c.sessionTimeout = d } }

// RebalanceTimeout overrides the default of 30s: a member asked to
// release ranges that has not within this long is removed. Between 500ms
// and 10m.
func RebalanceTimeout(d time.Duration) GroupOpt {
	return func(c *groupConfig) { c.rebalanceTimeout = d }
}

// AutoCommitInterval overrides the default of 1s: how often the positions
// of processed records are committed. Records are also committed when
// their ranges are revoked and on Close.
func AutoCommitInterval(d time.Duration) GroupOpt {
	return func(c *groupConfig) { c.autoCommitInterval = d }
}

// ManualCommit turns automatic marking off, overriding the default: a
// record counts as processed only once Mark is called for it, and
// positions are committed only by Commit (and, for marked records, when
// ranges are revoked and on Close).
func ManualCommit() GroupOpt { return func(c *groupConfig) { c.manualCommit = true } }

// StartFrom sets where a range without a committed position starts,
// overriding the default of StartEarliest.
func StartFrom(p StartPolicy) GroupOpt { return func(c *groupConfig) { c.start = p } }

// OnAssigned is called with the ranges the member gains, before it starts
// fetching them. It runs on the member's own goroutine: it must not block
// for long, nor call Close. No callback by default.
func OnAssigned(fn func(ranges []uint32)) GroupOpt { return func(c *groupConfig) { c.onAssigned = fn } }

// OnRevoked is called with the ranges the member gives up, once it stopped
// fetching them and before it commits their positions and releases them:
// the place to flush work in progress (and Commit, with ManualCommit). It
// runs on the member's own goroutine: it must not block for long, nor
// call Close. No callback by default.
func OnRevoked(fn func(ranges []uint32)) GroupOpt { return func(c *groupConfig) { c.onRevoked = fn } }

// OnLost is called with the ranges the member lost without releasing them
// (it was removed from the group: its session timed out, or it was
// fenced): their positions can no longer be committed, and another member
// may be processing them already. Default: OnRevoked's function.
func OnLost(fn func(ranges []uint32)) GroupOpt { return func(c *groupConfig) { c.onLost = fn } }

// FetchBytesMax bounds each fetched reply, overriding the server's default
// of 1 MiB.
func FetchBytesMax(n uint32) GroupOpt { return func(c *groupConfig) { c.fetchBytesMax = n } }

// BufferedBatchesMax bounds the fetched batches waiting for Records,
// across ranges, overriding the default of 64.
func BufferedBatchesMax(n int) GroupOpt { return func(c *groupConfig) { c.bufferedBatchesMax = n } }

func (c *groupConfig) validate() error {
	if c.memberID == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		c.memberID = hex.EncodeToString(b[:])
	}
	if c.onLost == nil {
		c.onLost = c.onRevoked
	}
	switch {
	case len(c.memberID) > 256 || len(c.instanceID) > 256:
		return fmt.Errorf("client: member and instance ids are at most 256 bytes")
	case c.sessionTimeout < 500*time.Millisecond || c.sessionTimeout > 5*time.Minute:
		return fmt.Errorf("client: SessionTimeout %v is outside [500ms, 5m]", c.sessionTimeout)
	case c.rebalanceTimeout < 500*time.Millisecond || c.rebalanceTimeout > 10*time.Minute:
		return fmt.Errorf("client: RebalanceTimeout %v is outside [500ms, 10m]", c.rebalanceTimeout)
	case c.autoCommitInterval <= 0:
		return fmt.Errorf("client: AutoCommitInterval %v is not positive", c.autoCommitInterval)
	case c.bufferedBatchesMax < 1:
		return fmt.Errorf("client: BufferedBatchesMax %d is not positive", c.bufferedBatchesMax)
	case c.start != StartEarliest && c.start != StartLatest:
		return fmt.Errorf("client: unknown start policy %d", c.start)
	}
	return nil
}
