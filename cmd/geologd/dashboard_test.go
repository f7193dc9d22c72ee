package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// promqlWords are the PromQL functions, aggregations and keywords the
// dashboard and the alerts may use; any other word of an expression must
// be a metric the node exports.
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "topk": true, "bottomk": true, "quantile": true,
	"rate": true, "irate": true, "increase": true, "delta": true, "deriv": true, "predict_linear": true,
	"histogram_quantile": true, "vector": true, "scalar": true, "abs": true, "clamp_min": true, "clamp_max": true,
	"max_over_time": true, "min_over_time": true, "avg_over_time": true, "absent": true, "label_replace": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
}

var (
	promString  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promLabels  = regexp.MustCompile(`\{[^}]*\}`)
	promGroup   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promRange   = regexp.MustCompile(`\[[^\]]*\]`)
	promWord    = regexp.MustCompile(`(?:^|[^A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)`)
	labelValues = regexp.MustCompile(`^label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)`)
)

// exprMetrics returns the metric names expr uses, or the words that are
// neither PromQL nor a name of names.
func exprMetrics(expr string, names map[string]bool) (used, unknown []string) {
	if m := labelValues.FindStringSubmatch(strings.TrimSpace(expr)); m != nil {
		if names[m[1]] {
			return []string{m[1]}, nil
		}
		return nil, []string{m[1]}
	}
	e := promString.ReplaceAllString(expr, `""`)
	e = promLabels.ReplaceAllString(e, "")
	e = promGroup.ReplaceAllString(e, "")
	e = promRange.ReplaceAllString(e, "")
	for _, m := range promWord.FindAllStringSubmatch(e, -1) {
		switch w := m[1]; {
		case promqlWords[w]:
		case names[w]:
			used = append(used, w)
		default:
			unknown = append(unknown, w)
		}
	}
	return used, unknown
}

// checkExprs fails t for every expression naming no metric or a word
// that is neither PromQL nor a metric of names.
func checkExprs(t *testing.T, where string, exprs []string, names map[string]bool) {
	t.Helper()
	if len(exprs) == 0 {
		t.Fatalf("%s: no expression found", where)
	}
	for _, e := range exprs {
		used, unknown := exprMetrics(e, names)
		if len(unknown) > 0 {
			t.Errorf("%s: %q names %v, which the node does not export", where, e, unknown)
		}
		if len(used) == 0 {
			t.Errorf("%s: %q names no metric", where, e)
		}
	}
}

// TestDashboardNamesExportedMetrics: every query of the Grafana dashboard
// (deploy/grafana/geolog.json: panel targets, rows' panels, template
// variables) names only metrics the node exports, as testNodeMetrics
// collects them from a node's instruments and scrape.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	names, _ := testNodeMetrics(t)
	b, err := os.ReadFile("../../deploy/grafana/geolog.json")
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr string `json:"expr"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("geolog.json: %v", err)
	}
	var exprs []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("template variable query: %v", err)
		}
		exprs = append(exprs, q.Query)
	}
	checkExprs(t, "geolog.json", exprs, names)
}

// TestAlertsNameExportedMetrics: the same of every rule of
// deploy/prometheus/alerts.yml (promtool checks their syntax and tests
// their logic; it cannot know which metrics exist).
func TestAlertsNameExportedMetrics(t *testing.T) {
	names, _ := testNodeMetrics(t)
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, line := range strings.Split(string(b), "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			exprs = append(exprs, strings.TrimSpace(e))
		}
	}
	checkExprs(t, "alerts.yml", exprs, names)
	// The checker itself: a misspelt metric is caught.
	if _, unknown := exprMetrics(`max by (stream) (geolog_replication_lag_second{a="b"}) > 1e6`, names); len(unknown) != 1 || unknown[0] != "geolog_replication_lag_second" {
		t.Fatalf("a misspelt metric went unnoticed: %v", unknown)
	}
}
