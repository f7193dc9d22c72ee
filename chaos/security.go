package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// chaosGrants are the access rules of chaosPrincipal: exactly what the
// workload, the fault injector and the checkers call. Streams are named
// "chaos-<scenario>-<seed>-<time>" (Run), which the workload creates and
// the injector rehomes (admin on the prefix, not everything); groups
// "g-<stream>" (groupName); the group checker reads the cursor stream.
var chaosGrants = []*geologv1.AclRule{
	{Principal: chaosPrincipal, Resource: "chaos-*", Permissions: []string{"produce", "consume", "describe", "admin"}},
	{Principal: chaosPrincipal, Resource: "g-chaos-*", Permissions: []string{"group"}},
	{Principal: chaosPrincipal, Resource: cursorStream, Permissions: []string{"consume", "describe"}},
}

// grantChaos adds chaosGrants through the node at addr as the superuser
// (opTLS). PutAcl returns once every region has the rules; a node that
// just started may refuse for a moment (catalogue catching up), so each
// rule is tried again for up to a minute (not after PERMISSION_DENIED or
// INVALID_ARGUMENT).
func grantChaos(ctx context.Context, addr string, opTLS *tls.Config) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(transportCreds(opTLS)))
	if err != nil {
		return fmt.Errorf("chaos: grants: %w", err)
	}
	defer conn.Close()
	admin := geologv1.NewAdminClient(conn)
	for _, rule := range chaosGrants {
		var lastErr error
		fatal := false
		err := waitFor(ctx, time.Minute, func() bool {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, lastErr = admin.PutAcl(cctx, &geologv1.PutAclRequest{Rule: rule})
			if c := status.Code(lastErr); c == codes.PermissionDenied || c == codes.InvalidArgument {
				fatal = true // asking again gets the same answer
			}
			return lastErr == nil || fatal
		})
		if fatal {
			err = lastErr
		}
		if err != nil {
			return fmt.Errorf("chaos: grant %s on %s to %s: %v (last: %v)", rule.Permissions, rule.Resource, rule.Principal, err, lastErr)
		}
	}
	return nil
}

// makeKEK makes node n's KEK file, dir/keks/<region>-n<i>.json (mode
// 0600, outside the node's data directory, as docs/security.md asks of a
// KEK), and returns its path. An existing file is kept: a restarted node
// needs the KEK its keyring is wrapped under.
func makeKEK(dir string, n NodeRef) (string, error) {
	keks := filepath.Join(dir, "keks")
	if err := os.MkdirAll(keks, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(keks, n.Region+"-n"+strconv.Itoa(n.ID)+".json")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if _, err := atrest.AddKEK(path); err != nil {
		return "", fmt.Errorf("chaos: KEK of %s: %w", n, err)
	}
	return path, nil
}

// asChaosPrincipal returns the TLS configuration of principal "chaos" for
// a cluster whose client certificate folder is certsDir (dialing with
// envTLS): envTLS itself when it already names "chaos" or when no CA key
// lies beside certsDir (certsDir/../ca/ca.key); otherwise a "chaos"
// certificate issued under certsDir/../chaos (kept if there), granted
// chaosGrants through addr as envTLS's principal.
func asChaosPrincipal(ctx context.Context, certsDir string, envTLS *tls.Config, addr string) (*tls.Config, error) {
	if len(envTLS.Certificates) == 0 || len(envTLS.Certificates[0].Certificate) == 0 {
		return envTLS, nil
	}
	leaf, err := x509.ParseCertificate(envTLS.Certificates[0].Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("GEOLOG_CERTS_DIR: %w", err)
	}
	if id, err := pki.FromCertificate(leaf); err != nil || id.Principal == chaosPrincipal {
		return envTLS, err
	}
	root := filepath.Dir(filepath.Clean(certsDir))
	caCert, caKey := filepath.Join(root, "ca", pki.CACertFile), filepath.Join(root, "ca", pki.CAKeyFile)
	if _, err := os.Stat(caKey); err != nil {
		return envTLS, nil
	}
	dir := filepath.Join(root, chaosPrincipal)
	certFile, keyFile := filepath.Join(dir, pki.ClientCertFile), filepath.Join(dir, pki.ClientKeyFile)
	if _, err := os.Stat(certFile); err != nil {
		ca, err := pki.LoadAuthority(caCert, caKey)
		if err != nil {
			return nil, err
		}
		pair, err := pki.CreateClient(ca, chaosPrincipal, pki.Options{})
		if err == nil {
			err = pki.WriteCACopy(filepath.Join(dir, pki.CACertFile), ca.CertPEM, true)
		}
		if err == nil {
			err = pki.WritePair(certFile, keyFile, pair, true)
		}
		if err != nil {
			return nil, fmt.Errorf("the chaos principal's certificate: %w", err)
		}
	}
	if err := grantChaos(ctx, addr, envTLS); err != nil {
		return nil, err
	}
	return pki.ClientConfig(filepath.Join(dir, pki.CACertFile), certFile, keyFile, "")
}
