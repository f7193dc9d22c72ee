package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// principalOf is the client principal cfg's certificate names.
func principalOf(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	id, err := pki.FromCertificate(leaf)
	if err != nil {
		t.Fatal(err)
	}
	return id.Principal
}

// listAclsCode is the gRPC code of ListAcls on every rule (admin on "*",
// which only a superuser holds here) at addr dialing with cfg.
func listAclsCode(t *testing.T, addr string, cfg *tls.Config) ([]*geologv1.AclRule, codes.Code) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(transportCreds(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := geologv1.NewAdminClient(conn).ListAcls(ctx, &geologv1.ListAclsRequest{})
	return resp.GetRules(), status.Code(err)
}

// checkSecured checks what LocalCluster sets up: every node with its own
// KEK file outside its data directory and a keyring in it; the harness's
// principal "chaos" no superuser (refused ListAcls on "*"), holding
// chaosGrants, which the superuser "operator" lists.
func checkSecured(t *testing.T, local *LocalCluster, chaosTLS *tls.Config) {
	t.Helper()
	for _, n := range local.Nodes() {
		name := n.Region + "-n" + strconv.Itoa(n.ID)
		st, err := os.Stat(filepath.Join(local.Dir(), "keks", name+".json"))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: KEK file: %v, %v (want mode 0600)", name, err, st)
		}
		if _, err := os.Stat(filepath.Join(local.Dir(), "data", name, "keys", "keyring.json")); err != nil {
			t.Errorf("%s: no keyring in its data directory (no encryption at rest?): %v", name, err)
		}
	}
	if p := principalOf(t, chaosTLS); p != chaosPrincipal {
		t.Fatalf("the harness dials as %q, want %q", p, chaosPrincipal)
	}
	addr := local.Nodes()[0].Addr
	if _, code := listAclsCode(t, addr, chaosTLS); code != codes.PermissionDenied {
		t.Errorf("ListAcls on * as %s: %v, want PermissionDenied (is it a superuser?)", chaosPrincipal, code)
	}
	rules, code := listAclsCode(t, addr, local.opTLS)
	if code != codes.OK {
		t.Fatalf("ListAcls as %s: %v", operatorPrincipal, code)
	}
	var got []string
	for _, r := range rules {
		if r.GetPrincipal() == chaosPrincipal {
			got = append(got, r.GetResource()+"="+strings.Join(r.GetPermissions(), ","))
		}
	}
	if len(got) != len(chaosGrants) {
		t.Errorf("rules of %s: %v, want %d (chaosGrants)", chaosPrincipal, got, len(chaosGrants))
	}
}
