package homing

import (
	"errors"
	"testing"
)

// TestClaimSplit: a map version of a stream is claimed by one region: the
// same region again is granted (a retry, or its next split after one that
// never reserved), another region gets ErrSplitClaimed naming the holder,
// and a region claims a new version only while the parent is homed there
// and not moving. Claims go with the stream's homes.
func TestClaimSplit(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, ctx := newStore(t, kind), ctxT(t)
			r0, r1 := RangeKey{Stream: "sx", Range: 0}, RangeKey{Stream: "sx", Range: 1}
			if _, err := s.CreateHomes(ctx, []HomeSpec{{Key: r0, Region: "us"}, {Key: r1, Region: "eu"}}); err != nil {
				t.Fatal(err)
			}
			us := SplitClaim{Stream: "sx", MapVersion: 1, Parent: 0, At: 1 << 62, Region: "us", NowNanos: 1}
			eu := SplitClaim{Stream: "sx", MapVersion: 1, Parent: 1, At: 3 << 62, Region: "eu", NowNanos: 2}
			for _, c := range []struct {
				c    SplitClaim
				want error
			}{
				{SplitClaim{Stream: "sx", MapVersion: 0, Parent: 0, Region: "us"}, ErrInvalidArgument},
				{SplitClaim{Stream: "", MapVersion: 1, Parent: 0, Region: "us"}, ErrInvalidArgument},
				{SplitClaim{Stream: "sx", MapVersion: 1, Parent: 0, Region: ""}, ErrInvalidArgument},
				{SplitClaim{Stream: "sx", MapVersion: 1, Parent: 1, Region: "us"}, ErrNotHome}, // range 1 is eu's
				{SplitClaim{Stream: "sx", MapVersion: 1, Parent: 7, Region: "us"}, ErrRangeNotFound},
			} {
				if err := s.ClaimSplit(ctx, c.c); !errors.Is(err, c.want) {
					t.Fatalf("%+v: %v, want %v", c.c, err, c.want)
				}
			}
			if err := s.ClaimSplit(ctx, us); err != nil {
				t.Fatal(err)
			}
			if err := s.ClaimSplit(ctx, us); err != nil {
				t.Fatalf("the same claim again: %v", err)
			}
			err := s.ClaimSplit(ctx, eu)
			if !errors.Is(err, ErrSplitClaimed) || !IsRetriable(err) {
				t.Fatalf("eu claims us's version: %v, want a retriable ErrSplitClaimed", err)
			}
			// us again at version 1 for another split (its first never
			// reserved): granted; eu at version 2: granted.
			if err := s.ClaimSplit(ctx, SplitClaim{Stream: "sx", MapVersion: 1, Parent: 0, At: 1 << 61, Region: "us"}); err != nil {
				t.Fatalf("us claims its own version again for another boundary: %v", err)
			}
			eu.MapVersion = 2
			if err := s.ClaimSplit(ctx, eu); err != nil {
				t.Fatal(err)
			}
			if err := s.ClaimSplit(ctx, SplitClaim{Stream: "sx", MapVersion: 2, Parent: 0, Region: "us"}); !errors.Is(err, ErrSplitClaimed) {
				t.Fatalf("us claims eu's version 2: %v, want ErrSplitClaimed", err)
			}
			// Deleted with the stream: a new stream of the name starts afresh.
			if err := s.DeleteHomes(ctx, "sx"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.CreateHomes(ctx, []HomeSpec{{Key: r0, Region: "eu"}}); err != nil {
				t.Fatal(err)
			}
			if err := s.ClaimSplit(ctx, SplitClaim{Stream: "sx", MapVersion: 1, Parent: 0, Region: "eu"}); err != nil {
				t.Fatalf("after the stream was deleted: %v", err)
			}
		})
	}
}
