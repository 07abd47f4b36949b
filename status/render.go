package status

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Text writes the report for a terminal: a header, one aligned line per
// check (name, verdict, value), the advice of a check that is not ok on
// the next line, and the overall verdict with the exit code.
func Text(w io.Writer, r Report) error {
	f := r.Facts
	at := "-"
	if !f.At.IsZero() {
		at = f.At.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "outbox-relay status: table %s, slot %s, at %s\n\n", f.Table, f.Slot, at)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, strings.ToUpper(string(c.Verdict)), oneLine(c.Value))
		if c.Do != "" {
			fmt.Fprintf(tw, "\t\t-> %s\n", oneLine(c.Do))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%s (exit %d)\n", strings.ToUpper(string(r.Verdict)), r.ExitCode)
	return err
}

// JSON writes the report as one indented JSON object; the field names are
// documented in the README and stable.
func JSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
