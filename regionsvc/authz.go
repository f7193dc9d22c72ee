package regionsvc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Per-stream authorization (docs/security.md, "Authorization"). The
// interceptor (peerauth.go) decides every call in one place: first who
// may call the method at all (classOf: public, nodes, nodes of the
// region), then, for a client principal calling a public method, the
// permissions methodPerms names for it, on the stream or group the
// request names. A public method missing from methodPerms is refused,
// whatever the policy (TestMethodPermsComplete walks every method the
// server registers). Nodes are principals of their own kind: they pass
// every public method, since a node calls one only on a client's behalf
// (forwarding, propagation) after its own interceptor decided.

// need is one permission a call needs on one resource: a stream name for
// the stream permissions, a group or cursor name for authz.Group; ""
// when the request names none (only a "*" rule matches it).
type need struct {
	perm     authz.Permission
	resource string
}

// methodPerms names, for each public method, the permissions a request
// needs. Streaming methods are decided on each message the client sends.
var methodPerms = map[string]func(req any) []need{
	geologv1.Log_Append_FullMethodName:         streamNeed[*geologv1.AppendRequest](authz.Produce),
	geologv1.Log_AppendStream_FullMethodName:   streamNeed[*geologv1.AppendRequest](authz.Produce),
	geologv1.Log_Read_FullMethodName:           streamNeed[*geologv1.ReadRequest](authz.Consume),
	geologv1.Log_Subscribe_FullMethodName:      streamNeed[*geologv1.SubscribeRequest](authz.Consume),
	geologv1.Log_CreateStream_FullMethodName:   nameNeed[*geologv1.CreateStreamRequest](authz.Admin),
	geologv1.Log_ListStreams_FullMethodName:    func(any) []need { return []need{{authz.Describe, ""}} },
	geologv1.Log_DescribeStream_FullMethodName: nameNeed[*geologv1.DescribeStreamRequest](authz.Describe),
	geologv1.Log_DeleteStream_FullMethodName:   nameNeed[*geologv1.DeleteStreamRequest](authz.Admin),
	geologv1.Log_AlterStream_FullMethodName:    nameNeed[*geologv1.AlterStreamRequest](authz.Admin),

	geologv1.Admin_ChangeReplicas_FullMethodName:   streamNeed[*geologv1.ChangeReplicasRequest](authz.Admin),
	geologv1.Admin_DescribeReplicas_FullMethodName: streamNeed[*geologv1.DescribeReplicasRequest](authz.Describe),
	geologv1.Admin_Rehome_FullMethodName:           streamNeed[*geologv1.RehomeRequest](authz.Admin),
	geologv1.Admin_ListOrphans_FullMethodName:      streamNeed[*geologv1.ListOrphansRequest](authz.Admin),
	geologv1.Admin_ReadOrphans_FullMethodName:      streamNeed[*geologv1.ReadOrphansRequest](authz.Admin),
	geologv1.Admin_SplitRange_FullMethodName:       streamNeed[*geologv1.SplitRangeRequest](authz.Admin),
	// Granting on a resource pattern takes admin on that pattern (a
	// caller's patterns match it only if they match every name it does).
	geologv1.Admin_PutAcl_FullMethodName: func(req any) []need {
		r, _ := req.(*geologv1.PutAclRequest)
		return []need{{authz.Admin, r.GetRule().GetResource()}}
	},
	geologv1.Admin_DeleteAcl_FullMethodName: func(req any) []need {
		r, _ := req.(*geologv1.DeleteAclRequest)
		return []need{{authz.Admin, r.GetResource()}}
	},
	geologv1.Admin_ListAcls_FullMethodName: func(req any) []need {
		r, _ := req.(*geologv1.ListAclsRequest)
		if r.GetResource() == "" {
			return []need{{authz.Admin, "*"}}
		}
		return []need{{authz.Admin, r.GetResource()}}
	},
	// The region's node list is the region's, not a stream's: admin on
	// every resource (members_admin.go).
	geologv1.Admin_ListNodes_FullMethodName:    func(any) []need { return []need{{authz.Admin, "*"}} },
	geologv1.Admin_SetNodeState_FullMethodName: func(any) []need { return []need{{authz.Admin, "*"}} },

	geologv1.Consumer_CommitCursors_FullMethodName: commitCursorsNeeds,
	geologv1.Consumer_GetCursors_FullMethodName: func(req any) []need {
		r, _ := req.(*geologv1.GetCursorsRequest)
		return []need{{authz.Group, r.GetCursor()}, {authz.Describe, r.GetStream()}}
	},
	geologv1.Consumer_JoinGroup_FullMethodName:      groupStreamNeed[*geologv1.JoinGroupRequest](authz.Consume),
	geologv1.Consumer_GroupHeartbeat_FullMethodName: groupNeed[*geologv1.GroupHeartbeatRequest],
	geologv1.Consumer_LeaveGroup_FullMethodName:     groupNeed[*geologv1.LeaveGroupRequest],
	geologv1.Consumer_Fetch_FullMethodName:          groupStreamNeed[*geologv1.FetchRequest](authz.Consume),
	geologv1.Consumer_ListGroups_FullMethodName:     streamNeed[*geologv1.ListGroupsRequest](authz.Describe),
	geologv1.Consumer_DescribeGroup_FullMethodName:  groupNeed[*geologv1.DescribeGroupRequest],
	geologv1.Consumer_DeleteGroup_FullMethodName:    groupNeed[*geologv1.DeleteGroupRequest],
	geologv1.Consumer_ResetGroup_FullMethodName:     groupStreamNeed[*geologv1.ResetGroupRequest](authz.Consume),
}

