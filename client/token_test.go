package client_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
)

// TestBearerTokenOption: a client with BearerToken is decided as the
// token's principal by a TLS node that verifies tokens (alice's
// certificate alone may not append; with a token for ci, granted by a
// rule for jwt:ci, she may); New refuses a token without TLS.
func TestBearerTokenOption(t *testing.T) {
	if _, err := client.New("127.0.0.1:1", client.BearerToken("x")); err == nil {
		t.Fatal("a bearer token without TLS accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	tokens, err := authz.NewTokenVerifier(authz.TokenConfig{KeysPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})})
	if err != nil {
		t.Fatal(err)
	}
	p := nodeproc.NewPKI(t)
	dir := p.NodeDir("local", 1)
	files, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(dir, pki.CACertFile),
		CertFile: filepath.Join(dir, pki.NodeCertFile), KeyFile: filepath.Join(dir, pki.NodeKeyFile)})
	if err != nil {
		t.Fatal(err)
	}
	n, err := regionsvc.New(regionsvc.Config{DataDir: t.TempDir(), ListenAddr: portlock.Addr(t), Fsync: segment.FsyncNever,
		TLS: files.ServerTLS(), Authz: &authz.Policy{Superusers: []string{"root"}}, Tokens: tokens,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: testWriter{t}})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	root := nodeproc.Dial(t, n.Addr(), p.ClientDir("root"))
	if _, err := geologv1.NewLogClient(root).CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "s", RangeCount: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := geologv1.NewAdminClient(root).PutAcl(ctx, &geologv1.PutAclRequest{Rule: &geologv1.AclRule{Principal: "jwt:ci", Resource: "s", Permissions: []string{"produce"}}}); err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": "ci", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := nodeproc.ClientTLS(t, p.ClientDir("alice"))
	appendOne := func(opts ...client.Opt) error {
		c, err := client.New(n.Addr(), append(opts, client.TLSConfig(tlsCfg), client.RetriesMax(0))...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.API().Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: []*geologv1.Record{{Value: []byte("v")}}})
		return err
	}
	if err := appendOne(); rpcerr.FromError(err).Code != apierr.PermissionDenied {
		t.Fatalf("alice without a token: %v, want PERMISSION_DENIED", err)
	}
	if err := appendOne(client.BearerToken(tok)); err != nil {
		t.Fatalf("alice with ci's token: %v", err)
	}
	if err := appendOne(client.BearerToken(tok + "x")); rpcerr.FromError(err).Code != apierr.Unauthenticated {
		t.Fatalf("a forged token: %v, want UNAUTHENTICATED", err)
	}
}
