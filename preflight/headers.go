package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Bounds of reading the header names: per table at most MaxHeaderNames
// distinct suspect names (the commonest first) within
// routeStatementTimeout, and no new table read once headerBudget is spent.
// A name is read whole up to headerNameMax characters; a longer one by its
// first and last headerNameMax/2, which keeps its verdict but for a control
// character in its middle.
const (
	MaxHeaderNames = 1000
	headerBudget   = 10 * time.Second
	headerNameMax  = 2048
)

// HeaderNamesRead is what was read of the header names of one outbox
// table's rows (Options.Routes, same index): the names the rule
// (outboxschema.CheckHeaderName) refuses, with their rows.
type HeaderNamesRead struct {
	Table string // schema.name
	// NoColumn: the table has no headers column (columns.headers none).
	NoColumn bool
	// Refused are the names the rule refuses, the commonest first.
	Refused []HeaderName
	// Suspects is how many distinct names the query returned (every name
	// that is not plain printable ASCII, or is a reserved one in ASCII
	// letter case), Capped when there were more than MaxHeaderNames.
	Suspects int
	Capped   bool
	// Err says why the rows could not be read; Skipped why they were not.
	Err, Skipped string
	SQL          string // the query, for running it by hand
}

// HeaderName is one refused header name and the rows that use it.
type HeaderName struct {
	Name    string // as read (cut: Long)
	Long    bool   // longer than headerNameMax: Name is its first and last half
	Rows    int64
	Example string // the id of one of the rows
	Err     string // the rule's verdict (outboxschema.HeaderNameError)
	Reason  string // the dead-letter reason: reserved_header or bad_row
}

// headerSQL is the query reading r's suspect header names: the top-level
// keys of its headers column (cast to jsonb; a row whose headers are no
// JSON object has none) that are not plain printable ASCII without a space
// at either end, or that are reserved in ASCII letter case ($1: the
// reserved names, lower case). CheckHeaderName judges the rest exactly,
// in Go: SQL knows no Unicode categories.
func headerSQL(r Route, skipDeadLettered bool) string {
	h, id := outboxschema.QuoteIdent(r.Headers), outboxschema.QuoteIdent(r.ID)
	const upper, lower = "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"
	where := "o." + h + " IS NOT NULL"
	if skipDeadLettered {
		where += " AND o." + outboxschema.QuoteIdent(outboxschema.ColDeadLetteredAt) + " IS NULL"
	}
	return fmt.Sprintf(`SELECT CASE WHEN length(k) <= %[1]d THEN k ELSE left(k, %[2]d) || right(k, %[2]d) END, length(k) > %[1]d, count(*), min(o.%[3]s::text) `+
		`FROM %[4]s o, jsonb_object_keys(CASE WHEN jsonb_typeof(o.%[5]s::jsonb) = 'object' THEN o.%[5]s::jsonb END) k `+
		`WHERE %[6]s AND (k COLLATE "C" !~ '^[!-~]([ -~]*[!-~])?$' OR translate(k, '%[7]s', '%[8]s') = ANY($1) OR translate(left(k, %[9]d), '%[7]s', '%[8]s') = '%[10]s') `+
		`GROUP BY k ORDER BY 3 DESC, k COLLATE "C" LIMIT %[11]d`,
		headerNameMax, headerNameMax/2, id, r.Table.Quoted(), h, where, upper, lower,
		len(outboxschema.DeadLetterPrefix), outboxschema.DeadLetterPrefix, MaxHeaderNames+1)
}

// reservedLower are the reserved header names, lower case, with extra.
func reservedLower(extra []string) []string {
	var out []string
	for _, rs := range [][]string{outboxschema.RelayHeaders, outboxschema.MarkHeaders, extra} {
		for _, r := range rs {
			out = append(out, strings.ToLower(r))
		}
	}
	return out
}

