package console

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/pki"
)

// secureConsole serves a console over SniffTLS with a node certificate
// of p's, deciding by policy, in front of a region of one node (dialed in
// plaintext: the HTTP side is what is under test). It returns the
// address; /plain on it answers 200 to show the plaintext side.
func secureConsole(t *testing.T, p *nodeproc.PKI, policy *authz.Policy, tc *testCluster) string {
	t.Helper()
	dir := p.NodeDir("us", 1)
	files, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(dir, pki.CACertFile),
		CertFile: filepath.Join(dir, pki.NodeCertFile), KeyFile: filepath.Join(dir, pki.NodeKeyFile)})
	if err != nil {
		t.Fatal(err)
	}
	con, err := New(Config{Region: "us", Self: tc.addrs["us"][0], Nodes: tc.addrs, Secure: true, Allows: policy.Allows,
		Logger: testLogger(t, "console")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { con.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", con)
	mux.HandleFunc("/plain", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain") })
	srv := &http.Server{Handler: mux}
	sl := SniffTLS(ln, ViewerTLS(files.ServerTLS()))
	go srv.Serve(sl)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// httpsClient presents the certificate of the certs folder dir ("" for
// none) and trusts p's CA.
func httpsClient(t *testing.T, p *nodeproc.PKI, dir string) *http.Client {
	t.Helper()
	var cfg *tls.Config
	if dir == "" {
		cfg = nodeproc.ClientTLS(t, p.ClientDir("nobody"))
		cfg.Certificates = nil
		cfg.GetClientCertificate = nil
	} else {
		cfg = nodeproc.ClientTLS(t, dir)
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func fetch(t *testing.T, c *http.Client, method, url string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b
}

// TestConsoleShowsWhatTheViewerMayDescribe: over HTTPS, each viewer is
// the principal of their client certificate and sees only the streams
// they may describe; a group's positions need the group permission, the
// orphan logs admin on the stream; a superuser sees everything; no
// certificate, or plain HTTP, gets 401 with what to do, while the same
// address still serves its other paths in plaintext.
func TestConsoleShowsWhatTheViewerMayDescribe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, map[string]int{"us": 1})
	for _, name := range []string{"orders", "audit"} {
		tc.createStream(t, ctx, client.StreamConfig{Name: name, RangeCount: 2, Regions: []string{"us"}})
	}
	ps := newProducers(t, tc.client(t, "us"))
	ps.produce(t, ctx, "audit", 0, 10)
	consumeAsGroup(t, ctx, tc.client(t, "us"), "audit", "billing", 4)

	p := nodeproc.NewPKI(t)
	policy := &authz.Policy{Superusers: []string{"carol"}, Rules: []authz.Rule{
		{Principal: "alice", Resource: "orders", Perms: authz.Of(authz.Describe)},
		{Principal: "bob", Resource: "audit", Perms: authz.Of(authz.Describe)},
		{Principal: "dave", Resource: "audit", Perms: authz.Of(authz.Describe, authz.Admin)},
		{Principal: "dave", Resource: "billing", Perms: authz.Of(authz.Group)},
	}}
	addr := secureConsole(t, p, policy, tc)
	overviewAs := func(principal string) *Overview {
		t.Helper()
		code, body := fetch(t, httpsClient(t, p, p.ClientDir(principal)), "GET", "https://"+addr+"/console/api/overview")
		if code != http.StatusOK {
			t.Fatalf("%s: overview %d: %s", principal, code, body)
		}
		var o Overview
		if err := json.Unmarshal(body, &o); err != nil {
			t.Fatal(err)
		}
		if o.Viewer != principal {
			t.Fatalf("viewer %q, want %q", o.Viewer, principal)
		}
		return &o
	}
	names := func(o *Overview) []string {
		var out []string
		for _, s := range o.Streams {
			out = append(out, s.Name)
		}
		return out
	}
	stream := func(o *Overview, name string) Stream {
		for _, s := range o.Streams {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("%s not shown", name)
		return Stream{}
	}

	if got := names(overviewAs("alice")); !slices.Equal(got, []string{"orders"}) {
		t.Errorf("alice sees %v, want [orders]", got)
	}
	if got := names(overviewAs("eve")); len(got) != 0 {
		t.Errorf("eve, with no rule, sees %v", got)
	}
	bob := stream(overviewAs("bob"), "audit")
	if len(bob.Groups) != 1 || bob.Groups[0].Group != "billing" || bob.Groups[0].Hidden == "" || bob.Groups[0].Ranges != nil {
		t.Errorf("bob (describe, no group permission) sees groups %+v: want billing with its positions hidden", bob.Groups)
	}
	if bob.Orphans == nil || bob.Orphans.Hidden == "" || bob.Orphans.Forks != nil {
		t.Errorf("bob (no admin) sees orphans %+v: want them hidden", bob.Orphans)
	}
	var dave Stream
	waitFor(t, ctx, "dave sees billing's positions", func() bool {
		dave = stream(overviewAs("dave"), "audit")
		return len(dave.Groups) == 1 && dave.Groups[0].Error == "" && len(dave.Groups[0].Ranges) == 2
	})
	if dave.Groups[0].Hidden != "" || dave.Orphans == nil || dave.Orphans.Hidden != "" || dave.Orphans.Forks == nil {
		t.Errorf("dave (group and admin) sees groups %+v, orphans %+v", dave.Groups, dave.Orphans)
	}
	if got := names(overviewAs("carol")); !slices.Equal(got, []string{"audit", "orders"}) {
		t.Errorf("carol (superuser) sees %v", got)
	}

	// No certificate, or plain HTTP: refused with what to do.
	code, body := fetch(t, httpsClient(t, p, ""), "GET", "https://"+addr+"/console/api/overview")
	if code != http.StatusUnauthorized || !strings.Contains(string(body), "client certificate") {
		t.Errorf("no certificate: %d %s, want 401 naming the certificate", code, body)
	}
	plain := &http.Client{Timeout: 30 * time.Second}
	code, body = fetch(t, plain, "GET", "http://"+addr+"/console/")
	if code != http.StatusUnauthorized || !strings.Contains(string(body), "https://"+addr+"/console/") {
		t.Errorf("plain HTTP: %d %s, want 401 naming the HTTPS address", code, body)
	}
	if code, body = fetch(t, plain, "GET", "http://"+addr+"/plain"); code != http.StatusOK || string(body) != "plain" {
		t.Errorf("plain HTTP on the same address: %d %q", code, body)
	}
	// The page itself, over HTTPS.
	code, body = fetch(t, httpsClient(t, p, p.ClientDir("alice")), "GET", "https://"+addr+"/console/")
	if code != http.StatusOK || !strings.Contains(string(body), "geolog console") {
		t.Errorf("the page: %d %.200s", code, body)
	}
}

// TestConsoleIsReadOnly: every method but GET and HEAD is refused with
// 405, on the page and on the API alike, and nothing unknown is served.
func TestConsoleIsReadOnly(t *testing.T) {
	tc := startCluster(t, map[string]int{"us": 1})
	con, err := New(Config{Region: "us", Self: tc.addrs["us"][0], Logger: testLogger(t, "console")})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: testMux(con)}
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	c := &http.Client{Timeout: 30 * time.Second}
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		for _, path := range []string{"/console/", "/console/api/overview", "/console/api/streams"} {
			if code, _ := fetch(t, c, m, base+path); code != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, path, code)
			}
		}
	}
	if code, _ := fetch(t, c, "GET", base+"/console/api/nothing"); code != http.StatusNotFound {
		t.Errorf("GET an unknown path: %d, want 404", code)
	}
	for _, path := range []string{"/console/", "/console/console.js", "/console/console.css", "/console/api/overview"} {
		if code, body := fetch(t, c, "GET", base+path); code != http.StatusOK {
			t.Errorf("GET %s: %d %s", path, code, body)
		}
	}
}
