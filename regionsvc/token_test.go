package regionsvc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/golang-jwt/jwt/v5"
	"github.com/hashicorp/go-hclog"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// testIssuer signs tokens with an ECDSA key and verifies them on a clock
// the test moves.
type testIssuer struct {
	key      *ecdsa.PrivateKey
	clock    atomic.Int64 // Unix seconds
	verifier *authz.TokenVerifier
}

func newTestIssuer(t *testing.T) *testIssuer {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	is := &testIssuer{key: key}
	is.clock.Store(time.Now().Unix())
	is.verifier, err = authz.NewTokenVerifier(authz.TokenConfig{KeysPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}),
		Leeway: time.Second, Now: func() time.Time { return time.Unix(is.clock.Load(), 0) }})
	if err != nil {
		t.Fatal(err)
	}
	return is
}

func (is *testIssuer) token(t *testing.T, sub string, ttl time.Duration) string {
	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": sub, "exp": is.clock.Load() + int64(ttl/time.Second)}).SignedString(is.key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func bearer(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// TestBearerTokens: a call with a valid token is decided as "jwt:<sub>",
// whatever the client certificate names; expired, foreign-signed and
// unsigned tokens, a malformed header, and a token with a node's
// certificate are UNAUTHENTICATED, and nothing is written; a
// subscription opened with a token ends when the token expires.
func TestBearerTokens(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	is := newTestIssuer(t)
	w := newACLWorld(t, []string{"us"}, 1, is.verifier)
	w.createStream(ctx, "s")
	rootLog, rootAdmin := w.as("root", "us", 1)
	if err := putACLRule(ctx, rootAdmin, "jwt:ci", "s", "produce", "consume"); err != nil {
		t.Fatal(err)
	}
	aliceLog, _ := w.as("alice", "us", 1)
	good := is.token(t, "ci", time.Hour)
	if err := aclAppend(bearer(ctx, good), aliceLog, "s", "ci"); err != nil {
		t.Fatalf("append with a valid token: %v", err)
	}
	wantACLCode(t, "alice's certificate alone", aclAppend(ctx, aliceLog, "s", "alice"), apierr.PermissionDenied)
	wantACLCode(t, "a token for another subject", aclAppend(bearer(ctx, is.token(t, "other", time.Hour)), aliceLog, "s", "other"), apierr.PermissionDenied)

	other := newTestIssuer(t)
	other.clock.Store(is.clock.Load())
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "ci", "exp": is.clock.Load() + 3600}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	for what, ctx := range map[string]context.Context{
		"an expired token":       bearer(ctx, is.token(t, "ci", -time.Minute)),
		"a token of another key": bearer(ctx, other.token(t, "ci", time.Hour)),
		"an unsigned token":      bearer(ctx, none),
		"a signature cut off":    bearer(ctx, good[:strings.LastIndex(good, ".")+1]),
		"a Basic header":         metadata.AppendToOutgoingContext(ctx, "authorization", "Basic Y2k6cHc="),
		"two tokens":             metadata.AppendToOutgoingContext(bearer(ctx, good), "authorization", "Bearer "+good),
	} {
		wantACLCode(t, what, aclAppend(ctx, aliceLog, "s", what), apierr.Unauthenticated)
	}
	nodeLog := geologv1.NewLogClient(nodeproc.Dial(t, w.addrs["us"][1], w.pki.NodeDir("us", 2)))
	wantACLCode(t, "a node's certificate with a token", aclAppend(bearer(ctx, good), nodeLog, "s", "node"), apierr.Unauthenticated)
	if got := aclValues(t, ctx, rootLog, "s"); len(got) != 1 || got[0] != "ci" {
		t.Fatalf("s holds %v, want the one record of the valid token", got)
	}

	// A subscription outlives nothing: the token's expiry ends it.
	sub, err := aliceLog.Subscribe(bearer(ctx, is.token(t, "ci", time.Hour)), &geologv1.SubscribeRequest{Stream: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := sub.Recv(); err != nil || len(m.GetRecords()) == 0 {
		t.Fatalf("subscription: %v %v", m, err)
	}
	is.clock.Add(7200)
	if err := aclAppend(ctx, rootLog, "s", "after expiry"); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.Recv()
		if err != nil {
			wantACLCode(t, "the subscription after its token expired", err, apierr.Unauthenticated)
			break
		}
		if len(m.GetRecords()) > 0 {
			t.Fatal("a record reached the subscription after its token expired")
		}
	}
}

// TestTokenNeedsTLS: a node serving plaintext refuses a call that carries
// a bearer token (the secret went in the clear).
func TestTokenNeedsTLS(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: Config{Region: "us"}, logger: hclog.NewNullLogger()}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer x.y.z"))
	_, err := n.authenticateToken(ctx, geologv1.Log_Append_FullMethodName)
	if rpcerr.CodeOf(err) != apierr.Unauthenticated {
		t.Fatalf("token over plaintext: %v, want UNAUTHENTICATED", err)
	}
	if got, err := n.authenticateToken(context.Background(), geologv1.Log_Append_FullMethodName); err != nil || got == nil {
		t.Fatalf("no token over plaintext: %v", err)
	}
}

