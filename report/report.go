// Package report is the one report model of `outbox-relay status` and
// `outbox-relay check`: a list of checks, each a name, a verdict, the value
// found and, when not ok, the fix; the worst verdict with its exit code;
// and the rendering of both to text and JSON. Packages status and preflight
// make the checks; this package knows nothing of what they check. Pure: no
// I/O but the writer it is given.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Verdict is a check's outcome, and a report's: the worst of its checks.
type Verdict string

// Verdicts. Each command uses its own words: status says Bad, check says
// Fail (both rank as the worst) and Skip (the check could not be made: a
// prerequisite failed, or the broker does not say; it ranks as OK and
// changes no exit code).
const (
	OK   Verdict = "ok"
	Skip Verdict = "skip"
	Warn Verdict = "warn"
	Bad  Verdict = "bad"
	Fail Verdict = "fail"
)

// Exit codes of `outbox-relay status` and `outbox-relay check` (1 fatal
// and 2 usage are the commands' own): 0 every check ok (or skipped),
// ExitWarn some warn and none worse, ExitBad some check bad or failed.
const (
	ExitOK   = 0
	ExitBad  = 3
	ExitWarn = 4
)

func (v Verdict) rank() int {
	switch v {
	case OK, Skip:
		return 0
	case Warn:
		return 1
	}
	return 2
}

// Check is one line of a report: a stable name, the verdict, the value
// found and, when not ok, what to do. The JSON names are check's ("fix");
// status writes the fix as "do" (see status.Report).
type Check struct {
	Name    string  `json:"name"`
	Verdict Verdict `json:"verdict"`
	Value   string  `json:"value"`
	Fix     string  `json:"fix,omitempty"`
}

// Outcome is a report's overall verdict: the worst of its checks, and the
// exit code that goes with it.
type Outcome struct {
	Verdict  Verdict `json:"verdict"`
	ExitCode int     `json:"exit_code"`
}

// Judge returns the outcome of checks: the worst verdict (the first of the
// worst ones: Bad or Fail, whichever the checks use) with its exit code; OK
// and ExitOK when every check is ok or skipped, or there is none. Pure.
func Judge(checks []Check) Outcome {
	worst := OK
	for _, c := range checks {
		if c.Verdict.rank() > worst.rank() {
			worst = c.Verdict
		}
	}
	return Outcome{Verdict: worst, ExitCode: [...]int{ExitOK, ExitWarn, ExitBad}[worst.rank()]}
}

// Text writes a report for a terminal: title, a blank line, one aligned
// line per check (name, verdict, value), the fix of a check that is not ok
// on the next line, and the overall verdict with the exit code. Values and
// fixes are put on one line each. It blocks only on w.
func Text(w io.Writer, title string, checks []Check, o Outcome) error {
	fmt.Fprintf(w, "%s\n\n", title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, strings.ToUpper(string(c.Verdict)), OneLine(c.Value))
		if c.Fix != "" && c.Verdict != OK {
			fmt.Fprintf(tw, "\t\t-> %s\n", OneLine(c.Fix))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%s (exit %d)\n", strings.ToUpper(string(o.Verdict)), o.ExitCode)
	return err
}

// JSON writes v, a command's report, as one indented JSON object (the
// field names are v's). It blocks only on w.
func JSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// OneLine collapses every run of white space in s, newlines included, into
// one space, and trims both ends. Pure.
func OneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
