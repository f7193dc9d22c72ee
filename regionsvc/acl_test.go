package regionsvc

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
)

// aclWorld is a world of TLS nodes with authorization on ("root" is the
// only superuser) and, if tokens is set, bearer tokens accepted.
type aclWorld struct {
	*world
	pki *nodeproc.PKI
}

func newACLWorld(t *testing.T, regions []string, size int, tokens *authz.TokenVerifier) *aclWorld {
	a := &aclWorld{pki: nodeproc.NewPKI(t)}
	a.world = newWorldWith(t, regions, size, 0, 0, nil, func(region string, id uint64, cfg *Config) {
		dir := a.pki.NodeDir(region, id)
		files, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(dir, pki.CACertFile),
			CertFile: filepath.Join(dir, pki.NodeCertFile), KeyFile: filepath.Join(dir, pki.NodeKeyFile)})
		if err != nil {
			t.Fatal(err)
		}
		cfg.TLS, cfg.ClientCredentials = files.ServerTLS(), files.ClientCredentials(pki.RequireNode)
		if tokens != nil {
			cfg.TLS = files.ServerTLSClientCertOptional() // as geologd --jwt-keys
		}
		cfg.Authz, cfg.Tokens = &authz.Policy{Superusers: []string{"root"}}, tokens
	})
	return a
}

// as returns the Log and Admin clients of principal on a node.
func (a *aclWorld) as(principal, region string, id uint64) (geologv1.LogClient, geologv1.AdminClient) {
	conn := nodeproc.Dial(a.t, a.addrs[region][id], a.pki.ClientDir(principal))
	return geologv1.NewLogClient(conn), geologv1.NewAdminClient(conn)
}

// createStream creates a stream of one range placed in every region and
// homed in the first, as root, once the nodes are ready.
func (a *aclWorld) createStream(ctx context.Context, name string) {
	a.t.Helper()
	root, _ := a.as("root", a.regions[0], 1)
	waitUntil(a.t, ctx, time.Minute, "stream "+name+" created", func() bool {
		_, err := root.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: name, RangeCount: 1, Regions: a.regions, HomeRegion: a.regions[0]})
		return err == nil || rpcerr.FromError(err).Code == apierr.StreamExists
	})
}

func putACLRule(ctx context.Context, ac geologv1.AdminClient, principal, resource string, perms ...string) error {
	_, err := ac.PutAcl(ctx, &geologv1.PutAclRequest{Rule: &geologv1.AclRule{Principal: principal, Resource: resource, Permissions: perms}})
	return err
}

func aclAppend(ctx context.Context, lc geologv1.LogClient, stream, v string) error {
	_, err := lc.Append(ctx, &geologv1.AppendRequest{Stream: stream, Records: []*geologv1.Record{{Value: []byte(v)}}})
	return err
}