// TestRefusalsCounted: a refused token and a refused permission are
// counted in geolog.auth.refused_calls by code, method and reason, and
// by no principal (the label set stays bounded whoever calls).
func TestRefusalsCounted(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	am, err := newAuthMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	is := newTestIssuer(t)
	n := authzNode(&authz.Policy{})
	n.cfg.Tokens, n.authMetrics = is.verifier, am
	for _, sub := range []string{"a", "b", "c"} {
		ctx := metadata.NewIncomingContext(callerCtx(t, pki.ClientIdentity("alice")), metadata.Pairs("authorization", "Bearer "+is.token(t, sub, -time.Hour)))
		if _, err := n.authenticateToken(ctx, geologv1.Log_Append_FullMethodName); rpcerr.CodeOf(err) != apierr.Unauthenticated {
			t.Fatalf("expired token: %v", err)
		}
	}
	wantDenied(t, "no rule", n.authorizeRequest(callerCtx(t, pki.ClientIdentity("bob")), geologv1.Log_Read_FullMethodName, &geologv1.ReadRequest{Stream: "s"}))
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			d, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "geolog.auth.refused_calls" || !ok {
				continue
			}
			for _, p := range d.DataPoints {
				var keys []string
				for _, kv := range p.Attributes.ToSlice() {
					keys = append(keys, string(kv.Key)+"="+kv.Value.AsString())
				}
				got[strings.Join(keys, " ")] += p.Value
			}
		}
	}
	want := map[string]int64{
		"code=ERROR_CODE_UNAUTHENTICATED method=/geolog.v1.Log/Append reason=bad token":     3,
		"code=ERROR_CODE_PERMISSION_DENIED method=/geolog.v1.Log/Read reason=no permission": 1,
	}
	if len(got) != len(want) {
		t.Fatalf("refused_calls %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("refused_calls %v, want %v", got, want)
		}
	}
}

// TestTokenWithoutCertificate: on a node that accepts tokens, a client
// with no certificate of its own (it trusts the CA only) is decided on its
// token alone: allowed what its rules grant, UNAUTHENTICATED without a
// token or with a bad one, and refused every internal service even with a
// valid token; nothing it was refused is written.
func TestTokenWithoutCertificate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	is := newTestIssuer(t)
	w := newACLWorld(t, []string{"us"}, 1, is.verifier)
	w.createStream(ctx, "s")
	rootLog, rootAdmin := w.as("root", "us", 1)
	if err := putACLRule(ctx, rootAdmin, "jwt:app", "s", "produce", "consume"); err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := pki.ClientConfig(filepath.Join(w.pki.ClientDir("root"), pki.CACertFile), "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+w.addrs["us"][1], grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	anon := geologv1.NewLogClient(conn)
	good := is.token(t, "app", time.Hour)
	waitUntil(t, ctx, time.Minute, "the rule in force", func() bool {
		return aclAppend(bearer(ctx, good), anon, "s", "app") == nil
	})
	wantACLCode(t, "no certificate, no token", aclAppend(ctx, anon, "s", "nobody"), apierr.Unauthenticated)
	wantACLCode(t, "no certificate, an expired token", aclAppend(bearer(ctx, is.token(t, "app", -time.Minute)), anon, "s", "expired"), apierr.Unauthenticated)
	wantACLCode(t, "no certificate, another subject", aclAppend(bearer(ctx, is.token(t, "other", time.Hour)), anon, "s", "other"), apierr.PermissionDenied)
	_, err = geologv1.NewAdminClient(conn).RefreshHomes(bearer(ctx, good), &geologv1.RefreshHomesRequest{})
	wantACLCode(t, "an internal call (RefreshHomes) with a token and no certificate", err, apierr.Unauthenticated)
	fwd := metadata.AppendToOutgoingContext(bearer(ctx, good), forwardedKey, "1")
	wantACLCode(t, "a public call with a node's header, a token and no certificate", aclAppend(fwd, anon, "s", "forwarded"), apierr.Unauthenticated)
	got := aclValues(t, ctx, rootLog, "s")
	if len(got) != 1 || got[0] != "app" {
		t.Fatalf("s holds %v, want the one record of the token client", got)
	}
}
