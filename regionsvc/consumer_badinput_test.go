package regionsvc

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
)

// TestConsumerBadInput sends every Consumer RPC requests it must refuse:
// each gets its typed error, and neither the group nor the cursor changes.
func TestConsumerBadInput(t *testing.T) {
	t.Parallel()
	n, lc := testNode(t, t.TempDir(), nil)
	ctx := ctxT(t)
	createStream(t, lc, "s", 2)
	appendN(t, ctx, lc, "s", 0, 10)
	cc := consumerClient(t, n.Addr())
	a, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "g", MemberId: "a", Stream: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "g", MemberId: "a", MemberEpoch: a.MemberEpoch,
		Positions: []*geologv1.CursorPosition{{Stream: "s", Range: 0, Offset: 5}}}); err != nil {
		t.Fatal(err)
	}
	// a restarts as a new incarnation: its old epoch is dead.
	a2, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "g", MemberId: "a", Stream: "s"})
	if err != nil {
		t.Fatal(err)
	}
	// A cursor without members, reset once: generation 1.
	if _, err := cc.ResetGroup(ctx, &geologv1.ResetGroupRequest{Group: "plain", Stream: "s", Ranges: []uint32{0}, To: &geologv1.ResetGroupRequest_ToOffset{ToOffset: 2}}); err != nil {
		t.Fatal(err)
	}
	before := describeState(t, ctx, cc)
	plainBefore, err := cc.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: "plain", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 300)
	pos := func(r uint32, off uint64) []*geologv1.CursorPosition {
		return []*geologv1.CursorPosition{{Stream: "s", Range: r, Offset: off}}
	}
	for _, c := range []struct {
		what string
		call func() error
		code apierr.Code
	}{
		{"commit by an unknown member", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "g", MemberId: "zed", MemberEpoch: a2.MemberEpoch, Positions: pos(0, 9)})
			return err
		}, apierr.UnknownMember},
		{"commit from an old generation", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "g", MemberId: "a", MemberEpoch: a.MemberEpoch, Positions: pos(0, 9)})
			return err
		}, apierr.StaleMemberEpoch},
		{"commit without a member to a live group", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "g", Positions: pos(0, 9)})
			return err
		}, apierr.GroupNotEmpty},
		{"commit past the tail", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "g", MemberId: "a", MemberEpoch: a2.MemberEpoch, Positions: pos(0, 11)})
			return err
		}, apierr.OffsetOutOfRange},
		{"commit to an unknown range", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "g", MemberId: "a", MemberEpoch: a2.MemberEpoch, Positions: pos(7, 1)})
			return err
		}, apierr.RangeNotFound},
		{"commit to an unknown stream", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "g", Positions: []*geologv1.CursorPosition{{Stream: "nope"}}})
			return err
		}, apierr.StreamNotFound},
		{"commit of a generation older than a reset", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "plain", Positions: []*geologv1.CursorPosition{
				{Stream: "s", Range: 1, Offset: 0}, {Stream: "s", Range: 0, Offset: 9, Generation: 0}}})
			return err
		}, apierr.StaleCursorGeneration},
		{"commit of more positions than a request may carry", func() error {
			many := make([]*geologv1.CursorPosition, 5000)
			for i := range many {
				many[i] = &geologv1.CursorPosition{Stream: "s", Range: 0, Offset: 9, Generation: 1}
			}
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "plain", Positions: many})
			return err
		}, apierr.InvalidArgument},
		{"a cursor name too long", func() error {
			_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: long, Positions: pos(0, 1)})
			return err
		}, apierr.InvalidArgument},
		{"join with an unknown stream", func() error {
			_, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "g", MemberId: "b", Stream: "nope"})
			return err
		}, apierr.StreamNotFound},
		{"join with a member id too long", func() error {
			_, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "g", MemberId: long, Stream: "s"})
			return err
		}, apierr.InvalidArgument},
		{"join with an absurd session timeout", func() error {
			_, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "g", MemberId: "b", Stream: "s", SessionTimeoutMs: 1})
			return err
		}, apierr.InvalidArgument},
		{"heartbeat from an old generation", func() error {
			_, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "g", MemberId: "a", MemberEpoch: a.MemberEpoch})
			return err
		}, apierr.StaleMemberEpoch},
		{"heartbeat from an epoch never issued", func() error {
			_, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "g", MemberId: "a", MemberEpoch: a2.MemberEpoch + 1000})
			return err
		}, apierr.StaleMemberEpoch},
		{"heartbeat with too many ranges", func() error {
			_, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "g", MemberId: "a", MemberEpoch: a2.MemberEpoch, OwnedRanges: make([]uint32, 5000)})
			return err
		}, apierr.InvalidArgument},
		{"leave from an old generation", func() error {
			_, err := cc.LeaveGroup(ctx, &geologv1.LeaveGroupRequest{Group: "g", MemberId: "a", MemberEpoch: a.MemberEpoch})
			return err
		}, apierr.StaleMemberEpoch},
		{"fetch from an old generation", func() error { return fetchErr(ctx, cc, "a", a.MemberEpoch, 0) }, apierr.StaleMemberEpoch},
		{"fetch by an unknown member", func() error { return fetchErr(ctx, cc, "zed", a2.MemberEpoch, 0) }, apierr.UnknownMember},
		{"fetch of an unknown range", func() error { return fetchErr(ctx, cc, "a", a2.MemberEpoch, 9) }, apierr.RangeNotFound},
		{"reset of a live group", func() error {
			_, err := cc.ResetGroup(ctx, &geologv1.ResetGroupRequest{Group: "g", Stream: "s", To: &geologv1.ResetGroupRequest_ToEarliest{ToEarliest: true}})
			return err
		}, apierr.GroupNotEmpty},
		{"reset without a target", func() error {
			_, err := cc.ResetGroup(ctx, &geologv1.ResetGroupRequest{Group: "other", Stream: "s"})
			return err
		}, apierr.InvalidArgument},
		{"reset past the tail", func() error {
			_, err := cc.ResetGroup(ctx, &geologv1.ResetGroupRequest{Group: "other", Stream: "s", To: &geologv1.ResetGroupRequest_ToOffset{ToOffset: 99}})
			return err
		}, apierr.OffsetOutOfRange},
		{"delete of a live group", func() error { _, err := cc.DeleteGroup(ctx, &geologv1.DeleteGroupRequest{Group: "g"}); return err }, apierr.GroupNotEmpty},
		{"delete of nothing", func() error {
			_, err := cc.DeleteGroup(ctx, &geologv1.DeleteGroupRequest{Group: "nothing"})
			return err
		}, apierr.GroupNotFound},
		{"bad consistency", func() error {
			_, err := cc.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: "g", Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET})
			return err
		}, apierr.InvalidArgument},
	} {
		err := c.call()
		if rpcerr.CodeOf(err) != c.code {
			t.Errorf("%s: got %v, want %v", c.what, err, c.code)
		}
	}
	if after := describeState(t, ctx, cc); after != before {
		t.Fatalf("refused requests changed the group:\nbefore %s\nafter  %s", before, after)
	}
	plainAfter, err := cc.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: "plain", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
	if err != nil {
		t.Fatal(err)
	}
	if prototext.Format(plainAfter) != prototext.Format(plainBefore) {
		t.Fatalf("refused requests changed the cursor:\nbefore %v\nafter  %v", plainBefore, plainAfter)
	}
}

