package wan

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
)

// LinkStatus is the JSON form of Stats served by the control API.
type LinkStatus struct {
	Name                    string  `json:"name"`
	From                    string  `json:"from,omitempty"`
	To                      string  `json:"to,omitempty"`
	Listen                  string  `json:"listen"`
	Upstream                string  `json:"upstream"`
	State                   string  `json:"state"`
	LatencyMs               float64 `json:"latency_ms"`
	JitterMs                float64 `json:"jitter_ms"`
	BandwidthBytesPerSecond int64   `json:"bandwidth_bytes_per_second"`
	ConnsOpen               int     `json:"conns_open"`
	ConnsAccepted           uint64  `json:"conns_accepted"`
	ConnsRefused            uint64  `json:"conns_refused"`
	DialErrors              uint64  `json:"dial_errors"`
	Cuts                    uint64  `json:"cuts"`
	BytesToUpstream         uint64  `json:"bytes_to_upstream"`
	BytesFromUpstream       uint64  `json:"bytes_from_upstream"`
	BytesHeld               int64   `json:"bytes_held"`
}

func statusOf(s Stats) LinkStatus {
	return LinkStatus{
		Name: s.Name, From: s.From, To: s.To, Listen: s.Listen, Upstream: s.Upstream,
		State:                   s.State,
		LatencyMs:               float64(s.Latency) / float64(time.Millisecond),
		JitterMs:                float64(s.Jitter) / float64(time.Millisecond),
		BandwidthBytesPerSecond: s.BandwidthBytesPerSecond,
		ConnsOpen:               s.ConnsOpen,
		ConnsAccepted:           s.ConnsAccepted,
		ConnsRefused:            s.ConnsRefused,
		DialErrors:              s.DialErrors,
		Cuts:                    s.Cuts,
		BytesToUpstream:         s.BytesToUpstream,
		BytesFromUpstream:       s.BytesFromUpstream,
		BytesHeld:               s.BytesHeld,
	}
}

// LinksResponse is the body of every successful control response but
// /healthz: the links concerned, sorted by name.
type LinksResponse struct {
	Links []LinkStatus `json:"links"`
}

// ErrorResponse is the body of a failed control request.
type ErrorResponse struct {
	Error string `json:"error"`
}

