package regionsvc

import (
	"context"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Reads filtered by key (ReadRequest.key, SubscribeRequest.key): one
// conversation's records, found through the segment store's key index
// (segment.Store.ReadKey), bounded by the committed offset like every
// read, so they work the same on the home, followers and mirrors.

// readRangeOf returns the driver of range r of stream for a read, with key
// non-nil for a read filtered by it: the key must belong to the range
// (keyspace.RangeForKey), but for the empty key, which selects keyless
// records, that producers spread over every range.
func (n *Node) readRangeOf(ctx context.Context, stream string, r uint32, key []byte) (*rangeDriver, error) {
	rd, err := n.rangeOf(ctx, stream, r)
	if err == nil {
		err = rd.readable()
	}
	if err != nil || len(key) == 0 {
		return rd, err
	}
	if len(key) > n.cfg.RecordBytesMax {
		return nil, apierr.New(apierr.InvalidArgument, "key of %d bytes is longer than any record (%d bytes at most)", len(key), n.cfg.RecordBytesMax)
	}
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return nil, err
	}
	if keys := st.spec.keyRouter(); !keys.owns(r, key) {
		want := keys.rangeOf(key)
		return nil, apierr.New(apierr.InvalidArgument, "key %q belongs to range %d of stream %q, not range %d", clip(key), want, stream, r)
	}
	return rd, nil
}

// readable refuses a read of a range this node holds no replica of
// (rangeDriver.noReplica): its store is empty, or a copy left from before
// its replica moved away, so answering from it would show a reader a log
// shorter than one it read elsewhere. It refuses one of a replica that is
// relearning its commit index after the machine's crash too (replica's
// relearn.go): until it has, it may publish less than it published before
// the crash. NOT_LEADER, retriable, as Kafka's NOT_LEADER_OR_FOLLOWER: the
// SDK reads at its next address.
func (d *rangeDriver) readable() error {
	if d == nil {
		return nil
	}
	if e := d.relearning(); e != nil {
		return e
	}
	if !d.noReplica.Load() && !d.strayFlagged.Load() {
		return nil
	}
	if !d.noReplica.Load() {
		return apierr.New(apierr.NotLeader, "stream %s range %d: this node's replica of the range may have been removed from it; read at one of its replicas",
			d.cfg.stream, d.cfg.rangeID)
	}
	return apierr.New(apierr.NotLeader, "stream %s range %d: this node holds no replica of the range; read at one of its replicas",
		d.cfg.stream, d.cfg.rangeID)
}

// relearning refuses what this node's copy of d may not answer while its
// replica relearns the commit index after the machine's crash (replica's
// relearn.go): its committed end may be below what it published before.
// NOT_LEADER, retriable: the SDK reads at its next address. nil when not
// relearning.
func (d *rangeDriver) relearning() *apierr.Error {
	if rep := d.rep; rep != nil && rep.Relearning() {
		return apierr.New(apierr.NotLeader, "stream %s range %d: this node's replica is relearning the commit index after a machine restart; read at another of its replicas",
			d.cfg.stream, d.cfg.rangeID)
	}
	return nil
}

// clip shortens a key for an error message.
func clip(key []byte) []byte {
	const keyShownMax = 64
	if len(key) > keyShownMax {
		return key[:keyShownMax]
	}
	return key
}

// read returns committed records from offset from on as readRecords does
// (readFrames in the frame form), or, with key non-nil, as readKeyRecords
// does (in the records form whatever lim asks: the key index finds
// records, not frames).
func (d *rangeDriver) read(key []byte, from uint64, lim readLimits) (readOut, uint64, error) {
	switch {
	case key != nil:
		recs, next, err := d.readKeyRecords(key, from, lim.maxRecords, lim.maxBytes)
		return readOut{recs: recs, count: len(recs)}, next, err
	case lim.frames:
		return d.readFrames(from, lim.maxRecords, lim.maxBytes)
	}
	recs, next, err := d.readRecords(from, lim.maxRecords, lim.maxBytes)
	return readOut{recs: recs, count: len(recs)}, next, err
}

// readKeyRecords returns the committed records of key from offset from on,
// in offset order, at most maxRecords of them and, past the first, at most
// maxBytes of keys and values, and the offset to read next: after the
// last record returned when a bound stopped the read, else the committed
// offset (the records in between belong to other keys). It runs on the
// caller's goroutine, concurrently with the driver.
func (d *rangeDriver) readKeyRecords(key []byte, from uint64, maxRecords, maxBytes int) ([]*geologv1.StoredRecord, uint64, error) {
	committed, err := d.readBounds(from)
	if err != nil {
		return nil, from, err
	}
	recs, next, err := d.store.ReadKey(key, from, committed, maxRecords, maxBytes)
	if err != nil {
		return nil, from, d.readError(from, err)
	}
	out := make([]*geologv1.StoredRecord, len(recs))
	for i := range recs {
		out[i] = storedRecord(recs[i].Batch, recs[i].Offset, &recs[i].Record)
	}
	return out, next, nil
}
