//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// metricFamily is a sample name without a histogram's or summary's
// _bucket/_sum/_count suffix.
func metricFamily(name string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			return base
		}
	}
	return name
}

// usedMetrics returns the metric families deploy/alerts.yaml and
// deploy/grafana/*.json select (Prometheus' own `up` left out), each with
// where it is used.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	add := func(expr, where string) {
		for _, n := range testkit.MetricNames(expr) {
			if n == "up" {
				continue
			}
			f := metricFamily(n)
			if !slices.Contains(used[f], where) {
				used[f] = append(used[f], where)
			}
		}
	}
	b, err := os.ReadFile("../../deploy/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Record, Expr string } `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("deploy/alerts.yaml: %v", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			add(r.Expr, "deploy/alerts.yaml "+r.Alert+r.Record)
		}
	}
	dashboards, err := filepath.Glob("../../deploy/grafana/*.json")
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboards in deploy/grafana (%v)", err)
	}
	for _, path := range dashboards {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var d any
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		file := strings.TrimPrefix(path, "../../")
		// Panels' targets carry "expr"; query variables carry "query" (a
		// string, or an object with "query") and "definition".
		var walk func(v any, where string)
		walk = func(v any, where string) {
			switch v := v.(type) {
			case map[string]any:
				if title, ok := v["title"].(string); ok {
					where = file + " panel " + fmt.Sprintf("%q", title)
				}
				if name, ok := v["name"].(string); ok && v["type"] == "query" {
					where = file + " variable $" + name
					switch q := v["query"].(type) {
					case string:
						add(q, where)
					case map[string]any:
						if s, ok := q["query"].(string); ok {
							add(s, where)
						}
					}
					if s, ok := v["definition"].(string); ok {
						add(s, where)
					}
				}
				if expr, ok := v["expr"].(string); ok {
					add(expr, where)
				}
				for _, c := range v {
					walk(c, where)
				}
			case []any:
				for _, c := range v {
					walk(c, where)
				}
			}
		}
		walk(d, file)
	}
	return used
}

// Item "Alerts and dashboard" of issue 11: every metric the alert rules and
// the dashboard use is exported by a running leader (a typo or a renamed
// metric would make an alert silently never fire, a panel empty).
func TestAlertAndDashboardMetricsAreExported(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	used := usedMetrics(t)
	if len(used) < 20 {
		t.Fatalf("found only %d metric names in deploy/alerts.yaml and deploy/grafana: %v", len(used), used)
	}
	e := newEnv(t, "metricnames")
	// The registry's metrics exist where some topic uses a registry format.
	r := e.startRelay("--schema-registry-url", testkit.SchemaRegistryURL(t), "--serialization-topics", e.Prefix+".unused=avro")
	w := e.newWriter(11)
	ctx := context.Background()
	if err := w.run(ctx, 60, 5, 6, 0, ""); err != nil {
		t.Fatal(err)
	}
	// Published events make the per-topic series exist.
	consume(t, e.topics(), len(w.written()), 60*time.Second, time.Second)

	var missing []string
	_ = testkit.Poll(20*time.Second, 250*time.Millisecond, func() (bool, error) {
		if err := r.Exited(); err != nil {
			return false, err
		}
		ss, err := r.Scrape()
		if err != nil {
			return false, nil
		}
		exported := map[string]bool{}
		for _, s := range ss {
			exported[metricFamily(s.Name)] = true
		}
		missing = missing[:0]
		for name := range used {
			if !exported[name] {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, nil
	})
	if err := r.Exited(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(missing)
	for _, name := range missing {
		t.Errorf("%s is not exported by a running leader; used by %s", name, strings.Join(used[name], ", "))
	}
	var found []string
	for n := range used {
		if !slices.Contains(missing, n) {
			found = append(found, n)
		}
	}
	slices.Sort(found)
	t.Logf("%d of the %d metric names used by the alerts and the dashboard are exported: %s",
		len(found), len(used), strings.Join(found, " "))
}
