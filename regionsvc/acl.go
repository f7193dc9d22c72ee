package regionsvc

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/vfs"
	"google.golang.org/grpc/metadata"
)

// Access rules (ACLs) in the replicated catalogue (docs/authz.md). A rule
// grants permissions on a resource pattern to a principal pattern; there
// is at most one per (principal, resource) pair, and every region holds
// the same ones:
//
//  1. The node a PutAcl or DeleteAcl reaches (the origin) gives the change
//     a version (its clock, its region, a random nonce) and commits it to
//     its region's catalogue: an "acl" record in the _meta Raft group,
//     proposed through the catalogue leader (forwarded to it, the version
//     kept, on NOT_LEADER); a node without replication applies it alone.
//  2. The origin then sends the change, with its version, to every other
//     region it knows (Config.Regions), marked propagated, as a stream
//     creation is; each commits it to its own catalogue. A region that
//     could not be reached makes the call UNAVAILABLE: the rule is in
//     force where it was committed, and making the call again completes it.
//  3. Every node applies committed changes to its RuleSet (authz): per
//     pair the change of greatest version wins, so regions that applied
//     the same changes in any order hold the same rules. A removal is
//     remembered (a tombstone) so that it beats an older creation that
//     arrives after it.
//  4. After each change applied, the node saves its rules (acls.json, with
//     the catalogue offset applied up to: after a restart the catalogue
//     replays from its start and the records below that offset are
//     skipped, so no rule removed before the restart is ever in force
//     again, even for a moment) and rebuilds its policy: Config.Authz's
//     superusers and rules, and the catalogue's. policy.set makes every
//     open stream decide its call again before its next message, so a
//     right removed cuts open subscriptions and append streams.
//
// Concurrent changes of one pair in two regions resolve to the one with
// the later clock (last writer wins) in every region.

// aclFile holds a node's applied rules inside its data directory.
const aclFile = "acls.json"

// aclVersionKey carries a change's version on a forwarded or propagated
// PutAcl or DeleteAcl (only nodes may set it: the interceptor refuses
// propagated and forwarded requests from clients).
const aclVersionKey = "x-geolog-acl-version"

// aclState is a node's rules; mu guards it.
type aclState struct {
	mu  sync.Mutex
	set authz.RuleSet
	// applied is the catalogue offset the saved rules cover (exclusive).
	applied uint64
	// changed is closed and replaced when a change is applied.
	changed chan struct{}
}

// aclChange is a change as the catalogue and acls.json hold it.
type aclChange struct {
	Principal string        `json:"principal"`
	Resource  string        `json:"resource"`
	Perms     []string      `json:"perms,omitempty"` // none: the rule is removed
	Version   authz.Version `json:"version"`
}

func toACLChange(c authz.Change) aclChange {
	out := aclChange{Principal: c.Rule.Principal, Resource: c.Rule.Resource, Version: c.Version}
	for _, p := range c.Rule.Perms.Perms() {
		out.Perms = append(out.Perms, p.String())
	}
	return out
}

// change checks a change read back (catalogue, file) as a request is.
func (a aclChange) change() (authz.Change, error) {
	var perms authz.Set
	for _, name := range a.Perms {
		p, err := authz.ParsePermission(name)
		if err != nil {
			return authz.Change{}, err
		}
		perms |= authz.Of(p)
	}
	c := authz.Change{Rule: authz.Rule{Principal: a.Principal, Resource: a.Resource, Perms: perms}, Version: a.Version}
	if c.Removed() {
		c.Rule.Perms = authz.Of(authz.Produce) // validate the patterns alone
	}
	if err := c.Rule.Validate(); err != nil {
		return authz.Change{}, err
	}
	c.Rule.Perms = perms
	return c, nil
}

type aclDisk struct {
	Version int         `json:"version"`
	Applied uint64      `json:"applied_offset"`
	Changes []aclChange `json:"changes"`
}