func fetchErr(ctx context.Context, cc geologv1.ConsumerClient, member string, epoch uint64, r uint32) error {
	fs, err := cc.Fetch(ctx, &geologv1.FetchRequest{Group: "g", MemberId: member, MemberEpoch: epoch, Stream: "s", Range: r})
	if err != nil {
		return err
	}
	_, err = fs.Recv()
	return err
}

// describeState renders what a refused request must not change: the
// group's members and epochs and its positions.
func describeState(t *testing.T, ctx context.Context, cc geologv1.ConsumerClient) string {
	d, err := cc.DescribeGroup(ctx, &geologv1.DescribeGroupRequest{Group: "g", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range d.Members {
		m.LastHeartbeatAgeMs = 0
	}
	for _, r := range d.Ranges {
		r.LagMillis = 0
	}
	return prototext.Format(d)
}

// TestConsumerMalformedWire: random bytes to every Consumer RPC get a
// status, never a crash.
func TestConsumerMalformedWire(t *testing.T) {
	t.Parallel()
	n, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 1)
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	methods := []string{"CommitCursors", "GetCursors", "JoinGroup", "GroupHeartbeat", "LeaveGroup", "ListGroups", "DescribeGroup", "DeleteGroup", "ResetGroup"}
	for i := 0; i < 200; i++ {
		garbage := make(rawBytes, rng.IntN(64))
		for j := range garbage {
			garbage[j] = byte(rng.IntN(256))
		}
		var out rawBytes
		m := methods[i%len(methods)]
		cctx, cancel := context.WithTimeout(ctxT(t), 2e9)
		err := conn.Invoke(cctx, "/geolog.v1.Consumer/"+m, &garbage, &out, grpc.ForceCodec(rawCodec{}))
		cancel()
		_ = status.Code(err) // any answer, a status included, is fine
	}
	if _, err := c.ListStreams(ctxT(t), &geologv1.ListStreamsRequest{}); err != nil || status.Code(err) != codes.OK {
		t.Fatalf("server down after garbage: %v", err)
	}
}
