package client

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Reads by key: one conversation's records, through the range's key index
// on the server (see ReadOptions.ByKey).

// errKeyWithoutByKey refuses a ReadOptions whose Key would be ignored.
var errKeyWithoutByKey = apierr.New(apierr.InvalidArgument, "ReadOptions.Key is set but ByKey is not: set ByKey to read by key")

// setKey sets req's key filter from o.
func (o ReadOptions) setKey(req *geologv1.ReadRequest) error {
	switch {
	case o.ByKey:
		req.Key = nonNil(o.Key)
	case len(o.Key) > 0:
		return errKeyWithoutByKey
	}
	return nil
}

// nonNil returns key, or an empty key for nil: on the wire a present
// empty key selects keyless records, while an absent one reads them all.
func nonNil(key []byte) []byte {
	if key == nil {
		return []byte{}
	}
	return key
}

// RangeOfKey returns the range of stream that holds key's records
// (keyspace.RangeForKey over the stream's range count, which it asks the
// cluster for). The empty key has no range: producers spread keyless
// records over every range.
func (c *Client) RangeOfKey(ctx context.Context, stream string, key []byte) (uint32, error) {
	if len(key) == 0 {
		return 0, errors.New("client: keyless records are in every range: the empty key has no range of its own")
	}
	d, err := c.DescribeStream(ctx, stream)
	if err != nil {
		return 0, err
	}
	if d.Stream.RangeCount == 0 {
		return 0, fmt.Errorf("client: stream %q has no ranges", stream)
	}
	return keyspace.RangeForKey(key, d.Stream.RangeCount), nil
}

// SubscribeKey is Subscribe filtered by key: it yields only the records
// of range rng whose key equals key (an empty key: the keyless records),
// in offset order, then waits for new ones, resuming after a failure and
// opening records (copts) as Subscribe does. A non-empty key must belong
// to the range (RangeOfKey); otherwise the sequence ends with a
// CodeInvalidArgument error. Past a split of the range it follows the
// child that owns the key (the keyless records: both children).
func (c *Client) SubscribeKey(ctx context.Context, stream string, rng uint32, key []byte, start StartAt, copts ...ConsumerOpt) iter.Seq2[StoredRecord, error] {
	return c.subscribe(ctx, stream, rng, nonNil(key), start, copts)
}