// loadACLs reads the rules this node applied before it stopped and sets
// its policy from them.
func (n *Node) loadACLs() error {
	n.acl.changed = make(chan struct{})
	b, err := vfs.ReadFile(n.cfg.fsys(), filepath.Join(n.cfg.DataDir, aclFile), catalogBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("regionsvc: read %s: %w", aclFile, err)
	}
	var d aclDisk
	if err := json.Unmarshal(b, &d); err != nil || d.Version != 1 {
		return fmt.Errorf("regionsvc: %s is corrupt or of another version: %v", aclFile, err)
	}
	for _, ac := range d.Changes {
		c, err := ac.change()
		if err != nil {
			return fmt.Errorf("regionsvc: %s holds an invalid rule: %w", aclFile, err)
		}
		n.acl.set.Apply(c)
	}
	n.acl.applied = d.Applied
	n.rebuildPolicyLocked() // no other goroutine yet
	return nil
}

// rebuildPolicyLocked sets the node's policy: Config.Authz and the
// catalogue's rules; n.acl.mu is held. With authorization off (no
// Config.Authz) nothing is decided and the rules are only kept.
func (n *Node) rebuildPolicyLocked() {
	if n.cfg.Authz == nil {
		return
	}
	p := n.acl.set.Policy(n.cfg.Authz.Superusers)
	p.Rules = append(append([]authz.Rule(nil), n.cfg.Authz.Rules...), p.Rules...)
	n.policy.set(p.Index())
}