func streamNeed[R interface{ GetStream() string }](p authz.Permission) func(any) []need {
	return func(req any) []need {
		r, _ := req.(R)
		return []need{{p, r.GetStream()}}
	}
}

func nameNeed[R interface{ GetName() string }](p authz.Permission) func(any) []need {
	return func(req any) []need {
		r, _ := req.(R)
		return []need{{p, r.GetName()}}
	}
}

func groupNeed[R interface{ GetGroup() string }](req any) []need {
	r, _ := req.(R)
	return []need{{authz.Group, r.GetGroup()}}
}

// groupStreamNeed is a group's member acting on a stream: the group
// permission on the group and p on the stream (Kafka's rule for groups).
func groupStreamNeed[R interface {
	GetGroup() string
	GetStream() string
}](p authz.Permission) func(any) []need {
	return func(req any) []need {
		r, _ := req.(R)
		return []need{{authz.Group, r.GetGroup()}, {p, r.GetStream()}}
	}
}

// commitCursorsNeeds: the group permission on the cursor, and consume on
// every stream a position names (once per run of positions on one stream:
// a commit is usually every range of one stream).
func commitCursorsNeeds(req any) []need {
	r, _ := req.(*geologv1.CommitCursorsRequest)
	needs := []need{{authz.Group, r.GetCursor()}}
	for _, p := range r.GetPositions() {
		if last := needs[len(needs)-1]; last.perm == authz.Consume && last.resource == p.GetStream() {
			continue
		}
		needs = append(needs, need{authz.Consume, p.GetStream()})
	}
	return needs
}

// policyState is the policy the node decides by. gen counts changes, so
// an open stream re-checks its calls when the policy changed.
type policyState struct {
	p   atomic.Pointer[authz.Policy]
	gen atomic.Uint64
}

func (s *policyState) set(p *authz.Policy) {
	s.p.Store(p)
	s.gen.Add(1)
}

// authzOn reports whether per-stream permissions are checked: TLS names
// the callers and Config.Authz is set.
func (n *Node) authzOn() bool { return n.secure() && n.cfg.Authz != nil }

// Allows decides whether principal holds perm on resource under the node's
// current policy (static superusers and the catalogue's ACLs), as the
// interceptor would: the web console filters what a viewer sees with it.
// With authorization off every principal is allowed.
func (n *Node) Allows(principal string, perm authz.Permission, resource string) bool {
	if !n.authzOn() {
		return true
	}
	p := n.policy.p.Load()
	return p != nil && p.Allows(principal, perm, resource)
}

// checkNeeds decides whether principal holds every permission of needs,
// with a PERMISSION_DENIED naming the first it lacks.
func (n *Node) checkNeeds(principal, method string, needs []need) *apierr.Error {
	p := n.policy.p.Load()
	for _, nd := range needs {
		if !p.Allows(principal, nd.perm, nd.resource) {
			what := "stream"
			if nd.perm == authz.Group {
				what = "group"
			}
			return apierr.New(apierr.PermissionDenied, "%s: %s has no %s permission on %s %q", method, principal, nd.perm, what, nd.resource)
		}
	}
	return nil
}

