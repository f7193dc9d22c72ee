package authz

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Bearer tokens (JWT). A client may present one as its principal; the
// node verifies it against the public keys its operator configured. Only
// asymmetric signatures are accepted: RS256 (RSA keys of 2048 bits or
// more), ES256 (ECDSA P-256) and EdDSA (Ed25519). "none" and the HMAC
// algorithms are refused: an HMAC key verifies and signs alike, so every
// node holding it could mint tokens for anyone.

// TokenPrincipalPrefix begins every principal a token names
// ("jwt:<sub>"). ':' is not in a certificate principal's alphabet (pki),
// so a token can never name a certificate's principal, nor a node
// ("node:<region>/<id>").
const TokenPrincipalPrefix = "jwt:"

// Bounds on tokens.
const (
	// TokenBytesMax bounds a token before it is parsed.
	TokenBytesMax = 8 << 10
	// SubjectBytesMax bounds a token's sub claim.
	SubjectBytesMax = 128
	// TokenKeysMax bounds the keys of a TokenConfig.
	TokenKeysMax = 64
	// TokenLeewayDefault is the clock skew tolerated on exp and nbf.
	TokenLeewayDefault = 30 * time.Second
)

// ErrBadToken is the error of every token refused (wrapped with why).
var ErrBadToken = errors.New("authz: bearer token refused")

// TokenConfig configures a TokenVerifier.
type TokenConfig struct {
	// KeysPEM holds the public keys that sign tokens: PEM "PUBLIC KEY"
	// blocks (PKIX) of RSA, ECDSA P-256 or Ed25519 keys.
	KeysPEM []byte
	// Issuer, if set, must be the token's iss; Audience, if set, one of
	// its aud.
	Issuer, Audience string
	// Leeway is the clock skew tolerated on exp and nbf, overriding the
	// default of TokenLeewayDefault.
	Leeway time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// TokenVerifier verifies bearer tokens. Safe for concurrent use.
type TokenVerifier struct {
	keys   map[string][]jwt.VerificationKey // algorithm → keys
	parser *jwt.Parser
	now    func() time.Time
	leeway time.Duration
	// verified caches the tokens verified (by their SHA-256), up to
	// verifiedMax: a signature check costs 50 to 300 µs of CPU, and a
	// client sends the same token with every call. A cached token is
	// checked against the clock again on every use.
	mu       sync.Mutex
	verified map[[sha256.Size]byte]Token
}

// verifiedMax bounds the verified tokens a TokenVerifier remembers;
// past it the cache starts again empty.
const verifiedMax = 4096

// Token is what a verified token says.
type Token struct {
	// Principal is TokenPrincipalPrefix and the token's sub.
	Principal string
	// Expires is the token's exp.
	Expires time.Time
}

// NewTokenVerifier parses cfg's keys.
func NewTokenVerifier(cfg TokenConfig) (*TokenVerifier, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = TokenLeewayDefault
	}
	if cfg.Leeway < 0 || cfg.Leeway > time.Hour {
		return nil, fmt.Errorf("authz: token leeway %v: must be in (0, 1h]", cfg.Leeway)
	}
	v := &TokenVerifier{keys: map[string][]jwt.VerificationKey{}, now: cfg.Now, leeway: cfg.Leeway}
	rest, count := cfg.KeysPEM, 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("authz: token keys: a %q PEM block (want PUBLIC KEY)", block.Type)
		}
		if count++; count > TokenKeysMax {
			return nil, fmt.Errorf("authz: token keys: more than %d", TokenKeysMax)
		}
		key, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("authz: token key %d: %w", count, err)
		}
		alg, err := keyAlgorithm(key)
		if err != nil {
			return nil, fmt.Errorf("authz: token key %d: %w", count, err)
		}
		v.keys[alg] = append(v.keys[alg], key)
	}
	if count == 0 {
		return nil, errors.New("authz: token keys: no PUBLIC KEY PEM block")
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{"RS256", "ES256", "EdDSA"}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(cfg.Leeway),
		jwt.WithTimeFunc(cfg.Now),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// keyAlgorithm is the one algorithm a public key verifies.
func keyAlgorithm(key crypto.PublicKey) (string, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return "", fmt.Errorf("an RSA key of %d bits (at least 2048)", k.N.BitLen())
		}
		return "RS256", nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return "", fmt.Errorf("an ECDSA key on %s (P-256 only: ES256)", k.Curve.Params().Name)
		}
		return "ES256", nil
	case ed25519.PublicKey:
		return "EdDSA", nil
	}
	return "", fmt.Errorf("a %T key (RSA, ECDSA P-256 or Ed25519 only)", key)
}

// Verify checks a token's signature, algorithm, exp (required), nbf,
// iss and aud, and returns the principal it names. Every refusal wraps
// ErrBadToken.
func (v *TokenVerifier) Verify(token string) (Token, error) {
	if len(token) > TokenBytesMax {
		return Token{}, fmt.Errorf("%w: %d bytes (at most %d)", ErrBadToken, len(token), TokenBytesMax)
	}
	sum := sha256.Sum256([]byte(token))
	v.mu.Lock()
	tok, ok := v.verified[sum]
	v.mu.Unlock()
	if ok {
		if v.Expired(tok.Expires) {
			return Token{}, fmt.Errorf("%w: token is expired", ErrBadToken)
		}
		return tok, nil
	}
	tok, err := v.verify(token)
	if err != nil {
		return Token{}, err
	}
	v.mu.Lock()
	if v.verified == nil || len(v.verified) >= verifiedMax {
		v.verified = map[[sha256.Size]byte]Token{}
	}
	v.verified[sum] = tok
	v.mu.Unlock()
	return tok, nil
}

// verify is Verify without the cache.
func (v *TokenVerifier) verify(token string) (Token, error) {
	var claims jwt.RegisteredClaims
	_, err := v.parser.ParseWithClaims(token, &claims, func(t *jwt.Token) (any, error) {
		keys := v.keys[t.Method.Alg()]
		if len(keys) == 0 {
			return nil, fmt.Errorf("no key for %s", t.Method.Alg())
		}
		return jwt.VerificationKeySet{Keys: keys}, nil
	})
	if err != nil {
		return Token{}, fmt.Errorf("%w: %v", ErrBadToken, err)
	}
	if err := validateSubject(claims.Subject); err != nil {
		return Token{}, fmt.Errorf("%w: %v", ErrBadToken, err)
	}
	return Token{Principal: TokenPrincipalPrefix + claims.Subject, Expires: claims.ExpiresAt.Time}, nil
}

// Expired reports whether a token that expires at exp is no longer
// valid now (with the verifier's leeway), for a stream opened with it.
func (v *TokenVerifier) Expired(exp time.Time) bool {
	return !v.now().Before(exp.Add(v.leeway))
}

// validateSubject checks a sub claim: 1 to SubjectBytesMax printable
// ASCII characters other than space and '*'.
func validateSubject(sub string) error {
	if sub == "" || len(sub) > SubjectBytesMax {
		return fmt.Errorf("sub of %d bytes (1 to %d)", len(sub), SubjectBytesMax)
	}
	for i := 0; i < len(sub); i++ {
		if c := sub[i]; c <= ' ' || c > '~' || c == '*' {
			return fmt.Errorf("sub %q: byte %#x at %d (printable ASCII other than space and '*' only)", sub, c, i)
		}
	}
	return nil
}
