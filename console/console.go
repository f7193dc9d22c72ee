package console

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/pki"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/credentials"
)

//go:embed static
var staticFiles embed.FS

// Defaults of Config.
const (
	refreshIntervalDefault        = time.Second
	orphansRefreshIntervalDefault = 10 * time.Second
	callTimeoutDefault            = 3 * time.Second
	streamsMaxDefault             = 64
	groupsMaxDefault              = 32
	rangesMaxDefault              = 256
	// collectTimeout bounds one whole collection: past it, the calls
	// left fail at once and the snapshot says so.
	collectTimeout = 10 * time.Second
	// nodesMax bounds the nodes the console asks (as the SDK bounds a
	// client's addresses).
	nodesMax = client.AddrsMax
	// callConcurrencyMax bounds the calls in flight at once.
	callConcurrencyMax = 8
)

// Config configures a Console; zero fields take the documented defaults.
type Config struct {
	// Region is this node's region. Required.
	Region string
	// Self is the gRPC address the console reaches this node at; it asks
	// this node for the stream list, the groups and the orphan logs.
	// Required.
	Self string
	// Nodes lists, by region, the gRPC address of every node the console
	// asks for its ranges (this node's region: its Peers; the others:
	// Regions). Default: Self alone in Region. At most client.AddrsMax
	// addresses in all.
	Nodes map[string][]string
	// Credentials are the transport credentials of the console's calls to
	// the nodes (the node's own client certificate, with TLS on); nil
	// dials in plaintext.
	Credentials credentials.TransportCredentials
	// Secure says the HTTP listener is TLS and verifies client
	// certificates: every request must then carry one (401 otherwise),
	// and its principal is what Allows decides for.
	Secure bool
	// Allows decides whether a viewer's principal holds a permission on a
	// stream or group (authz.Policy.Allows). Nil shows everything to every
	// viewer (authorization off). Node principals are shown everything, as
	// the gRPC side lets them make every call.
	Allows func(principal string, perm authz.Permission, resource string) bool
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// RefreshInterval is the least time between two snapshots, default 1s.
	RefreshInterval time.Duration
	// OrphansRefreshInterval is the least time between two listings of the
	// orphan logs, default 10s.
	OrphansRefreshInterval time.Duration
	// CallTimeout bounds each call to a node, default 3s.
	CallTimeout time.Duration
	// StreamsMax bounds the streams shown (by name), default 64;
	// GroupsMax the groups of a stream, default 32; RangesMax the ranges
	// of a stream, default 256 (the first ones).
	StreamsMax, GroupsMax, RangesMax int
	// Now is the clock, default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.Region == "" || c.Self == "" {
		return errors.New("console: Region and Self are required")
	}
	if len(c.Nodes) == 0 {
		c.Nodes = map[string][]string{c.Region: {c.Self}}
	}
	total := 0
	for _, addrs := range c.Nodes {
		total += len(addrs)
	}
	if total > nodesMax {
		return fmt.Errorf("console: %d node addresses, at most %d", total, nodesMax)
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = refreshIntervalDefault
	}
	if c.OrphansRefreshInterval <= 0 {
		c.OrphansRefreshInterval = orphansRefreshIntervalDefault
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = callTimeoutDefault
	}
	if c.StreamsMax <= 0 {
		c.StreamsMax = streamsMaxDefault
	}
	if c.GroupsMax <= 0 {
		c.GroupsMax = groupsMaxDefault
	}
	if c.RangesMax <= 0 {
		c.RangesMax = rangesMaxDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Console serves the page and its API. Mount it at /console/.
type Console struct {
	cfg    Config
	logger hclog.Logger
	col    *collector
	mux    *http.ServeMux
}

// New makes a console; Close releases its connections to the nodes.
func New(cfg Config) (*Console, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	col, err := newCollector(&cfg)
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, logger: cfg.Logger.Named("console"), col: col, mux: http.NewServeMux()}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	c.mux.Handle("GET /console/", http.StripPrefix("/console/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET /console/api/overview", c.serveOverview)
	return c, nil
}

// Close closes the console's connections. Requests after it fail.
func (c *Console) Close() error { return c.col.close() }

// ServeHTTP serves GET (and HEAD) only: the console changes nothing.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "the console is read-only: "+r.Method+" is not served")
		return
	}
	if c.cfg.Secure {
		if r.TLS == nil {
			writeError(w, http.StatusUnauthorized, "this node serves the console over HTTPS only: open https://"+r.Host+"/console/ with a client certificate")
			return
		}
		if _, err := viewerOf(r); err != nil {
			writeError(w, http.StatusUnauthorized, "present a client certificate signed by the cluster's CA (the one you give geolog --cert): "+err.Error())
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

// viewer is who is looking: a client principal, a node, or nobody (TLS
// off).
type viewer struct {
	principal string
	node      bool
}

// viewerOf reads the viewer from the client certificate the TLS listener
// verified; PeerCertificates alone prove nothing.
func viewerOf(r *http.Request) (viewer, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return viewer{}, pki.ErrNoIdentity
	}
	id, err := pki.FromCertificate(r.TLS.VerifiedChains[0][0])
	if err != nil {
		return viewer{}, err
	}
	return viewer{principal: id.Name(), node: id.IsNode()}, nil
}

// allows decides what the viewer is shown.
func (c *Console) allows(v viewer, perm authz.Permission, resource string) bool {
	if c.cfg.Allows == nil || v.node {
		return true
	}
	return c.cfg.Allows(v.principal, perm, resource)
}

func (c *Console) serveOverview(w http.ResponseWriter, r *http.Request) {
	v := viewer{}
	if c.cfg.Secure {
		v, _ = viewerOf(r) // ServeHTTP refused a request without one
	}
	snap, err := c.col.snapshot(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, c.overviewFor(snap, v))
}

// overviewFor is the part of snap the viewer may see.
func (c *Console) overviewFor(snap *snapshot, v viewer) *Overview {
	o := &Overview{
		TimeUnixMs: snap.at.UnixMilli(), Region: c.cfg.Region, Node: c.cfg.Self, Viewer: v.principal,
		Regions: snap.regions, StreamsLeftOut: snap.streamsLeftOut, Errors: snap.errors,
		LagByRegion: map[string]uint64{},
	}
	for _, s := range snap.streams {
		if !c.allows(v, authz.Describe, s.Name) {
			continue
		}
		s := *s
		s.Groups = nil
		for _, g := range snap.streamGroups[s.Name] {
			g := *g
			if !c.allows(v, authz.Group, g.Group) {
				g.Ranges, g.LagRecords, g.Hidden = nil, 0, "needs the group permission on "+g.Group
			}
			s.Groups = append(s.Groups, g)
		}
		if c.allows(v, authz.Admin, s.Name) {
			s.Orphans = snap.orphans[s.Name]
		} else {
			s.Orphans = &Orphans{Hidden: "needs admin on " + s.Name}
		}
		for _, rv := range s.Ranges {
			for region, p := range rv.Regions {
				if !p.Home && p.Known {
					o.LagByRegion[region] += p.OffsetLag
				}
			}
		}
		o.Streams = append(o.Streams, s)
	}
	if o.Streams == nil {
		o.Streams = []Stream{}
	}
	return o
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return // the viewer went away
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

// sortedRegions lists the regions of nodes, this node's first.
func sortedRegions(self string, nodes map[string][]string) []string {
	var out []string
	for r := range nodes {
		if r != self {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return append([]string{self}, out...)
}

// trimError keeps an error message short enough for a table cell.
func trimError(err error) string {
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return strings.TrimSpace(s)
}