// applyACL applies a committed change at catalogue offset at (0 and
// replicated false for a node without replication). In this order, under
// n.acl.mu: the rule set, the saved rules (a node without replication
// keeps them nowhere else), the policy, and then the waiters' wake-up (a
// change is answered only once it is in force here).
// The error is that of saving the rules.
func (n *Node) applyACL(at uint64, replicated bool, c authz.Change) error {
	n.acl.mu.Lock()
	defer n.acl.mu.Unlock()
	if replicated && at < n.acl.applied {
		return nil // applied and saved before a restart
	}
	if replicated {
		n.acl.applied = at + 1
	}
	changed := n.acl.set.Apply(c)
	d := aclDisk{Version: 1, Applied: n.acl.applied}
	for _, c := range n.acl.set.Changes() {
		d.Changes = append(d.Changes, toACLChange(c))
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err == nil {
		err = vfs.WriteFileAtomic(n.cfg.fsys(), filepath.Join(n.cfg.DataDir, aclFile), b, 0o600)
	}
	if err != nil {
		n.logger.Error("save the access rules", "error", err)
	}
	if changed {
		n.rebuildPolicyLocked()
		n.logger.Info("access rule changed", "principal", c.Rule.Principal, "resource", c.Rule.Resource,
			"perms", c.Rule.Perms.String(), "removed", c.Removed(), "version_region", c.Version.Region, "catalogue_offset", at)
	}
	close(n.acl.changed)
	n.acl.changed = make(chan struct{})
	return err
}

// applyACLRecord applies a catalogue "acl" record.
func (n *Node) applyACLRecord(at uint64, rec metaRecord) {
	if rec.ACL == nil {
		n.logger.Error("catalogue acl record without a rule; skipped", "offset", at)
		return
	}
	c, err := rec.ACL.change()
	if err != nil {
		n.logger.Error("catalogue acl record not valid; skipped", "offset", at, "error", err)
		return
	}
	// The catalogue keeps the change: the next start replays it.
	_ = n.applyACL(at, true, c)
}

// ruleFromProto checks a request's rule: INVALID_ARGUMENT if it is not
// valid.
func ruleFromProto(r *geologv1.AclRule) (authz.Rule, error) {
	if len(r.GetPermissions()) > 8 {
		return authz.Rule{}, apierr.New(apierr.InvalidArgument, "a rule lists %d permissions (at most 8)", len(r.GetPermissions()))
	}
	rule := authz.Rule{Principal: r.GetPrincipal(), Resource: r.GetResource()}
	for _, name := range r.GetPermissions() {
		p, err := authz.ParsePermission(name)
		if err != nil {
			return authz.Rule{}, apierr.New(apierr.InvalidArgument, "%.300v", err)
		}
		rule.Perms |= authz.Of(p)
	}
	if err := rule.Validate(); err != nil {
		return authz.Rule{}, apierr.New(apierr.InvalidArgument, "access rule: %.600v", err)
	}
	return rule, nil
}

func ruleToProto(c authz.Change) *geologv1.AclRule {
	r := &geologv1.AclRule{Principal: c.Rule.Principal, Resource: c.Rule.Resource,
		ChangedUnixNanos: c.Version.UnixNanos, ChangedInRegion: c.Version.Region}
	for _, p := range c.Rule.Perms.Perms() {
		r.Permissions = append(r.Permissions, p.String())
	}
	return r
}

// aclCall is where a change request comes from.
type aclCall struct {
	forwarded, propagated bool
}

func aclCallOf(ctx context.Context) aclCall {
	md, _ := metadata.FromIncomingContext(ctx)
	return aclCall{forwarded: len(md.Get(forwardedKey)) > 0, propagated: isPropagated(ctx)}
}

func (c aclCall) origin() bool { return !c.forwarded && !c.propagated }

// changeVersion is the version of a change request: the one a node sent
// with it, or a new one at the origin.
func (n *Node) changeVersion(ctx context.Context, call aclCall) (authz.Version, error) {
	if call.origin() {
		var b [8]byte
		crand.Read(b[:])
		return authz.Version{UnixNanos: n.cfg.Now().UnixNano(), Region: n.cfg.Region, Nonce: binary.LittleEndian.Uint64(b[:])}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(aclVersionKey)
	if len(vs) != 1 {
		return authz.Version{}, apierr.New(apierr.InvalidArgument, "a forwarded or propagated access rule change carries no version")
	}
	return parseACLVersion(vs[0])
}

func formatACLVersion(v authz.Version) string {
	return fmt.Sprintf("%d/%d/%s", v.UnixNanos, v.Nonce, v.Region)
}

func parseACLVersion(s string) (authz.Version, error) {
	parts := strings.SplitN(s, "/", 3)
	if len(parts) != 3 || len(parts[2]) == 0 || len(parts[2]) > 64 {
		return authz.Version{}, apierr.New(apierr.InvalidArgument, "access rule version %.100q is not valid", s)
	}
	nanos, err1 := strconv.ParseInt(parts[0], 10, 64)
	nonce, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return authz.Version{}, apierr.New(apierr.InvalidArgument, "access rule version %.100q is not valid", s)
	}
	return authz.Version{UnixNanos: nanos, Region: parts[2], Nonce: nonce}, nil
}

// putACL sets the rule of a pair in every region (step 1 and 2 above).
func (n *Node) putACL(ctx context.Context, req *geologv1.PutAclRequest) (*geologv1.PutAclResponse, error) {
	rule, err := ruleFromProto(req.GetRule())
	if err != nil {
		return nil, err
	}
	call := aclCallOf(ctx)
	if call.origin() {
		n.acl.mu.Lock()
		c, exists := n.acl.set.Get(rule.Principal, rule.Resource)
		full := n.acl.set.Len() >= authz.RulesMax && (!exists || c.Removed())
		n.acl.mu.Unlock()
		if full {
			return nil, apierr.New(apierr.LimitExceeded, "the cluster holds %d access rules, the most it keeps: remove one, or grant with a pattern", authz.RulesMax)
		}
	}
	v, err := n.changeVersion(ctx, call)
	if err != nil {
		return nil, err
	}
	c := authz.Change{Rule: rule, Version: v}
	if err := n.changeACL(ctx, call, c); err != nil {
		return nil, err
	}
	return &geologv1.PutAclResponse{Rule: ruleToProto(c)}, nil
}

// deleteACL removes the rule of a pair in every region.
func (n *Node) deleteACL(ctx context.Context, req *geologv1.DeleteAclRequest) (*geologv1.DeleteAclResponse, error) {
	probe := authz.Rule{Principal: req.GetPrincipal(), Resource: req.GetResource(), Perms: authz.Of(authz.Produce)}
	if err := probe.Validate(); err != nil {
		return nil, apierr.New(apierr.InvalidArgument, "access rule: %.600v", err)
	}
	call := aclCallOf(ctx)
	v, err := n.changeVersion(ctx, call)
	if err != nil {
		return nil, err
	}
	n.acl.mu.Lock()
	old, ok := n.acl.set.Get(probe.Principal, probe.Resource)
	n.acl.mu.Unlock()
	c := authz.Change{Rule: authz.Rule{Principal: probe.Principal, Resource: probe.Resource}, Version: v}
	if err := n.changeACL(ctx, call, c); err != nil {
		return nil, err
	}
	return &geologv1.DeleteAclResponse{Existed: ok && !old.Removed()}, nil
}

// listACLs lists the rules in force whose resource pattern req's covers.
func (n *Node) listACLs(req *geologv1.ListAclsRequest) (*geologv1.ListAclsResponse, error) {
	filter := req.GetResource()
	if filter == "" {
		filter = "*"
	}
	if err := authz.ValidatePattern(filter); err != nil {
		return nil, apierr.New(apierr.InvalidArgument, "resource: %.300v", err)
	}
	n.acl.mu.Lock()
	rules := n.acl.set.Rules()
	n.acl.mu.Unlock()
	resp := &geologv1.ListAclsResponse{}
	for _, c := range rules {
		if authz.Match(filter, c.Rule.Resource) {
			resp.Rules = append(resp.Rules, ruleToProto(c))
		}
	}
	return resp, nil
}

// changeACL commits c in this region and, from the origin, in every
// other region it knows.
func (n *Node) changeACL(ctx context.Context, call aclCall, c authz.Change) error {
	select {
	case <-n.closing:
		return apierr.New(apierr.ShuttingDown, "node is shutting down")
	default:
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := n.commitACL(ctx, call, c); err != nil {
		return err
	}
	if !call.origin() {
		return nil
	}
	var missing []string
	for region := range n.cfg.Regions {
		if region == n.cfg.Region {
			continue
		}
		if err := n.aclToRegion(ctx, region, c); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", region, err))
		}
	}
	if len(missing) > 0 {
		return apierr.New(apierr.Unavailable, "access rule changed in region %s, not yet in regions %v; making the change again completes it", n.cfg.Region, missing)
	}
	return nil
}

// aclToRegion sends c to a node of region, marked propagated.
func (n *Node) aclToRegion(ctx context.Context, region string, c authz.Change) error {
	ctx = metadata.AppendToOutgoingContext(ctx, aclVersionKey, formatACLVersion(c.Version))
	return n.propagateToRegion(ctx, region, func(cctx context.Context, addr string, _ geologv1.LogClient) error {
		conn, err := n.peerConn(addr) // the connection propagateToRegion made
		if err != nil {
			return err
		}
		return sendACLChange(cctx, geologv1.NewAdminClient(conn), c)
	})
}

func sendACLChange(ctx context.Context, ac geologv1.AdminClient, c authz.Change) error {
	var err error
	if c.Removed() {
		_, err = ac.DeleteAcl(ctx, &geologv1.DeleteAclRequest{Principal: c.Rule.Principal, Resource: c.Rule.Resource})
	} else {
		_, err = ac.PutAcl(ctx, &geologv1.PutAclRequest{Rule: ruleToProto(c)})
	}
	if err != nil {
		return rpcerr.FromError(err)
	}
	return nil
}

// commitACL commits c to this region's catalogue and waits until this
// node applied it (or a newer change of the pair).
func (n *Node) commitACL(ctx context.Context, call aclCall, c authz.Change) error {
	ac := toACLChange(c)
	res, err := n.proposeMeta(ctx, metaRecord{Op: "acl", ACL: &ac})
	if err != nil {
		return err
	}
	if res.err != nil {
		leader := n.region.meta.rep.LeaderID()
		e := apierr.As(res.err)
		if e.Code != apierr.NotLeader || call.forwarded || !n.catalogueLeaderUp() || leader == n.cfg.NodeID || n.peerAddr(leader) == "" {
			return res.err
		}
		// Not proposed, or superseded: forwarding the same version is
		// safe (a change applies once per version).
		if err := n.forwardACL(ctx, n.peerAddr(leader), c); err != nil {
			return err
		}
	}
	return n.waitACLApplied(ctx, c)
}

// forwardACL sends c, with its version, to the catalogue leader at addr.
func (n *Node) forwardACL(ctx context.Context, addr string, c authz.Change) error {
	conn, err := n.peerConn(addr)
	if err != nil {
		return apierr.Wrap(apierr.Unavailable, err, "forward to %s", addr)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, forwardedKey, "1", aclVersionKey, formatACLVersion(c.Version))
	return sendACLChange(ctx, geologv1.NewAdminClient(conn), c)
}

// waitACLApplied waits until this node holds c's version of its pair, or
// a newer one.
func (n *Node) waitACLApplied(ctx context.Context, c authz.Change) error {
	for {
		n.acl.mu.Lock()
		have, ok := n.acl.set.Get(c.Rule.Principal, c.Rule.Resource)
		changed := n.acl.changed
		n.acl.mu.Unlock()
		if ok && have.Version.Compare(c.Version) >= 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return apierr.Wrap(apierr.Timeout, ctx.Err(), "access rule change: committed, not yet applied here")
		}
	}
}

