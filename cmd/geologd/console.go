package main

import (
	"net"
	"net/http"
	"slices"

	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/console"
	"github.com/geolog/geolog/pki"
	"github.com/geolog/geolog/regionsvc"
	"github.com/hashicorp/go-hclog"
)

// The web console (docs/console.md) on the node's HTTP address: /console/,
// with / redirecting there. With TLS on, the address serves HTTPS with the
// node's own certificate, and the console shows a viewer what the policy
// grants the principal of the client certificate they present.

// httpsListener is ln serving HTTPS as well as plain HTTP when certs is
// set (TLS on), else ln itself: the console over HTTPS with the node's
// certificate and a client certificate of the viewer's, while /metrics,
// pprof and the failpoints stay on plain HTTP for what scrapes and drives
// them (console.SniffTLS).
func httpsListener(ln net.Listener, certs *pki.Files) net.Listener {
	if certs == nil {
		return ln
	}
	return console.SniffTLS(ln, console.ViewerTLS(certs.ServerTLS()))
}

// consoleSetup is what the console needs of the node's configuration.
type consoleSetup struct {
	httpAddr string
	region   string
	nodeID   uint64
	peers    map[uint64]string
	remote   map[string][]string
	certs    *pki.Files
	access   *authz.Policy
	logger   hclog.Logger
}

// mountConsole serves the console on mux when the node has an HTTP
// address, and returns what closes it.
func mountConsole(mux *http.ServeMux, node *regionsvc.Node, s consoleSetup) func() {
	if s.httpAddr == "" {
		return func() {}
	}
	// The console reaches this node and its region's as the peers do (a
	// node certificate covers its Peers address), the other regions at
	// their --region-addrs.
	self := node.Addr()
	nodes := map[string][]string{s.region: {self}}
	if len(s.peers) > 0 {
		self = s.peers[s.nodeID]
		ids := make([]uint64, 0, len(s.peers))
		for id := range s.peers {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		nodes[s.region] = nil
		for _, id := range ids {
			nodes[s.region] = append(nodes[s.region], s.peers[id])
		}
	}
	for r, addrs := range s.remote {
		nodes[r] = addrs
	}
	cfg := console.Config{Region: s.region, Self: self, Nodes: nodes, Logger: s.logger}
	if s.certs != nil {
		cfg.Credentials = s.certs.ClientCredentials(pki.RequireNode)
		cfg.Secure = true
		if s.access != nil {
			// The node's live policy: ACLs changed at run time apply to
			// the console at once.
			cfg.Allows = node.Allows
		}
	}
	c, err := console.New(cfg)
	if err != nil {
		s.logger.Error("web console off", "error", err)
		return func() {}
	}
	mux.Handle("/console/", c)
	mux.Handle("/{$}", http.RedirectHandler("/console/", http.StatusFound))
	s.logger.Info("web console", "url", consoleURL(s.httpAddr, s.certs != nil))
	return func() { c.Close() }
}

func consoleURL(addr string, secure bool) string {
	if secure {
		return "https://" + addr + "/console/"
	}
	return "http://" + addr + "/console/"
}
