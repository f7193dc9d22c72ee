package authz

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func publicPEM(t *testing.T, key crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func sign(t *testing.T, m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTokenVerifier: tokens signed by a configured key with each accepted
// algorithm name "jwt:<sub>"; expired, not yet valid, foreign-signed,
// unsigned (alg none), HMAC-signed with the public key as the secret,
// wrong issuer or audience, and bad subjects are refused.
func TestTokenVerifier(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPub, edKey, _ := ed25519.GenerateKey(rand.Reader)
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPEM := publicPEM(t, &ecKey.PublicKey)
	keys := append(append(publicPEM(t, &rsaKey.PublicKey), ecPEM...), publicPEM(t, edPub)...)
	v, err := NewTokenVerifier(TokenConfig{KeysPEM: keys, Issuer: "idp", Audience: "geolog", Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	claims := func(mut func(jwt.MapClaims)) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "ci-bot", "iss": "idp", "aud": "geolog", "exp": now.Add(time.Hour).Unix()}
		if mut != nil {
			mut(c)
		}
		return c
	}
	for name, tok := range map[string]string{
		"RS256": sign(t, jwt.SigningMethodRS256, rsaKey, claims(nil)),
		"ES256": sign(t, jwt.SigningMethodES256, ecKey, claims(nil)),
		"EdDSA": sign(t, jwt.SigningMethodEdDSA, edKey, claims(nil)),
		// Expired 10 s ago: within the leeway.
		"expired within the leeway": sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["exp"] = now.Add(-10 * time.Second).Unix() })),
	} {
		got, err := v.Verify(tok)
		if err != nil || got.Principal != "jwt:ci-bot" {
			t.Errorf("%s: %+v, %v; want principal jwt:ci-bot", name, got, err)
		}
	}
	noneTok := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims(nil))
	for name, tok := range map[string]string{
		"expired":                             sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Minute).Unix() })),
		"no exp":                              sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { delete(c, "exp") })),
		"not yet valid":                       sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["nbf"] = now.Add(time.Minute).Unix() })),
		"another key":                         sign(t, jwt.SigningMethodES256, otherKey, claims(nil)),
		"alg none":                            noneTok,
		"alg none, signed":                    strings.TrimSuffix(noneTok, ".") + "." + strings.Split(sign(t, jwt.SigningMethodES256, ecKey, claims(nil)), ".")[2],
		"HS256 with the public key as secret": sign(t, jwt.SigningMethodHS256, ecPEM, claims(nil)),
		"ES384":                               sign(t, jwt.SigningMethodES384, mustEC(t, elliptic.P384()), claims(nil)),
		"wrong issuer":                        sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["iss"] = "evil" })),
		"wrong audience":                      sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["aud"] = "other" })),
		"no sub":                              sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { delete(c, "sub") })),
		"sub with a space":                    sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["sub"] = "a b" })),
		"sub with a wildcard":                 sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["sub"] = "a*" })),
		"sub too long":                        sign(t, jwt.SigningMethodES256, ecKey, claims(func(c jwt.MapClaims) { c["sub"] = strings.Repeat("a", SubjectBytesMax+1) })),
		"garbage":                             "not.a.token",
		"too long":                            strings.Repeat("a", TokenBytesMax+1),
	} {
		if got, err := v.Verify(tok); !errors.Is(err, ErrBadToken) {
			t.Errorf("%s: %+v, %v; want ErrBadToken", name, got, err)
		}
	}
	if !v.Expired(now.Add(-time.Minute)) || v.Expired(now.Add(time.Minute)) {
		t.Error("Expired disagrees with the clock")
	}
	// A token verified once is remembered, and still checked against the
	// clock: two hours on, it has expired.
	tok := sign(t, jwt.SigningMethodEdDSA, edKey, claims(nil))
	if _, err := v.Verify(tok); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("verified again: %v", err)
	}
	now = now.Add(2 * time.Hour)
	if _, err := v.Verify(tok); !errors.Is(err, ErrBadToken) {
		t.Fatalf("a remembered token after its exp: %v, want ErrBadToken", err)
	}
}

func mustEC(t *testing.T, c elliptic.Curve) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestTokenVerifierRefusesWeakKeys: keys of other kinds or sizes are a
// configuration error, as is a file without keys.
func TestTokenVerifierRefusesWeakKeys(t *testing.T) {
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	for name, keys := range map[string][]byte{
		"RSA 1024":    publicPEM(t, &small.PublicKey),
		"ECDSA P-384": publicPEM(t, &mustEC(t, elliptic.P384()).PublicKey),
		"no key":      []byte("nothing here"),
		"private key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}),
	} {
		if _, err := NewTokenVerifier(TokenConfig{KeysPEM: keys}); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// BenchmarkTokenVerify is the cost of verifying one token (what the
// interceptor does on every call that carries one), by algorithm: its
// signature checked, and remembered from an earlier call:
//
//	go test -run '^$' -bench TokenVerify ./authz/
func BenchmarkTokenVerify(b *testing.B) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		b.Fatal(err)
	}
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPub, edKey, _ := ed25519.GenerateKey(rand.Reader)
	for _, c := range []struct {
		name string
		m    jwt.SigningMethod
		priv any
		pub  crypto.PublicKey
	}{{"RS256", jwt.SigningMethodRS256, rsaKey, &rsaKey.PublicKey}, {"ES256", jwt.SigningMethodES256, ecKey, &ecKey.PublicKey}, {"EdDSA", jwt.SigningMethodEdDSA, edKey, edPub}} {
		b.Run(c.name, func(b *testing.B) {
			der, _ := x509.MarshalPKIXPublicKey(c.pub)
			v, err := NewTokenVerifier(TokenConfig{KeysPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})})
			if err != nil {
				b.Fatal(err)
			}
			tok, err := jwt.NewWithClaims(c.m, jwt.MapClaims{"sub": "ci", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(c.priv)
			if err != nil {
				b.Fatal(err)
			}
			b.Run("signature", func(b *testing.B) {
				for b.Loop() {
					if _, err := v.verify(tok); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("remembered", func(b *testing.B) {
				for b.Loop() {
					if _, err := v.Verify(tok); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