// authorizeRequest decides a client's request to a public method against
// the policy. Nodes, and every caller while authorization is off, pass.
func (n *Node) authorizeRequest(ctx context.Context, method string, req any) error {
	if !n.authzOn() {
		return nil
	}
	id, node := callerOf(ctx)
	return n.authorizeRequestOf(ctx, method, req, id, node)
}

// authorizeRequestOf is authorizeRequest for a caller already named
// (callerOf): a stream names its caller once, at its start (authzStream).
func (n *Node) authorizeRequestOf(ctx context.Context, method string, req any, id string, node bool) error {
	if !n.authzOn() {
		return nil
	}
	if node {
		return nil
	}
	if err := n.checkTokenStillValid(ctx, method); err != nil {
		return err
	}
	needsOf, ok := methodPerms[method]
	if !ok {
		return n.authRefused(ctx, method, id, reasonUnknownMethod,
			apierr.New(apierr.PermissionDenied, "%s has no entry in the permission table: refused", method))
	}
	if err := n.checkNeeds(id, method, needsOf(req)); err != nil {
		return n.authRefused(ctx, method, id, reasonNoPermission, err)
	}
	return nil
}

// authzStream decides each message a client sends on a stream, and
// decides the last one again before a send when the policy changed since
// (an ACL removed cuts an open subscription off at its next message).
//
// The caller is named once, when the stream starts (newAuthzStream): a
// stream's certificate (its connection's verified chain) and bearer token
// (authenticateToken, at the start) do not change while it is open, and
// naming it parses and validates the certificate's identity, which cost
// about 40% of an AppendStream's receive, per append, on the path to its
// ack. What the caller may do is still decided on every message, against
// the policy as it is then, and a token's expiry is still checked on
// every message.
type authzStream struct {
	grpc.ServerStream
	n       *Node
	method  string
	caller  string
	node    bool
	last    any
	lastGen uint64
	mu      sync.Mutex
}

func newAuthzStream(ss grpc.ServerStream, n *Node, method string) *authzStream {
	caller, node := callerOf(ss.Context())
	return &authzStream{ServerStream: ss, n: n, method: method, caller: caller, node: node}
}

func (s *authzStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	s.mu.Lock()
	s.last, s.lastGen = m, s.n.policy.gen.Load()
	s.mu.Unlock()
	return streamErr(s.n.authorizeRequestOf(s.Context(), s.method, m, s.caller, s.node))
}

func (s *authzStream) SendMsg(m any) error {
	s.mu.Lock()
	last, stale := s.last, s.lastGen != s.n.policy.gen.Load() || s.n.tokenExpired(s.Context())
	if stale {
		s.lastGen = s.n.policy.gen.Load()
	}
	s.mu.Unlock()
	if stale && last != nil {
		if err := s.n.authorizeRequestOf(s.Context(), s.method, last, s.caller, s.node); err != nil {
			return streamErr(err)
		}
	}
	return s.ServerStream.SendMsg(m)
}

// streamErr is a refusal as a stream's Recv or Send returns it: a gRPC
// status with its ErrorDetail for a handler that returns it as it is,
// and the *apierr.Error for one that unwraps it (AppendStream).
func streamErr(err error) error {
	e := apierr.As(err)
	if e == nil {
		return nil
	}
	return refusal{e}
}

type refusal struct{ e *apierr.Error }

func (r refusal) Error() string { return r.e.Error() }
func (r refusal) Unwrap() error { return r.e }

func (r refusal) GRPCStatus() *status.Status {
	st, _ := status.FromError(rpcerr.ToStatus(r.e))
	return st
}

// refusalLog rate-limits the refusal log: at most refusalLogBurst lines
// per refusalLogWindow, and a count of the lines left out.
type refusalLog struct {
	mu         sync.Mutex
	window     time.Time
	lines      int
	suppressed int
}

const (
	refusalLogBurst  = 20
	refusalLogWindow = 10 * time.Second
)

// admit reports whether a line may be logged now, and how many were left
// out before it in the window that ended.
func (l *refusalLog) admit(now time.Time) (ok bool, leftOut int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.window) >= refusalLogWindow {
		leftOut, l.suppressed = l.suppressed, 0
		l.window, l.lines = now, 0
	}
	if l.lines >= refusalLogBurst {
		l.suppressed++
		return false, 0
	}
	l.lines++
	return true, leftOut
}