// The Admin service's access rule calls.

func (s *adminServer) PutAcl(ctx context.Context, req *geologv1.PutAclRequest) (*geologv1.PutAclResponse, error) {
	resp, err := s.node.putACL(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *adminServer) DeleteAcl(ctx context.Context, req *geologv1.DeleteAclRequest) (*geologv1.DeleteAclResponse, error) {
	resp, err := s.node.deleteACL(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *adminServer) ListAcls(ctx context.Context, req *geologv1.ListAclsRequest) (*geologv1.ListAclsResponse, error) {
	resp, err := s.node.listACLs(req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Anti-entropy: a region that missed a change (unreachable while it was
// made) gets it without anyone making the change again. Every
// aclSyncInterval, the catalogue leader of each region asks a node of
// every other region for its rules in force (ListAcls, as a node) and
// sends it, with their versions, the changes of its own that are newer
// than what that region holds: rules it lacks or holds older, removals of
// rules it still holds. Each region's leader does the same, so regions
// converge on the greatest version of every pair.

// aclSyncInterval is how often a catalogue leader compares its rules with
// the other regions' (a variable for tests).
var aclSyncInterval = 30 * time.Second

// aclSyncChangesMax bounds the changes one comparison sends to a region;
// the next comparison sends the rest.
const aclSyncChangesMax = 256

// runACLSync runs the comparisons until the node closes; aclSyncDone is
// closed when it returns.
func (n *Node) runACLSync() {
	defer close(n.aclSyncDone)
	base, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { // ends with the loop, at the latest
		select {
		case <-n.closing:
			stop()
		case <-base.Done():
		}
	}()
	t := time.NewTicker(aclSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-n.closing:
			return
		case <-t.C:
		}
		if !n.leadsCatalogue() {
			continue
		}
		for region := range n.cfg.Regions {
			if region == n.cfg.Region {
				continue
			}
			ctx, cancel := context.WithTimeout(base, aclSyncInterval)
			sent, err := n.syncACLs(ctx, region)
			cancel()
			switch {
			case err != nil:
				n.logger.Debug("access rules not compared with a region", "region", region, "error", err)
			case sent > 0:
				n.logger.Info("access rules sent to a region that missed them", "region", region, "changes", sent)
			}
			select {
			case <-n.closing:
				return
			default:
			}
		}
	}
}

// syncACLs sends region the changes it misses, and returns their count.
func (n *Node) syncACLs(ctx context.Context, region string) (int, error) {
	theirs := map[[2]string]authz.Version{}
	err := n.propagateToRegion(ctx, region, func(cctx context.Context, addr string, _ geologv1.LogClient) error {
		conn, err := n.peerConn(addr)
		if err != nil {
			return err
		}
		resp, err := geologv1.NewAdminClient(conn).ListAcls(cctx, &geologv1.ListAclsRequest{Resource: "*"})
		if err != nil {
			return rpcerr.FromError(err)
		}
		for _, r := range resp.GetRules() {
			theirs[[2]string{r.GetPrincipal(), r.GetResource()}] = authz.Version{UnixNanos: r.GetChangedUnixNanos(), Region: r.GetChangedInRegion()}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n.acl.mu.Lock()
	changes := n.acl.set.Changes()
	n.acl.mu.Unlock()
	sent := 0
	for _, c := range changes {
		have, ok := theirs[[2]string{c.Rule.Principal, c.Rule.Resource}]
		// ListAcls does not show the nonce: a change of the same time and
		// region is taken as the same change.
		mine := authz.Version{UnixNanos: c.Version.UnixNanos, Region: c.Version.Region}
		newer := !ok || mine.Compare(have) > 0
		if (c.Removed() && (!ok || !newer)) || (!c.Removed() && !newer) {
			continue
		}
		if sent == aclSyncChangesMax {
			break
		}
		if err := n.aclToRegion(ctx, region, c); err != nil {
			return sent, err
		}
		sent++
	}
	return sent, nil
}
