package main

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync/atomic"

	"github.com/geolog/geolog/internal/failpoint"
	"github.com/geolog/geolog/regionsvc"
)

// httpHandlers are what the node's HTTP addresses serve.
type httpHandlers struct {
	// metrics is the Prometheus scrape handler.
	metrics http.Handler
	// node is set once the node serves gRPC; until then /readyz says it
	// is starting.
	node atomic.Pointer[regionsvc.Node]
	// failpoints, if set (--debug-failpoints), are served on the debug
	// address only.
	failpoints *failpoint.Set
}

// operatorMux is the mux of --http-addr: what monitoring and load
// balancers use.
//
//	/metrics  Prometheus text exposition of every series (docs/operations.md)
//	/healthz  200 while the process serves HTTP
//	/readyz   200 once the node serves every range it should, else 503 and why
//
// The web console (console.go: mountConsole) is added under /console/
// once the node serves, on this mux when --http-addr is given, else on
// the debug one.
func (h *httpHandlers) operatorMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h.metrics)
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	return mux
}

// debugMux is the mux of --debug-addr: the operator routes, the Go
// profiler under /debug/pprof/ and, with --debug-failpoints, the
// failpoints. Keep it on a private address.
func (h *httpHandlers) debugMux() *http.ServeMux {
	mux := h.operatorMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if h.failpoints != nil {
		mux.Handle(failpoint.Path, h.failpoints.Handler())
	}
	return mux
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// readyz answers 200 "ready" or 503 with one reason a line
// (regionsvc.Node.Ready).
func (h *httpHandlers) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	n := h.node.Load()
	if n == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready: the node is starting")
		return
	}
	ok, reasons := n.Ready()
	if ok {
		fmt.Fprintln(w, "ready")
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintf(w, "not ready:\n%s\n", strings.Join(reasons, "\n"))
}
