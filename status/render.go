package status

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/outbox-relay/outbox-relay/report"
)

// Text writes the report for a terminal (report.Text): a header naming the
// table, the slot and when the facts were read, one aligned line per check,
// the fix of a check that is not ok on the next line, and the overall
// verdict with the exit code.
func Text(w io.Writer, r Report) error {
	f := r.Facts
	at := "-"
	if !f.At.IsZero() {
		at = f.At.UTC().Format(time.RFC3339)
	}
	title := fmt.Sprintf("outbox-relay status: table %s, slot %s, at %s", f.Table, f.Slot, at)
	return report.Text(w, title, r.Checks, r.Outcome)
}

// JSON writes the report as one indented JSON object; the field names are
// documented in docs/commands.md and stable.
func JSON(w io.Writer, r Report) error { return report.JSON(w, r) }

// doCheck is a report.Check as status's JSON writes it: the fix is "do" (check's
// JSON calls it "fix").
type doCheck struct {
	Name    string         `json:"name"`
	Verdict report.Verdict `json:"verdict"`
	Value   string         `json:"value"`
	Fix     string         `json:"do,omitempty"`
}

// jsonReport is a Report as JSON writes it.
type jsonReport struct {
	report.Outcome
	Checks []doCheck `json:"checks"`
	Facts  Facts     `json:"facts"`
}

// MarshalJSON writes the documented field names: verdict, exit_code,
// checks (name, verdict, value, do) and facts.
func (r Report) MarshalJSON() ([]byte, error) {
	j := jsonReport{Outcome: r.Outcome, Facts: r.Facts}
	for _, c := range r.Checks {
		j.Checks = append(j.Checks, doCheck(c))
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes, for a program (or test) that
// decodes `outbox-relay status --json`.
func (r *Report) UnmarshalJSON(b []byte) error {
	var j jsonReport
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = Report{Outcome: j.Outcome, Facts: j.Facts}
	for _, c := range j.Checks {
		r.Checks = append(r.Checks, report.Check(c))
	}
	return nil
}