// NewControlHandler serves the control API of n:
//
//	GET  /healthz                                  200 "ok"
//	GET  /links                                    every link's status
//	GET  /links/{name}
//	POST /links/{name}/cut?mode=blackhole|reset    mode defaults to blackhole
//	POST /links/{name}/heal
//	POST /links/{name}/latency?ms=40&jitter_ms=5   jitter_ms defaults to the current jitter
//	POST /links/{name}/bandwidth?bytes_per_second=N   0 removes the cap
//	POST /regions/{region}/cut?mode=...            every link from or to region
//	POST /regions/{region}/heal
//	POST /partition?a=R1&b=R2&mode=...             links between R1 and R2, both ways
//	POST /partition/heal?a=R1&b=R2
//	POST /heal                                     every link
//
// Millisecond parameters take decimals ("0.5"). Successful requests answer
// 200 with a LinksResponse of the links concerned. Errors answer JSON
// ErrorResponse: 400 for a bad parameter (ErrInvalidArgument), 404 for an
// unknown link or a region without links (ErrUnknownLink), 409 when closed
// (ErrClosed), 500 otherwise. logger (nil for none) hears every change.
func NewControlHandler(n *Net, logger hclog.Logger) http.Handler {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	h := &controlHandler{net: n, logger: logger.Named("control")}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /links", func(w http.ResponseWriter, r *http.Request) {
		h.reply(w, r, n.Links(), nil)
	})
	mux.HandleFunc("GET /links/{name}", h.oneLink(func(l *Link, r *http.Request) error { return nil }))
	mux.HandleFunc("POST /links/{name}/cut", h.oneLink(func(l *Link, r *http.Request) error {
		mode, err := ParseCutMode(r.URL.Query().Get("mode"))
		if err != nil {
			return err
		}
		return l.Cut(mode)
	}))
	mux.HandleFunc("POST /links/{name}/heal", h.oneLink(func(l *Link, r *http.Request) error { return l.Heal() }))
	mux.HandleFunc("POST /links/{name}/latency", h.oneLink(func(l *Link, r *http.Request) error {
		q := r.URL.Query()
		latency, err := msParam(q.Get("ms"))
		if err != nil {
			return fmt.Errorf("ms: %w", err)
		}
		jitter := time.Duration(l.jitterNanos.Load())
		if q.Has("jitter_ms") {
			if jitter, err = msParam(q.Get("jitter_ms")); err != nil {
				return fmt.Errorf("jitter_ms: %w", err)
			}
		}
		return l.SetLatency(latency, jitter)
	}))
	mux.HandleFunc("POST /links/{name}/bandwidth", h.oneLink(func(l *Link, r *http.Request) error {
		text := r.URL.Query().Get("bytes_per_second")
		bw, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: bytes_per_second %q", ErrInvalidArgument, text)
		}
		return l.SetBandwidth(bw)
	}))
	mux.HandleFunc("POST /regions/{region}/cut", func(w http.ResponseWriter, r *http.Request) {
		mode, err := ParseCutMode(r.URL.Query().Get("mode"))
		if err != nil {
			h.reply(w, r, nil, err)
			return
		}
		links, err := n.CutRegion(r.PathValue("region"), mode)
		h.reply(w, r, links, err)
	})
	mux.HandleFunc("POST /regions/{region}/heal", func(w http.ResponseWriter, r *http.Request) {
		links, err := n.HealRegion(r.PathValue("region"))
		h.reply(w, r, links, err)
	})
	mux.HandleFunc("POST /partition", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		mode, err := ParseCutMode(q.Get("mode"))
		if err == nil {
			err = needParams(q.Get("a"), q.Get("b"))
		}
		if err != nil {
			h.reply(w, r, nil, err)
			return
		}
		links, err := n.Partition(q.Get("a"), q.Get("b"), mode)
		h.reply(w, r, links, err)
	})
	mux.HandleFunc("POST /partition/heal", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if err := needParams(q.Get("a"), q.Get("b")); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		links, err := n.HealBetween(q.Get("a"), q.Get("b"))
		h.reply(w, r, links, err)
	})
	mux.HandleFunc("POST /heal", func(w http.ResponseWriter, r *http.Request) {
		err := n.HealAll()
		h.reply(w, r, n.Links(), err)
	})
	return mux
}

type controlHandler struct {
	net    *Net
	logger hclog.Logger
}

// oneLink looks up {name}, applies f and answers with the link's status.
func (h *controlHandler) oneLink(f func(*Link, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		l, err := h.net.Link(r.PathValue("name"))
		if err == nil {
			err = f(l, r)
		}
		if err != nil {
			h.reply(w, r, nil, err)
			return
		}
		h.reply(w, r, []*Link{l}, nil)
	}
}

func (h *controlHandler) reply(w http.ResponseWriter, r *http.Request, links []*Link, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrInvalidArgument):
			code = http.StatusBadRequest
		case errors.Is(err, ErrUnknownLink):
			code = http.StatusNotFound
		case errors.Is(err, ErrClosed):
			code = http.StatusConflict
		}
		h.logger.Warn("control request failed", "method", r.Method, "path", r.URL.Path, "status", code, "error", err)
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(ErrorResponse{Error: err.Error()})
		return
	}
	if r.Method != http.MethodGet {
		h.logger.Info("control request", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery, "links", len(links))
	}
	resp := LinksResponse{Links: make([]LinkStatus, len(links))}
	for i, l := range links {
		resp.Links[i] = statusOf(l.Stats())
	}
	_ = json.NewEncoder(w).Encode(resp)
}

// msParam parses a millisecond count, decimals allowed.
func msParam(text string) (time.Duration, error) {
	ms, err := strconv.ParseFloat(text, 64)
	// Written so that NaN fails too.
	if err != nil || !(ms >= 0 && ms <= float64(LatencyMax/time.Millisecond)) {
		return 0, fmt.Errorf("%w: %q is not a millisecond count in [0, %d]", ErrInvalidArgument, text, LatencyMax/time.Millisecond)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

func needParams(a, b string) error {
	if a == "" || b == "" {
		return fmt.Errorf("%w: parameters a and b (two regions) are required", ErrInvalidArgument)
	}
	return nil
}
