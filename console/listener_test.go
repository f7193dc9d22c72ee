package console

import (
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/pki"
)

// TestSniffTLS: one port serves HTTPS (with the viewer's certificate in
// Request.TLS) and plain HTTP; connections that never send a byte hold
// up neither; Close ends Accept with net.ErrClosed.
func TestSniffTLS(t *testing.T) {
	p := nodeproc.NewPKI(t)
	dir := p.NodeDir("us", 1)
	files, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(dir, pki.CACertFile),
		CertFile: filepath.Join(dir, pki.NodeCertFile), KeyFile: filepath.Join(dir, pki.NodeKeyFile)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := SniffTLS(ln, ViewerTLS(files.ServerTLS()))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.TLS == nil:
			io.WriteString(w, "plain")
		default:
			v, err := viewerOf(r)
			if err != nil {
				io.WriteString(w, "tls, no viewer")
				return
			}
			io.WriteString(w, "tls "+v.principal)
		}
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sl) }()
	addr := ln.Addr().String()
	for range 3 { // silent connections: sniffing them must not stall Accept
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	for _, tc := range []struct {
		client *http.Client
		url    string
		want   string
	}{
		{&http.Client{Timeout: 20 * time.Second}, "http://" + addr + "/", "plain"},
		{httpsClient(t, p, p.ClientDir("alice")), "https://" + addr + "/", "tls alice"},
		{httpsClient(t, p, ""), "https://" + addr + "/", "tls, no viewer"},
	} {
		if code, body := fetch(t, tc.client, "GET", tc.url); code != http.StatusOK || string(body) != tc.want {
			t.Errorf("GET %s: %d %q, want %q", tc.url, code, body, tc.want)
		}
	}
	if err := sl.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve after Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}