// aclAppendAny appends v to stream through the first of clients that is
// the range's leader.
func aclAppendAny(ctx context.Context, stream, v string, clients ...geologv1.LogClient) error {
	var err error
	for range 100 {
		for _, lc := range clients {
			if err = aclAppend(ctx, lc, stream, v); err == nil || rpcerr.FromError(err).Code != apierr.NotLeader {
				return err
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

func wantACLCode(t *testing.T, what string, err error, code apierr.Code) {
	t.Helper()
	if e := rpcerr.FromError(err); e == nil || e.Code != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

func aclValues(t *testing.T, ctx context.Context, lc geologv1.LogClient, stream string) []string {
	t.Helper()
	r, err := lc.Read(ctx, &geologv1.ReadRequest{Stream: stream, MaxRecords: 100})
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	var out []string
	for _, rec := range r.GetRecords() {
		out = append(out, string(rec.GetValue()))
	}
	return out
}

// TestACLGrantsProduce: in a region of two nodes, a rule from the
// catalogue lets alice append to s and read it; bob, without a rule, is
// refused and nothing he sends is written; alice is refused on t. Rules
// are validated (INVALID_ARGUMENT), changed only with admin on their
// resource, and after a restart the node holds what it held before (a
// removed rule stays removed).
func TestACLGrantsProduce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newACLWorld(t, []string{"us"}, 2, nil)
	w.createStream(ctx, "s")
	w.createStream(ctx, "t")
	rootLog, rootAdmin := w.as("root", "us", 1)
	// Sent to each node: one of them is not the catalogue leader and
	// forwards.
	_, admin2 := w.as("root", "us", 2)
	if err := putACLRule(ctx, rootAdmin, "alice", "s", "produce"); err != nil {
		t.Fatalf("put: %v", err)
	}
	if err := putACLRule(ctx, admin2, "alice", "s", "produce", "consume"); err != nil {
		t.Fatalf("put through node 2: %v", err)
	}
	alice1, _ := w.as("alice", "us", 1)
	alice2, _ := w.as("alice", "us", 2)
	for id := uint64(1); id <= 2; id++ {
		// The range's leader takes the append (a follower answers
		// NOT_LEADER, after the interceptor let the call through).
		if err := aclAppendAny(ctx, "s", "alice", alice1, alice2); err != nil {
			t.Fatalf("alice appends to s: %v", err)
		}
		aliceLog, _ := w.as("alice", "us", id)
		bobLog, _ := w.as("bob", "us", id)
		waitUntil(t, ctx, time.Minute, "alice reads her records", func() bool { return len(aclValues(t, ctx, aliceLog, "s")) == int(id) })
		wantACLCode(t, "bob appends to s", aclAppend(ctx, bobLog, "s", "bob"), apierr.PermissionDenied)
		wantACLCode(t, "alice appends to t", aclAppend(ctx, aliceLog, "t", "alice"), apierr.PermissionDenied)
	}
	if got := aclValues(t, ctx, rootLog, "s"); len(got) != 2 || got[0] != "alice" || got[1] != "alice" {
		t.Fatalf("s holds %v, want alice's two records only", got)
	}
	if got := aclValues(t, ctx, rootLog, "t"); len(got) != 0 {
		t.Fatalf("t holds %v, want nothing", got)
	}

	// Validation.
	for _, bad := range []*geologv1.AclRule{
		{Principal: "alice", Resource: "s*x", Permissions: []string{"produce"}},
		{Principal: "", Resource: "s", Permissions: []string{"produce"}},
		{Principal: "alice", Resource: "s", Permissions: []string{"write"}},
		{Principal: "alice", Resource: "s"},
		{Principal: "a\x00", Resource: "s", Permissions: []string{"produce"}},
	} {
		_, err := rootAdmin.PutAcl(ctx, &geologv1.PutAclRequest{Rule: bad})
		wantACLCode(t, "put "+bad.String(), err, apierr.InvalidArgument)
	}
	// Changing rules takes admin on the rule's resource.
	_, aliceAdmin := w.as("alice", "us", 1)
	wantACLCode(t, "alice grants without admin", putACLRule(ctx, aliceAdmin, "bob", "s", "consume"), apierr.PermissionDenied)
	if err := putACLRule(ctx, rootAdmin, "alice", "s*", "admin"); err != nil {
		t.Fatal(err)
	}
	if err := putACLRule(ctx, aliceAdmin, "bob", "s", "consume"); err != nil {
		t.Fatalf("alice, admin on s*, grants on s: %v", err)
	}
	wantACLCode(t, "alice grants on *", putACLRule(ctx, aliceAdmin, "bob", "*", "consume"), apierr.PermissionDenied)
	wantACLCode(t, "alice lists every rule", func() error { _, err := aliceAdmin.ListAcls(ctx, &geologv1.ListAclsRequest{}); return err }(), apierr.PermissionDenied)
	if _, err := aliceAdmin.DeleteAcl(ctx, &geologv1.DeleteAclRequest{Principal: "bob", Resource: "s"}); err != nil {
		t.Fatal(err)
	}
	list, err := rootAdmin.ListAcls(ctx, &geologv1.ListAclsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetRules()) != 2 || list.GetRules()[0].GetResource() != "s" || list.GetRules()[1].GetResource() != "s*" {
		t.Fatalf("rules %v, want alice's on s and s*", list.GetRules())
	}
	if got := list.GetRules()[0].GetPermissions(); len(got) != 2 || got[0] != "produce" || got[1] != "consume" {
		t.Fatalf("alice's rule on s grants %v, want produce, consume (the second put replaced the first)", got)
	}

	// A restart keeps the rules, and bob's removed one stays removed.
	w.stop("us", 1)
	w.start("us", 1)
	n := w.nodes["us"][1]
	if !n.policy.p.Load().Allows("alice", authz.Produce, "s") || n.policy.p.Load().Allows("bob", authz.Consume, "s") {
		t.Fatal("after a restart the node's policy differs from before")
	}
	// The catalogue replays every record; the node must end where it was.
	n.acl.mu.Lock()
	saved := n.acl.applied
	n.acl.mu.Unlock()
	waitUntil(t, ctx, time.Minute, "the catalogue replayed past the saved rules", func() bool {
		return saved > 0 && n.region.metaApplied.Load() >= saved
	})
	if n.acl.set.Len() != 2 || n.policy.p.Load().Allows("bob", authz.Consume, "s") {
		t.Fatalf("after the replay: %v", n.acl.set.Rules())
	}
}

// TestACLInEveryRegion: a rule added in one region takes effect in the
// other; a principal without one is refused in both and writes nothing
// to either; a rule removed in the other region goes in the first.
func TestACLInEveryRegion(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newACLWorld(t, []string{"us", "eu"}, 1, nil)
	w.createStream(ctx, "s")
	_, usAdmin := w.as("root", "us", 1)
	_, euAdmin := w.as("root", "eu", 1)
	usAlice, _ := w.as("alice", "us", 1)
	euAlice, _ := w.as("alice", "eu", 1)
	read := func(lc geologv1.LogClient) error {
		_, err := lc.Read(ctx, &geologv1.ReadRequest{Stream: "s", MaxRecords: 1})
		return err
	}
	wantACLCode(t, "alice reads in eu before the rule", read(euAlice), apierr.PermissionDenied)
	if err := putACLRule(ctx, usAdmin, "alice", "s", "consume"); err != nil {
		t.Fatalf("put in us: %v", err)
	}
	// The put returned once every region committed it.
	if err := read(euAlice); err != nil {
		t.Fatalf("alice reads in eu after the rule was added in us: %v", err)
	}
	// bob, without a rule, is refused in both regions, and the log is the
	// same in both: root's one record.
	usRoot, _ := w.as("root", "us", 1)
	if err := aclAppend(ctx, usRoot, "s", "root"); err != nil {
		t.Fatal(err)
	}
	for _, region := range w.regions {
		bob, _ := w.as("bob", region, 1)
		wantACLCode(t, "bob appends in "+region, aclAppend(ctx, bob, "s", "bob"), apierr.PermissionDenied)
	}
	waitUntil(t, ctx, time.Minute, "eu mirrors root's record", func() bool { return len(aclValues(t, ctx, euAlice, "s")) == 1 })
	for _, lc := range []geologv1.LogClient{usAlice, euAlice} {
		if got := aclValues(t, ctx, lc, "s"); len(got) != 1 || got[0] != "root" {
			t.Fatalf("s holds %v, want root's record alone", got)
		}
	}
	if _, err := euAdmin.DeleteAcl(ctx, &geologv1.DeleteAclRequest{Principal: "alice", Resource: "s"}); err != nil {
		t.Fatalf("delete in eu: %v", err)
	}
	wantACLCode(t, "alice reads in us after the rule was removed in eu", read(usAlice), apierr.PermissionDenied)
	for _, region := range w.regions {
		n := w.nodes[region][1]
		n.acl.mu.Lock()
		c, ok := n.acl.set.Get("alice", "s")
		n.acl.mu.Unlock()
		if !ok || !c.Removed() || c.Version.Region != "eu" {
			t.Errorf("%s holds %+v for alice on s, want eu's removal", region, c)
		}
	}
}

// TestACLRemovalCutsSubscription: removing alice's consume right ends
// her open subscription with PERMISSION_DENIED before its next record.
func TestACLRemovalCutsSubscription(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newACLWorld(t, []string{"us"}, 1, nil)
	w.createStream(ctx, "s")
	rootLog, rootAdmin := w.as("root", "us", 1)
	if err := putACLRule(ctx, rootAdmin, "alice", "s", "consume"); err != nil {
		t.Fatal(err)
	}
	aliceLog, _ := w.as("alice", "us", 1)
	sub, err := aliceLog.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if err := aclAppend(ctx, rootLog, "s", "first"); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.Recv(); err != nil || len(m.GetRecords()) == 0 {
		t.Fatalf("first record: %v %v", m, err)
	}
	if _, err := rootAdmin.DeleteAcl(ctx, &geologv1.DeleteAclRequest{Principal: "alice", Resource: "s"}); err != nil {
		t.Fatal(err)
	}
	if err := aclAppend(ctx, rootLog, "s", "second"); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.Recv()
		if err != nil {
			wantACLCode(t, "the subscription after the right was removed", err, apierr.PermissionDenied)
			return
		}
		for _, r := range m.GetRecords() {
			if string(r.GetValue()) == "second" {
				t.Fatal("the record appended after the right was removed reached the subscription")
			}
		}
	}
}

// TestACLSyncCompletesAMissedRegion: a rule put while the other region is
// cut off is refused as UNAVAILABLE (in force where it was committed);
// once the link is back, the catalogue leaders' comparison brings it
// there, and a removal made while cut off as well, without anyone making
// the changes again.
func TestACLSyncCompletesAMissedRegion(t *testing.T) {
	// Not parallel: it sets the package's aclSyncInterval.
	// Restored in a cleanup registered before the world's, so it runs
	// after the nodes (whose ACL sync loops read it) are closed.
	was := aclSyncInterval
	t.Cleanup(func() { aclSyncInterval = was })
	aclSyncInterval = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newACLWorld(t, []string{"us", "eu"}, 1, nil)
	w.createStream(ctx, "s")
	_, usAdmin := w.as("root", "us", 1)
	if err := putACLRule(ctx, usAdmin, "bob", "s", "consume"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.net.CutRegion("eu", wan.CutReset); err != nil {
		t.Fatal(err)
	}
	wantACLCode(t, "put while eu is cut off", putACLRule(ctx, usAdmin, "alice", "s", "consume"), apierr.Unavailable)
	if _, err := usAdmin.DeleteAcl(ctx, &geologv1.DeleteAclRequest{Principal: "bob", Resource: "s"}); rpcerr.FromError(err).Code != apierr.Unavailable {
		t.Fatalf("delete while eu is cut off: %v, want UNAVAILABLE", err)
	}
	eu := w.nodes["eu"][1]
	if eu.policy.p.Load().Allows("alice", authz.Consume, "s") || !eu.policy.p.Load().Allows("bob", authz.Consume, "s") {
		t.Fatal("eu has the changes made while it was cut off")
	}
	if err := w.net.HealAll(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, time.Minute, "eu holds the changes it missed", func() bool {
		p := eu.policy.p.Load()
		return p.Allows("alice", authz.Consume, "s") && !p.Allows("bob", authz.Consume, "s")
	})
	euAlice, _ := w.as("alice", "eu", 1)
	if _, err := euAlice.Read(ctx, &geologv1.ReadRequest{Stream: "s", MaxRecords: 1}); err != nil {
		t.Fatalf("alice reads in eu: %v", err)
	}
}
