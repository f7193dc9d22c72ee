package cursors

import (
	"errors"
	"fmt"

	"github.com/geolog/geolog/apierr"
)

// ErrBehind is returned by CheckFetch when the state has not yet applied
// the group epoch a request carries: the caller's copy lags the
// coordinator and should wait for it, not judge the request.
var ErrBehind = errors.New("cursors: this copy of the group is behind the request's member epoch")

func errUnknownMember(group, member string) error {
	return apierr.New(apierr.UnknownMember, "member %q is not a member of group %q; join again", member, group)
}

func errStaleMemberEpoch(group, member string, got, current uint64) error {
	e := apierr.New(apierr.StaleMemberEpoch, "member %q of group %q: epoch %s is not one of its current incarnation (now %s); join again",
		member, group, EpochString(got), EpochString(current))
	e.MemberEpoch = current
	return e
}

func errNotAssigned(group, member, stream string, rng uint32) error {
	return apierr.New(apierr.RangeNotAssigned, "member %q of group %q does not own %s/%d", member, group, stream, rng)
}

func errGroupNotEmpty(group string, members int) error {
	return apierr.New(apierr.GroupNotEmpty, "group %q has %d live members", group, members)
}

func errStaleGeneration(cursor, stream string, rng uint32, got, current uint64) error {
	e := apierr.New(apierr.StaleCursorGeneration, "cursor %q %s/%d: generation %d, the cursor was reset to generation %d; read it again", cursor, stream, rng, got, current)
	e.CursorGeneration = current
	return e
}

func errInvalid(format string, args ...any) error {
	return apierr.New(apierr.InvalidArgument, format, args...)
}

func errLimit(format string, args ...any) error {
	return apierr.New(apierr.LimitExceeded, format, args...)
}

// checkName validates a cursor, group, member or instance name.
func checkName(what, name string, optional bool) error {
	if name == "" && !optional {
		return errInvalid("%s is empty", what)
	}
	if len(name) > NameBytesMax {
		return errInvalid("%s is %d bytes, over the maximum of %d", what, len(name), NameBytesMax)
	}
	return nil
}

func checkStream(stream string) error {
	if stream == "" {
		return errInvalid("stream is empty")
	}
	if len(stream) > StreamNameBytesMax {
		return errInvalid("stream name is %d bytes, over the maximum of %d", len(stream), StreamNameBytesMax)
	}
	return nil
}

func apiNotFound(name string) error {
	return apierr.New(apierr.GroupNotFound, "no group or cursor %q", name)
}

// EpochString formats a group or member epoch as H.N: the homing epoch of
// the cursor range that issued it, and the count within it.
func EpochString(e uint64) string {
	return fmt.Sprintf("%d.%d", e>>epochShift, e&(1<<epochShift-1))
}
