// Package docs keeps the documentation from drifting away from the code:
// every metric the relay registers is in docs/metrics.md and every metric
// documented there is registered; the inbox library's metrics are in
// docs/consumers.md; every relative link in README.md and docs/ points to a
// file that exists and, for a Markdown file, to a heading it has. No
// services needed.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const root = "../.."

var metricName = regexp.MustCompile(`^outbox_relay_[a-z0-9_]+$`)

// indirect names the packages whose Opts take the metric name from a
// variable (a helper builds them): their metrics are every outbox_relay_*
// string literal of the package, documented in the page given, where the
// names with that prefix are theirs.
var indirect = map[string]struct{ page, prefix string }{
	"inbox": {"docs/consumers.md", "outbox_relay_inbox_"},
}

// registered reads the module's Go sources (not tests, test/, bench/ or
// examples/) and returns, per package directory, the Name of every
// prometheus.{Counter,Gauge,Histogram,Summary}Opts literal. A Name that is
// not a string literal, or a Namespace or Subsystem, is an error unless the
// package is in indirect: the test must not miss a metric silently.
func registered(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case rel == "test", rel == "bench", rel == "examples", strings.HasPrefix(d.Name(), ".") && rel != ".":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		if pkg == "internal/metric" {
			return nil // the builders: their callers name each metric (metricBuilders)
		}
		if out[pkg] == nil {
			out[pkg] = map[string]bool{}
		}
		if _, ok := indirect[pkg]; ok {
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil && metricName.MatchString(s) {
						out[pkg][s] = true
					}
				}
				return true
			})
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				// internal/metric's builders take the whole name first.
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && len(call.Args) > 0 {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "metric" && metricBuilders[sel.Sel.Name] {
						lit, ok := call.Args[0].(*ast.BasicLit)
						s, err := "", error(nil)
						if ok {
							s, err = strconv.Unquote(lit.Value)
						}
						switch {
						case !ok || err != nil:
							t.Errorf("%s: metric.%s name is not a string literal: write the name there", fset.Position(call.Pos()), sel.Sel.Name)
						case !metricName.MatchString(s):
							t.Errorf("%s: metric %q does not start with outbox_relay_", fset.Position(call.Pos()), s)
						default:
							out[pkg][s] = true
						}
					}
				}
				return true
			}
			cl, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := cl.Type.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" {
				return true
			}
			for _, e := range cl.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, _ := kv.Key.(*ast.Ident)
				if key == nil {
					continue
				}
				switch key.Name {
				case "Namespace", "Subsystem":
					t.Errorf("%s: prometheus.%s sets %s: this test reads whole names only; write the full name in Name", fset.Position(kv.Pos()), sel.Sel.Name, key.Name)
				case "Name":
					lit, ok := kv.Value.(*ast.BasicLit)
					s, err := "", error(nil)
					if ok {
						s, err = strconv.Unquote(lit.Value)
					}
					if !ok || err != nil {
						t.Errorf("%s: prometheus.%s Name is not a string literal: write the name there, or list package %q in indirect", fset.Position(kv.Pos()), sel.Sel.Name, pkg)
						continue
					}
					if !metricName.MatchString(s) {
						t.Errorf("%s: metric %q does not start with outbox_relay_", fset.Position(kv.Pos()), s)
						continue
					}
					out[pkg][s] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// metricBuilders are internal/metric's functions whose first argument is
// a metric's whole name.
var metricBuilders = map[string]bool{"Counter": true, "Gauge": true, "GaugeVec": true}

var backticked = regexp.MustCompile("`(outbox_relay_[a-z0-9_]+)(?:\\{[^`]*\\})?`")

// documented returns the metric names backticked in the first cell of the
// table rows of a Markdown page (the metric tables' first column).
func documented(t *testing.T, page string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.SplitN(line[1:], "|", 2)
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			names[m[1]] = true
		}
	}
	return names
}

// documentedAnywhere returns every backticked outbox_relay_* name in a page.
func documentedAnywhere(t *testing.T, page string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range backticked.FindAllStringSubmatch(string(b), -1) {
		names[m[1]] = true
	}
	return names
}

func diff(t *testing.T, code, docs map[string]bool, page string) {
	t.Helper()
	var out []string
	for n := range code {
		if !docs[n] {
			out = append(out, n+": registered in the code, missing from "+page)
		}
	}
	for n := range docs {
		if !code[n] {
			out = append(out, n+": documented in "+page+", registered nowhere in the code")
		}
	}
	sort.Strings(out)
	for _, d := range out {
		t.Error(d)
	}
}

func TestDocumentedMetricsAreExported(t *testing.T) {
	byPkg := registered(t)
	relay := map[string]bool{}
	for pkg, names := range byPkg {
		if _, ok := indirect[pkg]; ok {
			continue
		}
		for n := range names {
			relay[n] = true
		}
	}
	if len(relay) < 20 {
		t.Fatalf("found only %d relay metrics in the sources: the scan is broken", len(relay))
	}
	diff(t, relay, documented(t, "docs/metrics.md"), "docs/metrics.md")
	// README's short table of the key metrics: each one exists.
	for n := range documented(t, "README.md") {
		if !relay[n] {
			t.Errorf("%s: in README.md's metric table, registered nowhere in the code", n)
		}
	}
	for pkg, ind := range indirect {
		if len(byPkg[pkg]) == 0 {
			t.Errorf("package %s: no outbox_relay_* names found", pkg)
		}
		docs := map[string]bool{}
		for n := range documentedAnywhere(t, ind.page) {
			if strings.HasPrefix(n, ind.prefix) {
				docs[n] = true
			}
		}
		diff(t, byPkg[pkg], docs, ind.page)
	}
}

var (
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(text) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// prose returns the lines of a Markdown text outside fenced code blocks.
func prose(text string) []string {
	var out []string
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if !fence {
			out = append(out, line)
		}
	}
	return out
}

func TestRelativeLinksResolve(t *testing.T) {
	pages, _ := filepath.Glob(filepath.Join(root, "docs/*.md"))
	pages = append(pages, filepath.Join(root, "README.md"))
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, line := range prose(string(b)) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`).MatchString(target) {
					continue // http:, https:, mailto:
				}
				path, frag, _ := strings.Cut(target, "#")
				file := page
				if path != "" {
					file = filepath.Join(filepath.Dir(page), path)
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s: link %q: %s does not exist", rel, target, path)
						continue
					}
				}
				if frag == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				tb, err := os.ReadFile(file)
				if err != nil {
					t.Errorf("%s: link %q: %v", rel, target, err)
					continue
				}
				if !anchors(string(tb))[frag] {
					t.Errorf("%s: link %q: no heading with anchor #%s", rel, target, frag)
				}
			}
		}
	}
}

func TestAnchors(t *testing.T) {
	text := "# outbox-relay\n## Preflight: `outbox-relay check`\n### The role's privileges\n```sh\n# not a heading\n```\n## Retention\n## Retention\n"
	got := anchors(text)
	for _, want := range []string{"outbox-relay", "preflight-outbox-relay-check", "the-roles-privileges", "retention", "retention-1"} {
		if !got[want] {
			t.Errorf("anchor %q missing; got %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a comment in a code block became an anchor")
	}
}