// readHeaderNames reads the refused header names of each route's rows,
// judged as the relay judges them (CheckHeaderName with extra). skip and
// skipDeadLettered as for readRoutes. Bounded: see headerBudget.
func readHeaderNames(ctx context.Context, conn *pgx.Conn, rs []Route, extra []string, skip func(Route) string, skipDeadLettered func(Route) bool, scrub func(error) string) []HeaderNamesRead {
	out := make([]HeaderNamesRead, len(rs))
	start := time.Now()
	for i, r := range rs {
		hr := &out[i]
		hr.Table = r.Table.String()
		if r.Headers == "" {
			hr.NoColumn = true
			continue
		}
		if why := skip(r); why != "" {
			hr.Skipped = why
			continue
		}
		hr.SQL = headerSQL(r, skipDeadLettered(r))
		if time.Since(start) > headerBudget {
			hr.Err = fmt.Sprintf("not read: the check spent its %s on the tables before", headerBudget)
			continue
		}
		if err := readHeaderTable(ctx, conn, hr, extra); err != nil {
			hr.Err = scrub(err)
		}
	}
	return out
}

func readHeaderTable(ctx context.Context, conn *pgx.Conn, hr *HeaderNamesRead, extra []string) error {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", routeStatementTimeout.Milliseconds())); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, hr.SQL, reservedLower(extra))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n HeaderName
		if err := rows.Scan(&n.Name, &n.Long, &n.Rows, &n.Example); err != nil {
			return err
		}
		if hr.Suspects == MaxHeaderNames {
			hr.Capped = true
			break
		}
		hr.Suspects++
		if judgeHeaderName(&n, extra) {
			hr.Refused = append(hr.Refused, n)
		}
	}
	return rows.Err()
}

// judgeHeaderName sets n's Err and Reason when the rule refuses its name,
// and reports whether it does. Pure.
func judgeHeaderName(n *HeaderName, extra []string) bool {
	err := outboxschema.CheckHeaderName(n.Name, extra...)
	if err == nil {
		return false
	}
	n.Err, n.Reason = err.Error(), deadletter.ReasonBadRow
	var he *outboxschema.HeaderNameError
	if errors.As(err, &he) && he.Reserved != "" {
		n.Reason = deadletter.ReasonReservedHeader
	}
	return true
}

// headerChecks adds one headers line per refused header name (at most
// maxLines, then one naming the rest), warn under on_poison: dlq and fail
// under halt, an ok line per table read without one, and a warn line per
// table whose rows could not be read. Pure.
func headerChecks(o Options, reads []HeaderNamesRead, add addFunc) {
	verdict, fate := Warn, "dead-lettered (on_poison: dlq)"
	if o.PoisonHalts {
		verdict, fate = Fail, "the relay halts at the first (on_poison: halt)"
	}
	const fix = "rename the header in the writer that inserts these rows (outbox.Write refuses such a name; the rule: docs/outbox-table.md#headers); " +
		"the rows already written cannot be published as they are: fix their headers and replay them (docs/dead-letters.md)"
	lines := 0
	for _, hr := range reads {
		switch {
		case hr.NoColumn:
			continue
		case hr.Skipped != "":
			add("headers", Skip, hr.Table+": not read ("+hr.Skipped+")", "")
			continue
		case hr.Err != "":
			add("headers", Warn, hr.Table+": could not read its rows' header names ("+hr.Err+")",
				"run the query as a role that may read the table, or off-peak: "+hr.SQL+";")
			continue
		}
		var rest []string
		for _, n := range hr.Refused {
			name := outboxschema.QuoteHeaderName(n.Name)
			if n.Long {
				name += " (cut: longer than " + fmt.Sprint(headerNameMax) + " characters)"
			}
			if lines == maxLines {
				rest = append(rest, name)
				continue
			}
			lines++
			add("headers", verdict, fmt.Sprintf("%s: %s, e.g. id=%s: %s; those rows are poison (%s), %s",
				hr.Table, plural(n.Rows, "row", "rows"), n.Example, n.Err, n.Reason, fate), fix)
		}
		if len(rest) > 0 {
			add("headers", verdict, fmt.Sprintf("%s: and %d more refused header names: %s", hr.Table, len(rest), cut(rest, 100)), fix)
		}
		if len(hr.Refused) == 0 {
			v := hr.Table + ": no header name the relay refuses (docs/outbox-table.md#headers)"
			if hr.Capped {
				v += fmt.Sprintf("; more than %d distinct names that are not plain ASCII, only the %d commonest checked", MaxHeaderNames, MaxHeaderNames)
			}
			add("headers", OK, v, "")
		}
	}
}
