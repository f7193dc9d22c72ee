package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/nodeproc"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

type consoleOverview struct {
	Viewer  string `json:"viewer"`
	Region  string `json:"region"`
	Streams []struct {
		Name   string `json:"name"`
		Ranges []struct {
			Known bool `json:"known"`
		} `json:"ranges"`
	} `json:"streams"`
}

// getConsole GETs url; a failed request reads as status 0 with the
// error as the body.
func getConsole(t *testing.T, c *http.Client, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), resp.Header
}

func noRedirects(tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// TestConsoleOnTheHTTPAddress: geologd with TLS serves the console over
// HTTPS on --debug-addr to a viewer with a client certificate, shown as
// their principal may see (a superuser the stream, a principal without
// rules nothing), refuses plain HTTP and no certificate with 401, keeps
// /metrics on plain HTTP, and redirects / to /console/; without TLS it
// serves the console on plain HTTP.
func TestConsoleOnTheHTTPAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	debug := nodeproc.FreeAddr(t)
	node := nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), "--certs-dir", p.NodeDir("local", 1), "--debug-addr", debug, "--superusers", "carol")
	api := geologv1.NewLogClient(nodeproc.Dial(t, node.Addr, p.ClientDir("carol")))
	carol := noRedirects(nodeproc.ClientTLS(t, p.ClientDir("carol")))
	overview := "https://" + debug + "/console/api/overview"
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := api.CreateStream(cctx, &geologv1.CreateStreamRequest{Name: "s1", RangeCount: 2})
		ccancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the node is starting
	}
	var o consoleOverview
	for {
		code, body, _ := getConsole(t, carol, overview)
		o = consoleOverview{}
		if code == http.StatusOK && json.Unmarshal([]byte(body), &o) == nil && len(o.Streams) == 1 && len(o.Streams[0].Ranges) == 2 && o.Streams[0].Ranges[1].Known {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("carol never saw s1 with its 2 ranges: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if o.Viewer != "carol" || o.Region != "local" || o.Streams[0].Name != "s1" {
		t.Errorf("carol's overview: %+v", o)
	}
	code, body, _ := getConsole(t, noRedirects(nodeproc.ClientTLS(t, p.ClientDir("alice"))), overview)
	if err := json.Unmarshal([]byte(body), &o); code != http.StatusOK || err != nil || o.Viewer != "alice" || len(o.Streams) != 0 {
		t.Errorf("alice (no rule): %d %s", code, body)
	}
	noCert := nodeproc.ClientTLS(t, p.ClientDir("alice"))
	noCert.Certificates, noCert.GetClientCertificate = nil, nil
	if code, body, _ := getConsole(t, noRedirects(noCert), overview); code != http.StatusUnauthorized {
		t.Errorf("no certificate: %d %s, want 401", code, body)
	}
	plain := noRedirects(nil)
	if code, body, _ := getConsole(t, plain, "http://"+debug+"/console/"); code != http.StatusUnauthorized || !strings.Contains(body, "https://") {
		t.Errorf("plain HTTP console: %d %s, want 401 pointing at https", code, body)
	}
	if code, body, _ := getConsole(t, plain, "http://"+debug+"/metrics"); code != http.StatusOK || !strings.Contains(body, "# TYPE") {
		t.Errorf("plain /metrics: %d %.200s", code, body)
	}
	if code, _, h := getConsole(t, carol, "https://"+debug+"/"); code != http.StatusFound || h.Get("Location") != "/console/" {
		t.Errorf("/: %d to %q, want a redirect to /console/", code, h.Get("Location"))
	}

	insecureDebug := nodeproc.FreeAddr(t)
	nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), "--debug-addr", insecureDebug)
	for {
		code, body, _ := getConsole(t, plain, "http://"+insecureDebug+"/console/api/overview")
		if code == http.StatusOK && json.Unmarshal([]byte(body), &o) == nil && o.Viewer == "" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("without TLS: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
