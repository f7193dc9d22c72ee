package homing

import "context"

// Store is the lease store: the I/O seam between homing and CockroachDB (or
// PostgreSQL), with MemStore as its in-memory twin. Every method is one
// serializable transaction (or one critical section of the twin); the
// decisions inside are the shared pure functions of decide.go, so the two
// implementations have the same semantics.
//
// Clock readings come in with the requests: a store never reads a clock to
// decide anything. Every request is validated first (ErrInvalidArgument).
// Failures to reach the store are ErrStoreUnavailable (nothing changed) or
// ErrAmbiguousCommit (a change may have been applied).
type Store interface {
	// Heartbeat registers a node (Epoch 0) or extends its liveness
	// (conditional on Epoch), and returns the region's homes when their
	// version differs from HomesKnown. Writes one row: the lease store's
	// load is O(nodes) per heartbeat interval, whatever the range count.
	Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error)
	// CreateHomes homes new ranges at epoch 1. A range that already has a
	// home keeps it. Returns each range's home, in request order.
	CreateHomes(ctx context.Context, specs []HomeSpec) ([]Home, error)
	// Homes returns the home records of keys, in request order; a missing
	// record has a zero Epoch.
	Homes(ctx context.Context, keys []RangeKey) ([]Home, error)
	// RegionHomes returns every range homed in region and the region's
	// homes version.
	RegionHomes(ctx context.Context, region string) ([]Home, uint64, error)
	// Liveness returns the liveness records of region's nodes ("" for all),
	// sorted by node id.
	Liveness(ctx context.Context, region string) ([]Liveness, error)
	// Takeover moves ranges from a failed region to another at epoch+1, in
	// one transaction, only if no node of From may be live (else
	// ErrHomeLive, nothing changed). Each range's outcome is reported; the
	// granted ones are recorded in their history.
	Takeover(ctx context.Context, req TakeoverRequest) (TakeoverResult, error)
	// PrepareRehome marks a range as moving to req.To (its home stops
	// acking it). Compare-and-set on req.Epoch.
	PrepareRehome(ctx context.Context, req RehomeRequest) (Home, error)
	// CompleteRehome moves a prepared range to req.To at epoch+1 once the
	// old home is drained (ErrNotDrained before). Compare-and-set on
	// req.Epoch and the prepared target.
	CompleteRehome(ctx context.Context, req RehomeRequest) (Home, error)
	// CancelRehome abandons a planned move. Compare-and-set on req.Epoch.
	CancelRehome(ctx context.Context, req RehomeRequest) (Home, error)
	// RaiseStart moves the recorded start of a range's current epoch up to
	// where its new home's log really ends (raisestart.go): compare-and-set
	// on the epoch and the start the caller read, only upward, in the home
	// record and its history. ErrEpochMismatch: the epoch moved on;
	// ErrStartMoved: another raise came first; ErrNotHome: the caller's
	// region is not the home, or the range is moving.
	RaiseStart(ctx context.Context, req RaiseStartRequest) (Home, error)
	// History returns the epochs granted to a range, oldest first.
	History(ctx context.Context, key RangeKey) ([]EpochRecord, error)
	// StreamHistory returns the epochs granted to every range of stream, by
	// range then epoch: one statement, whatever the range count.
	StreamHistory(ctx context.Context, stream string) ([]EpochRecord, error)
	// DeleteHomes removes every home record, epoch history and split claim of stream
	// (the stream was deleted; a new stream under its name starts afresh
	// at epoch 1), bumping the homes version of the regions they were in.
	// Deleting a stream without records does nothing.
	DeleteHomes(ctx context.Context, stream string) error
	// SplitHomes homes the two children of a split range where the parent
	// is homed, at its epoch, starting at offset 0 (split.go), in one
	// transaction, conditional on the parent being homed in req.Region at
	// req.Epoch (ErrEpochMismatch, ErrNotHome otherwise). A child that has
	// a record keeps it. Returns the children's records.
	SplitHomes(ctx context.Context, req SplitHomesRequest) ([]Home, error)
	// ClaimSplit claims version req.MapVersion of the stream's range map
	// for a split in req.Region (splitclaim.go), so that regions homing
	// ranges of one stream never split two of them at the same version:
	// granted if the version is unclaimed (then only while the parent is
	// homed in req.Region, not moving) or claimed by req.Region already;
	// ErrSplitClaimed if another region holds it.
	ClaimSplit(ctx context.Context, req SplitClaim) error
	// Close releases the store's resources.
	Close()
}
