// Package alerts checks deploy/alerts.yaml beyond what promtool does: every
// alert has a severity, a summary and a runbook that exists, a promtool unit
// test that fires it and one that shows it silent, and the alert table of
// docs/metrics.md lists exactly the same alerts and severities. promtool
// itself runs in test/alerts.sh (make alerts).
package alerts

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const root = "../.."

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy/alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("deploy/alerts.yaml: %v", err)
	}
	var rs []rule
	for _, g := range f.Groups {
		rs = append(rs, g.Rules...)
	}
	if len(rs) == 0 {
		t.Fatal("deploy/alerts.yaml has no rules")
	}
	return rs
}

func TestEveryAlertHasSeveritySummaryAndRunbook(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{2,4} (\S+)\s*$`).FindAllStringSubmatch(string(doc), -1) {
		headings[strings.ToLower(m[1])] = true // GitHub's anchor of a one-word heading
	}
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			t.Errorf("recording rule %q: this file holds alerts only", r.Record)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("%s: defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "page" && s != "ticket" {
			t.Errorf("%s: labels.severity %q, want page or ticket", r.Alert, s)
		}
		if strings.TrimSpace(r.Annotations["summary"]) == "" {
			t.Errorf("%s: no annotations.summary", r.Alert)
		}
		anchor := strings.ToLower(r.Alert)
		if want := "docs/operations.md#" + anchor; r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !headings[anchor] {
			t.Errorf("%s: docs/operations.md has no heading for #%s (add a runbook: ### %s)", r.Alert, anchor, r.Alert)
		}
	}
}

// Each alert has a promtool test case where it fires and one where it stays
// silent (exp_alerts empty), so a rule that can never fire, or always
// fires, fails make test.
func TestEveryAlertFiresAndStaysSilentInPromtoolTests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "test/alerts/*_test.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in test/alerts (%v)", err)
	}
	fires, silent := map[string]int{}, map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var tf struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string           `yaml:"alertname"`
					ExpAlerts []map[string]any `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		if err := yaml.Unmarshal(b, &tf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range tf.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname]++
				} else {
					silent[a.Alertname]++
				}
			}
		}
	}
	known := map[string]bool{}
	for _, r := range loadRules(t) {
		known[r.Alert] = true
		if fires[r.Alert] == 0 {
			t.Errorf("%s: no promtool test in test/alerts expects it to fire", r.Alert)
		}
		if silent[r.Alert] == 0 {
			t.Errorf("%s: no promtool test in test/alerts shows it silent on healthy series", r.Alert)
		}
	}
	for name := range fires {
		if !known[name] {
			t.Errorf("test/alerts tests alert %s, which deploy/alerts.yaml does not define", name)
		}
	}
}

// The "Alerts" table of docs/metrics.md lists exactly the alerts of
// deploy/alerts.yaml, each with its severity.
func TestReadmeAlertTableMatchesRules(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(OutboxRelay\\w+)` \\| (\\w+) \\|").FindAllStringSubmatch(string(b), -1) {
		readme[m[1]] = m[2]
	}
	rules := map[string]string{}
	for _, r := range loadRules(t) {
		rules[r.Alert] = r.Labels["severity"]
	}
	var diff []string
	for name, sev := range rules {
		if got, ok := readme[name]; !ok {
			diff = append(diff, name+": in deploy/alerts.yaml, missing from docs/metrics.md")
		} else if got != sev {
			diff = append(diff, name+": docs/metrics.md says "+got+", deploy/alerts.yaml says "+sev)
		}
	}
	for name := range readme {
		if _, ok := rules[name]; !ok {
			diff = append(diff, name+": in docs/metrics.md, not in deploy/alerts.yaml")
		}
	}
	sort.Strings(diff)
	for _, d := range diff {
		t.Error(d)
	}
}
