package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/geolog/geolog/wan"
)

// wanClient speaks geolog-wan's control API (wan.NewControlHandler).
type wanClient struct {
	base string
	http *http.Client
}

func newWANClient(addr string) *wanClient {
	return &wanClient{base: "http://" + addr, http: &http.Client{Timeout: 10 * time.Second}}
}

func (w *wanClient) do(ctx context.Context, method, path string, query url.Values) ([]wan.LinkStatus, error) {
	u := w.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("wan control: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("wan control %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e wan.ErrorResponse
		_ = json.Unmarshal(body, &e)
		return nil, fmt.Errorf("wan control %s %s: %s: %s", method, path, resp.Status, e.Error)
	}
	var lr wan.LinksResponse
	if err := json.Unmarshal(body, &lr); err != nil {
		return nil, fmt.Errorf("wan control %s %s: %w", method, path, err)
	}
	return lr.Links, nil
}

// Links returns every link's status.
func (w *wanClient) Links(ctx context.Context) ([]wan.LinkStatus, error) {
	return w.do(ctx, http.MethodGet, "/links", nil)
}

func linkPath(name, action string) string { return "/links/" + url.PathEscape(name) + "/" + action }

func (w *wanClient) Cut(ctx context.Context, name, mode string) error {
	_, err := w.do(ctx, http.MethodPost, linkPath(name, "cut"), url.Values{"mode": {mode}})
	return err
}

func (w *wanClient) Heal(ctx context.Context, name string) error {
	_, err := w.do(ctx, http.MethodPost, linkPath(name, "heal"), nil)
	return err
}

func (w *wanClient) SetLatency(ctx context.Context, name string, latency, jitter time.Duration) error {
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64)
	}
	_, err := w.do(ctx, http.MethodPost, linkPath(name, "latency"), url.Values{"ms": {ms(latency)}, "jitter_ms": {ms(jitter)}})
	return err
}

// HealAll heals every link.
func (w *wanClient) HealAll(ctx context.Context) error {
	_, err := w.do(ctx, http.MethodPost, "/heal", nil)
	return err
}

// linkEnds are the endpoint names a link joins, at region and node grain:
// a link selected by sides A and B joins an endpoint of A to one of B.
type linkEnds struct {
	from, to []string
}

// endsOf names a link's ends from its From/To and name. Links are named
//
//	us->eu.n2        WAN: region us to node 2 of eu   from {us}      to {eu, eu:n2}
//	us:n1->us:n2     Raft: node 1 of us to node 2     from {us:n1}   to {us:n2}
//	client->us:n1    an SDK client to node 1 of us    from {client}  to {us:n1}
//	us->pg           region us to the lease store     from {us}      to {pg}
//
// (cluster.sh and LocalCluster both follow it.)
func endsOf(l wan.LinkStatus) linkEnds {
	from, to := l.From, l.To
	if from == "" || to == "" {
		f, rest, ok := strings.Cut(l.Name, "->")
		if !ok {
			return linkEnds{}
		}
		from, to = f, rest
		if r, _, ok := strings.Cut(rest, "."); ok && !strings.Contains(rest, ":") {
			to = r
		}
	}
	e := linkEnds{from: []string{from}, to: []string{to}}
	if !strings.Contains(to, ":") {
		// A WAN link to a node: "<from>-><to>.n<i>".
		if _, suffix, ok := strings.Cut(l.Name, "->"+to+"."); ok && strings.HasPrefix(suffix, "n") {
			e.to = append(e.to, to+":"+suffix)
		}
	}
	return e
}

// linksBetween returns the links joining side a to side b (and b to a
// unless oneWay).
func linksBetween(links []wan.LinkStatus, a, b []string, oneWay bool) []wan.LinkStatus {
	in := func(names, set []string) bool {
		for _, n := range names {
			for _, s := range set {
				if n == s {
					return true
				}
			}
		}
		return false
	}
	var out []wan.LinkStatus
	for _, l := range links {
		e := endsOf(l)
		if (in(e.from, a) && in(e.to, b)) || (!oneWay && in(e.from, b) && in(e.to, a)) {
			out = append(out, l)
		}
	}
	return out
}
