package regionsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/metadata"
)

// TestCallClasses lists who may call every method a replicated node
// serves (read from the node's gRPC server, so a service or method added
// later shows up here): a geolog.v1 method is public, anything else is
// for nodes.
func TestCallClasses(t *testing.T) {
	t.Parallel()
	want := map[string]callClass{
		"/geolog.v1.Log/Append":                                 callPublic,
		"/geolog.v1.Log/AppendStream":                           callPublic,
		"/geolog.v1.Log/Read":                                   callPublic,
		"/geolog.v1.Log/Subscribe":                              callPublic,
		"/geolog.v1.Log/CreateStream":                           callPublic,
		"/geolog.v1.Log/ListStreams":                            callPublic,
		"/geolog.v1.Log/DescribeStream":                         callPublic,
		"/geolog.v1.Log/DeleteStream":                           callPublic,
		"/geolog.v1.Log/AlterStream":                            callPublic,
		"/geolog.v1.Admin/ChangeReplicas":                       callPublic,
		"/geolog.v1.Admin/DescribeReplicas":                     callPublic,
		"/geolog.v1.Admin/Rehome":                               callPublic,
		"/geolog.v1.Admin/RefreshHomes":                         callNode,
		"/geolog.v1.Admin/ListOrphans":                          callPublic,
		"/geolog.v1.Admin/ReadOrphans":                          callPublic,
		"/geolog.v1.Admin/PutAcl":                               callPublic,
		"/geolog.v1.Admin/DeleteAcl":                            callPublic,
		"/geolog.v1.Admin/ListAcls":                             callPublic,
		"/geolog.v1.Admin/ListNodes":                            callPublic,
		"/geolog.v1.Admin/SetNodeState":                         callPublic,
		"/geolog.v1.Admin/SplitRange":                           callPublic,
		"/geolog.v1.Consumer/CommitCursors":                     callPublic,
		"/geolog.v1.Consumer/GetCursors":                        callPublic,
		"/geolog.v1.Consumer/JoinGroup":                         callPublic,
		"/geolog.v1.Consumer/GroupHeartbeat":                    callPublic,
		"/geolog.v1.Consumer/LeaveGroup":                        callPublic,
		"/geolog.v1.Consumer/Fetch":                             callPublic,
		"/geolog.v1.Consumer/ListGroups":                        callPublic,
		"/geolog.v1.Consumer/DescribeGroup":                     callPublic,
		"/geolog.v1.Consumer/DeleteGroup":                       callPublic,
		"/geolog.v1.Consumer/ResetGroup":                        callPublic,
		"/geolog.internal.v1.Mirror/Replicate":                  callNode,
		"/geolog.internal.v1.NodeDirectory/Identify":            callNode,
		"/geolog.internal.v1.NodeDirectory/Join":                callNode,
		"/geolog.internal.v1.NodeDirectory/Members":             callNode,
		"/geolog.internal.v1.RaftTransport/Stream":              callRegion,
		"/geolog.internal.v1.RaftTransport/Snapshot":            callRegion,
		"/geolog.internal.v1.RegionCatalogue/RecordMirrorSplit": callRegion,
		"/geolog.internal.v1.ReplicaHints/ReplicaRemoved":       callRegion,
		// The health service needs no class: any caller the transport
		// admits may ask (health.go; the interceptors let it through).
		"/grpc.health.v1.Health/Check": callNode,
		"/grpc.health.v1.Health/List":  callNode,
		"/grpc.health.v1.Health/Watch": callNode,
	}
	w := newWorld(t, []string{"us", "eu"}, 1, 0, 0)
	served := map[string]bool{}
	for service, info := range w.nodes["us"][1].grpcServer.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + service + "/" + m.Name
			served[full] = true
			w, ok := want[full]
			if !ok {
				t.Errorf("%s is not in this test: say who may call it (classOf: %v)", full, classOf(full))
				continue
			}
			if got := classOf(full); got != w {
				t.Errorf("%s: class %v, want %v", full, got, w)
			}
		}
	}
	for full := range want {
		if !served[full] {
			t.Errorf("%s is listed here and not served", full)
		}
	}
	// Unknown services fail closed.
	if classOf("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo") != callNode {
		t.Error("a service outside geolog.v1 is not for nodes only")
	}
}

// TestInsecureNodeChecksNothing: without TLS the node lets every call
// through (geologd says so at start), even with the internal headers.
func TestInsecureNodeChecksNothing(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: Config{Region: "us"}}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(forwardedKey, "1"))
	for _, m := range []string{"/geolog.v1.Log/Append", "/geolog.internal.v1.RaftTransport/Stream", "/geolog.v1.Admin/RefreshHomes"} {
		if err := n.authorizeCall(ctx, m); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	if err := n.authorizeRaftPeer(ctx, 7); err != nil {
		t.Error(err)
	}
	if err := n.authorizeMirrorSource(ctx, "eu", 3); err != nil {
		t.Error(err)
	}
}

// TestSecureNodeWantsAnIdentity: with TLS, a call without a verified
// certificate is UNAUTHENTICATED, whatever it calls.
func TestSecureNodeWantsAnIdentity(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: Config{Region: "us", TLS: &tls.Config{}}, logger: hclog.NewNullLogger()}
	err := n.authorizeCall(context.Background(), "/geolog.v1.Log/ListStreams")
	var e *apierr.Error
	if !errors.As(err, &e) || e.Code != apierr.Unauthenticated {
		t.Fatalf("call without a certificate: %v, want UNAUTHENTICATED", err)
	}
	if err := n.authorizeRaftPeer(context.Background(), 2); err == nil {
		t.Fatal("Raft stream without a certificate authorized")
	}
	if err := n.authorizeMirrorSource(context.Background(), "eu", 0); err == nil {
		t.Fatal("Mirror stream without a certificate authorized")
	}
}

// TestMethodPermsComplete walks every method a replicated node serves:
// each public one (a client principal may call it) has an entry in the
// permission table, and each entry is a served method. A public method
// left out of the table is refused to a client, whatever the policy.
func TestMethodPermsComplete(t *testing.T) {
	t.Parallel()
	w := newWorld(t, []string{"us", "eu"}, 1, 0, 0)
	served := map[string]bool{}
	for service, info := range w.nodes["us"][1].grpcServer.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + service + "/" + m.Name
			served[full] = true
			_, listed := methodPerms[full]
			switch public := classOf(full) == callPublic; {
			case public && !listed:
				t.Errorf("%s is public and has no entry in methodPerms: say what it needs", full)
			case !public && listed:
				t.Errorf("%s is for nodes only and has an entry in methodPerms", full)
			}
		}
	}
	for full, needsOf := range methodPerms {
		if !served[full] {
			t.Errorf("%s is in methodPerms and not served", full)
		}
		// Every entry copes with an empty or foreign request (a decoder
		// never hands one, but a table entry must not panic on it).
		if len(needsOf(nil)) == 0 {
			t.Errorf("%s needs no permission", full)
		}
	}
}
