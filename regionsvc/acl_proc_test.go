package regionsvc_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc/metadata"
)

// TestACLProc: a region of three geologd processes with TLS,
// --superusers alice and --jwt-keys. alice grants carol produce on
// orders through one node; carol appends (through whichever node leads),
// bob is refused and writes nothing. A token whose sub is ci, granted
// consume, reads orders on every node, also on a node killed and started
// again (the rules are kept); once alice removes the rule, every node
// refuses it.
func TestACLProc(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	keys := filepath.Join(t.TempDir(), "jwt.pem")
	if err := os.WriteFile(keys, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	p := nodeproc.NewPKI(t)
	nodes := nodeproc.TLSRegion(t, p, "local", 3, "--superusers", "alice", "--jwt-keys", keys, "--jwt-issuer", "idp", "--jwt-audience", "geolog")
	clients := func(principal string) []geologv1.LogClient {
		var out []geologv1.LogClient
		for _, n := range nodes {
			out = append(out, geologv1.NewLogClient(nodeproc.Dial(t, n.Addr, p.ClientDir(principal))))
		}
		return out
	}
	alice, bob, carol := clients("alice"), clients("bob"), clients("carol")
	aliceAdmin := geologv1.NewAdminClient(nodeproc.Dial(t, nodes[0].Addr, p.ClientDir("alice")))
	waitFor(t, ctx, "stream created", func() bool {
		_, err := alice[0].CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "orders", RangeCount: 1})
		return err == nil || rpcerr.FromError(err).Code == apierr.StreamExists
	})
	// appendOn appends through the range's leader, whichever node it is.
	appendOn := func(cs []geologv1.LogClient, v string) error {
		for {
			for _, c := range cs {
				_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "orders", Records: []*geologv1.Record{{Value: []byte(v)}}})
				if e := rpcerr.FromError(err); err == nil || (e.Code != apierr.NotLeader && e.Code != apierr.Unavailable) {
					return err
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	grant := func(principal string, perms ...string) {
		waitFor(t, ctx, "rule for "+principal+" put", func() bool {
			_, err := aliceAdmin.PutAcl(ctx, &geologv1.PutAclRequest{Rule: &geologv1.AclRule{Principal: principal, Resource: "orders", Permissions: perms}})
			if err != nil {
				t.Logf("put: %v", err)
			}
			return err == nil
		})
	}
	grant("carol", "produce")
	// The node the grant went through has applied it; the range's leader
	// may be another node, which applies it a moment later.
	waitFor(t, ctx, "carol appends", func() bool {
		err := appendOn(carol, "by carol")
		if err != nil && rpcerr.FromError(err).Code != apierr.PermissionDenied {
			t.Fatalf("carol appends: %v", err)
		}
		return err == nil
	})
	if e := rpcerr.FromError(appendOn(bob, "by bob")); e == nil || e.Code != apierr.PermissionDenied {
		t.Fatalf("bob appends: %v, want PERMISSION_DENIED", e)
	}
	readAs := func(c geologv1.LogClient, ctx context.Context) ([]string, error) {
		r, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "orders", MaxRecords: 100})
		var vs []string
		for _, rec := range r.GetRecords() {
			vs = append(vs, string(rec.GetValue()))
		}
		return vs, err
	}
	waitFor(t, ctx, "alice reads carol's record alone", func() bool {
		vs, err := readAs(alice[0], ctx)
		return err == nil && strings.Join(vs, ",") == "by carol"
	})

	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": "ci", "iss": "idp", "aud": "geolog",
		"exp": time.Now().Add(time.Hour).Unix()}).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	ci := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	if _, err := readAs(bob[0], ci); rpcerr.FromError(err).Code != apierr.PermissionDenied {
		t.Fatalf("ci reads before its rule: %v, want PERMISSION_DENIED", err)
	}
	grant("jwt:ci", "consume")
	readsEverywhere := func(want apierr.Code) func() bool {
		return func() bool {
			for _, c := range bob {
				_, err := readAs(c, ci)
				if (err == nil) != (want == 0) || (err != nil && rpcerr.FromError(err).Code != want) {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, ctx, "ci reads on every node", readsEverywhere(0))
	nodes[1].Kill()
	nodes[1].Restart()
	waitFor(t, ctx, "ci reads on every node after a restart", readsEverywhere(0))
	waitFor(t, ctx, "rule for ci removed", func() bool {
		_, err := aliceAdmin.DeleteAcl(ctx, &geologv1.DeleteAclRequest{Principal: "jwt:ci", Resource: "orders"})
		return err == nil
	})
	waitFor(t, ctx, "every node refuses ci", readsEverywhere(apierr.PermissionDenied))
	if !strings.Contains(nodes[0].Output(), "principal=jwt:ci") {
		t.Error("no refusal logged with the token's principal")
	}
}
