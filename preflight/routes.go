package preflight

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Route is how the rows of one outbox table find their topic, as the relay
// routes them (relay.Outbox): the table's topic template, {schema} and
// {table} already replaced (sink.Template.ForTable), and the columns that
// fill {aggregate_type} and {event_type} ("" for none: the placeholder
// renders empty).
type Route struct {
	Table    outboxschema.Table
	Template sink.Template
	RouteBy  string // columns.route_by
	Type     string // columns.type
	// Headers is the headers column (columns.headers; "" none) and ID the
	// id column (columns.id): check reads the header names of the rows
	// (headers.go).
	Headers, ID string
	// Own is the relay's own table: its dead-lettered rows
	// (dead_lettered_at set) are not read, their routes were judged.
	Own bool
}

// Bounds of reading the routing values: per table at most MaxRouteValues
// distinct values (the commonest first) within routeStatementTimeout, and
// no new table read once routeBudget is spent, so a huge outbox cannot
// hold the check.
const (
	MaxRouteValues        = 10000
	routeStatementTimeout = 5 * time.Second
	routeBudget           = 15 * time.Second
	// routeValueMax cuts each value read: a longer one makes a topic name
	// longer than Kafka's 249 characters anyway.
	routeValueMax = 256
)

// RouteRead is what the rows of one outbox table route by (Options.Routes,
// same index).
type RouteRead struct {
	Table string // schema.name
	// Values are the distinct routing values, the commonest first, at most
	// MaxRouteValues; Capped when there were more.
	Values []RouteValue
	Capped bool
	// Fixed: the table's template uses no row field, so every event of the
	// table goes to one topic and nothing was read.
	Fixed bool
	// Err says why the rows could not be read (password removed); Skipped
	// why they were not (the table is missing: outbox_table says so).
	Err, Skipped string
	SQL          string // the query, for running it by hand
}

// RouteValue is one distinct routing value of a table and how many rows
// have it. A nil field is SQL NULL; a field the template does not render
// is "".
type RouteValue struct {
	AggregateType, EventType *string
	Rows                     int64
}

// routes are the outbox tables the relay routes: Options.Routes, or
// Options.Table read the relay's own way under kafka.topic_template.
func routes(o Options) []Route {
	if o.Routes != nil {
		return o.Routes
	}
	base, err := sink.ParseTemplate(o.Kafka.TopicTemplate)
	if err == nil {
		base, err = base.ForTable(o.Table.Schema, o.Table.Name)
	}
	if err != nil {
		return nil // the config was validated: not reached
	}
	return []Route{{Table: o.Table, Template: base, RouteBy: outboxschema.ColAggregateType, Type: outboxschema.ColEventType,
		Headers: outboxschema.ColHeaders, ID: outboxschema.ColID, Own: true}}
}

// columns returns the columns that fill r's template: "" for a
// placeholder the template does not use or no column fills.
func (r Route) columns() (aggCol, typeCol string) {
	agg, evt := r.Template.Uses()
	if agg {
		aggCol = r.RouteBy
	}
	if evt {
		typeCol = r.Type
	}
	return aggCol, typeCol
}

// routeSQL is the query reading the distinct routing values of r's rows,
// with their row counts, the commonest first; from is r's table as a FROM
// item (pgsetup.FromItem: ONLY for a plain table, whose inheritance
// children's rows are never streamed).
func routeSQL(r Route, from string, skipDeadLettered bool) string {
	aggCol, typeCol := r.columns()
	sel := func(c string) string {
		if c == "" {
			return "''"
		}
		return fmt.Sprintf("left(%s::text, %d)", outboxschema.QuoteIdent(c), routeValueMax)
	}
	where := ""
	if skipDeadLettered {
		where = " WHERE " + outboxschema.QuoteIdent(outboxschema.ColDeadLetteredAt) + " IS NULL"
	}
	return fmt.Sprintf("SELECT %s, %s, count(*) FROM %s%s GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT %d",
		sel(aggCol), sel(typeCol), from, where, MaxRouteValues+1)
}

// readRoutes reads the routing values of each route's rows. skip says why
// a route's table is not to be read ("" to read it); skipDeadLettered
// whether its dead-lettered rows are left out. Errors are facts, passed
// through scrub. Bounded: see routeBudget.
func readRoutes(ctx context.Context, conn *pgx.Conn, rs []Route, skip func(Route) string, skipDeadLettered func(Route) bool, scrub func(error) string) []RouteRead {
	out := make([]RouteRead, len(rs))
	start := time.Now()
	for i, r := range rs {
		rr := &out[i]
		rr.Table = r.Table.String()
		if aggCol, typeCol := r.columns(); aggCol == "" && typeCol == "" {
			rr.Fixed = true
			continue
		}
		if why := skip(r); why != "" {
			rr.Skipped = why
			continue
		}
		from, err := pgsetup.From(ctx, conn, r.Table)
		if err != nil {
			rr.Err = scrub(err)
			continue
		}
		rr.SQL = routeSQL(r, from, skipDeadLettered(r))
		if time.Since(start) > routeBudget {
			rr.Err = fmt.Sprintf("not read: the check spent its %s on the tables before", routeBudget)
			continue
		}
		if err := readRoute(ctx, conn, rr); err != nil {
			rr.Err = scrub(err)
		}
	}
	return out
}

func readRoute(ctx context.Context, conn *pgx.Conn, rr *RouteRead) error {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", routeStatementTimeout.Milliseconds())); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, rr.SQL)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var v RouteValue
		if err := rows.Scan(&v.AggregateType, &v.EventType, &v.Rows); err != nil {
			return err
		}
		if len(rr.Values) == MaxRouteValues {
			rr.Capped = true
			break
		}
		rr.Values = append(rr.Values, v)
	}
	return rows.Err()
}

// topicUse is one topic the relay will publish to and what routes there.
type topicUse struct {
	Topic      string
	DeadLetter bool     // dead_letter.topic (on_poison: dlq)
	Every      []string // sources all of whose events go here: a table whose template uses no row field, "message events"
	Tables     []string // tables some of whose rows route here
	Fields     []string // the columns that route them (to fix the rows)
	Values     int      // distinct routing values that render to it
	Rows       int64
	Example    string // the commonest routing value, described
}

// badRoute is a routing value whose events can never be published: poison.
type badRoute struct {
	Source string // the table, or "message events"
	Value  string // described (describeValue)
	Rows   int64  // 0: unknown (not read from rows)
	Reason string // the dead-letter reason
	Err    string
	Fields []string // the columns to fix ("" none: the template)
}

// routePlan is where the events go: every topic (sorted by name) and every
// routing value that cannot be published.
type routePlan struct {
	Topics      []*topicUse
	Bad         []badRoute
	EventTopics int // distinct topics of events, the dead-letter topic not counted
	// MessagesUnchecked: messages.prefix is set and the template renders
	// the messages' fields, which are in no table.
	MessagesUnchecked bool
}

// messageSource names the events of messages.prefix in the report.
const messageSource = "message events (messages.prefix)"

// planRoutes renders every routing value read with the relay's own router
// (sink.Router: the template, the allowlist) and groups the values by
// topic: the topics with what routes to each, and the values that are
// poison. Pure.
func planRoutes(o Options, reads []RouteRead) routePlan {
	var p routePlan
	by := map[string]*topicUse{}
	use := func(topic string) *topicUse {
		u := by[topic]
		if u == nil {
			u = &topicUse{Topic: topic}
			by[topic] = u
		}
		return u
	}
	base, err := sink.ParseTemplate(o.Kafka.TopicTemplate)
	allow, err2 := sink.ParseAllowlist(o.Kafka.TopicAllowlist)
	// The limit is judged apart (kafka.max_topics): the router must admit
	// every topic here, whatever the order the values are read in.
	router, err3 := sink.NewRouter(base, sink.MaxMaxTopics, allow, o.DeadLetterTopic)
	if err := errors.Join(err, err2, err3); err != nil {
		return p // the config was validated: not reached
	}
	route := func(tmpl sink.Template, agg, evt string) (string, string, error) {
		topic, err := router.RouteWith(tmpl, agg, evt)
		switch {
		case err == nil, errors.Is(err, sink.ErrTopicLimit):
			return topic, "", nil
		case errors.Is(err, sink.ErrTopicNotAllowed):
			return topic, deadletter.ReasonTopicNotAllowed, err
		}
		return topic, deadletter.ReasonInvalidTopic, err
	}

	for i, r := range routes(o) {
		var rd RouteRead // none read (PostgreSQL unreachable): a fixed topic still counts
		if i < len(reads) {
			rd = reads[i]
		}
		table := r.Table.String()
		aggCol, typeCol := r.columns()
		if aggCol == "" && typeCol == "" {
			topic, reason, err := route(r.Template, "", "")
			if err != nil {
				p.Bad = append(p.Bad, badRoute{Source: table, Value: "every event", Reason: reason, Err: err.Error()})
				continue
			}
			u := use(topic)
			u.Every = append(u.Every, table)
			continue
		}
		fields := nonEmpty(aggCol, typeCol)
		for _, v := range rd.Values {
			desc := describeValue(aggCol, typeCol, v)
			if null := nullField(aggCol, typeCol, v); null != "" {
				p.Bad = append(p.Bad, badRoute{Source: table, Value: desc, Rows: v.Rows, Reason: deadletter.ReasonBadRow,
					Err: fmt.Sprintf("column %q is NULL", null), Fields: []string{null}})
				continue
			}
			topic, reason, err := route(r.Template, deref(v.AggregateType), deref(v.EventType))
			if err != nil {
				p.Bad = append(p.Bad, badRoute{Source: table, Value: desc, Rows: v.Rows, Reason: reason, Err: err.Error(), Fields: fields})
				continue
			}
			u := use(topic)
			if !slices.Contains(u.Tables, table) {
				u.Tables = append(u.Tables, table)
			}
			for _, f := range fields {
				if !slices.Contains(u.Fields, f) {
					u.Fields = append(u.Fields, f)
				}
			}
			if u.Values == 0 {
				u.Example = desc
			}
			u.Values++
			u.Rows += v.Rows
		}
	}
	if o.MessagesPrefix != "" {
		// Messages are routed with the plain template ({schema} and
		// {table} empty); their fields are in no table.
		if agg, evt := base.Uses(); agg || evt {
			p.MessagesUnchecked = true
		} else if topic, reason, err := route(base, "", ""); err != nil {
			p.Bad = append(p.Bad, badRoute{Source: messageSource, Value: "every event", Reason: reason, Err: err.Error()})
		} else {
			u := use(topic)
			u.Every = append(u.Every, messageSource)
		}
	}
	for _, u := range by {
		if u.Topic != o.DeadLetterTopic {
			p.EventTopics++
		}
	}
	if !o.PoisonHalts && o.DeadLetterTopic != "" {
		use(o.DeadLetterTopic).DeadLetter = true
	}
	for _, u := range by {
		p.Topics = append(p.Topics, u)
	}
	slices.SortFunc(p.Topics, func(a, b *topicUse) int { return strings.Compare(a.Topic, b.Topic) })
	return p
}

// names are the topics of p, sorted.
func (p routePlan) names() []string {
	out := make([]string, len(p.Topics))
	for i, u := range p.Topics {
		out[i] = u.Topic
	}
	return out
}

func (p routePlan) topic(name string) *topicUse {
	for _, u := range p.Topics {
		if u.Topic == name {
			return u
		}
	}
	return nil
}

// describeValue is a routing value as the report names it: each rendered
// column with its value (NULL unquoted).
func describeValue(aggCol, typeCol string, v RouteValue) string {
	var parts []string
	for _, f := range []struct {
		col string
		val *string
	}{{aggCol, v.AggregateType}, {typeCol, v.EventType}} {
		switch {
		case f.col == "":
		case f.val == nil:
			parts = append(parts, f.col+" NULL")
		default:
			s := *f.val
			if len(s) >= routeValueMax {
				s += "..."
			}
			parts = append(parts, f.col+" "+strconv.Quote(s))
		}
	}
	return strings.Join(parts, ", ")
}

// nullField is the first rendered column that is NULL in v, or "".
func nullField(aggCol, typeCol string, v RouteValue) string {
	switch {
	case aggCol != "" && v.AggregateType == nil:
		return aggCol
	case typeCol != "" && v.EventType == nil:
		return typeCol
	}
	return ""
}

func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// maxLines bounds the lines of one kind (a missing topic, a bad route): the
// rest are named on one more line.
const maxLines = 20

// routeSummary says what was read for kafka.topics: per table how many
// routing values in how many rows, or why none.
func routeSummary(o Options, reads []RouteRead, p routePlan) string {
	var parts []string
	rs := routes(o)
	for i, rd := range reads {
		if i >= len(rs) {
			break
		}
		switch {
		case rd.Fixed:
			parts = append(parts, rd.Table+": every event to one topic (no row field in its template)")
		case rd.Skipped != "":
			parts = append(parts, rd.Table+": not read ("+rd.Skipped+")")
		case rd.Err != "":
			parts = append(parts, rd.Table+": could not read its rows' routing values ("+rd.Err+")")
		case len(rd.Values) == 0:
			parts = append(parts, rd.Table+": no rows yet, so no routing value checked")
		default:
			var rows int64
			for _, v := range rd.Values {
				rows += v.Rows
			}
			aggCol, typeCol := rs[i].columns()
			s := fmt.Sprintf("%s: %s (%s) in %s", rd.Table, plural(int64(len(rd.Values)), "routing value", "routing values"),
				strings.Join(nonEmpty(aggCol, typeCol), ", "), plural(rows, "row", "rows"))
			if rd.Capped {
				s += fmt.Sprintf(": more than %d distinct values, only the %d commonest checked", MaxRouteValues, MaxRouteValues)
			}
			parts = append(parts, s)
		}
	}
	if p.MessagesUnchecked {
		parts = append(parts, "message events (messages.prefix) are in no table: their topics are not checked")
	}
	return strings.Join(parts, "; ")
}

// readFailures is the fix for tables whose rows could not be read, or "".
func readFailures(reads []RouteRead) string {
	var sqls []string
	for _, rd := range reads {
		if rd.Err != "" && rd.SQL != "" {
			sqls = append(sqls, rd.SQL+";")
		}
	}
	if len(sqls) == 0 {
		return ""
	}
	return "the relay itself does not read the table; to check the topics run check as a role that may SELECT the routing columns, " +
		"or when the table is smaller, or run the query off-peak and look for the values' topics: " + strings.Join(sqls, " ")
}

// routesChecks adds one kafka.route line per routing value that can never
// be published (poison), and kafka.max_topics when the rows route to more
// topics than the limit. Pure.
func routesChecks(o Options, p routePlan, add addFunc) {
	verdict, fate := Warn, "dead-lettered (on_poison: dlq)"
	if o.PoisonHalts {
		verdict, fate = Fail, "the relay halts at it (on_poison: halt)"
	}
	for i, b := range p.Bad {
		if i == maxLines {
			var rest []string
			for _, b := range p.Bad[i:] {
				rest = append(rest, b.Source+" "+b.Value)
			}
			add("kafka.route", verdict, fmt.Sprintf("and %d more routing values that cannot be published: %s", len(rest), cut(rest, 100)),
				"fix those rows as the lines above say")
			break
		}
		v := b.Source + ": " + b.Value
		if b.Rows > 0 {
			v += " (" + plural(b.Rows, "row", "rows") + ")"
		}
		v += ": " + b.Err + "; its events are poison (" + b.Reason + "), " + fate
		var fix string
		fields := "the rows' " + strings.Join(b.Fields, " or ")
		switch {
		case b.Reason == deadletter.ReasonBadRow:
			fix = "set " + strings.Join(b.Fields, " or ") + " in those rows (NULL is a bad row), or fix the writer"
		case b.Reason == deadletter.ReasonTopicNotAllowed && len(b.Fields) > 0:
			fix = "add the topic to kafka.topic_allowlist, or fix " + fields
		case b.Reason == deadletter.ReasonTopicNotAllowed:
			fix = "add the topic to kafka.topic_allowlist, or change the topic template"
		case len(b.Fields) > 0:
			fix = "fix " + fields + " (or the topic template)"
		default:
			fix = "fix the topic template"
		}
		add("kafka.route", verdict, v, fix)
	}
	if max := o.Kafka.MaxTopics; max > 0 && p.EventTopics > max {
		add("kafka.max_topics", Warn, fmt.Sprintf("the events route to %d distinct topics, more than kafka.max_topics %d: "+
			"an event for one more topic than the first %d the relay meets is poison (topic_limit)", p.EventTopics, max, max),
			fmt.Sprintf("raise kafka.max_topics to at least %d, or fix the rows that route to unwanted topics", p.EventTopics))
	}
}

// missingTopicChecks adds one kafka.topic line per missing topic, at most
// maxLines, then one line naming the rest. Pure.
func missingTopicChecks(f Facts, p routePlan, missing []string, add addFunc) {
	o, k := f.Options, f.Kafka
	verdict, why := OK, "created at the first event (kafka.auto_create_topics and the brokers' auto.create.topics.enable are on), with the brokers' default partition count"
	also := ", or set kafka.auto_create_topics: true"
	switch {
	case !o.Kafka.AutoCreateTopics:
		verdict, why = Fail, "kafka.auto_create_topics is false: its events wait for it, holding the slot, up to kafka.missing_topic_timeout, then are poison (unknown_topic)"
	case k.BrokerAutoCreate != nil && !*k.BrokerAutoCreate:
		verdict, why = Fail, "the brokers' auto.create.topics.enable is false: its events wait for it, holding the slot, up to kafka.missing_topic_timeout, then are poison (unknown_topic)"
		also = ", or set auto.create.topics.enable=true on the brokers"
	case k.BrokerAutoCreate == nil:
		verdict, why = Warn, "created at the first event only if the brokers' auto.create.topics.enable is true: could not read it"
		also = ""
	}
	for i, name := range missing {
		if i == maxLines {
			add("kafka.topic", verdict, fmt.Sprintf("and %d more topics do not exist: %s; %s", len(missing)-i, cut(missing[i:], 100), why),
				"create each (kafka-topics.sh --bootstrap-server "+o.Kafka.Brokers[0]+" --create --topic TOPIC --partitions N)"+also)
			break
		}
		v := name + " does not exist"
		fix := fmt.Sprintf("create topic %s (kafka-topics.sh --bootstrap-server %s --create --topic %s --partitions N)%s", name, o.Kafka.Brokers[0], name, also)
		if u := p.topic(name); u != nil {
			var what []string
			if u.DeadLetter {
				what = append(what, "the dead-letter topic (dead_letter.topic, on_poison: dlq)")
			}
			for _, s := range u.Every {
				what = append(what, "every event of "+s+" goes to it")
			}
			if u.Values > 0 {
				verb := "route"
				if u.Values == 1 {
					verb = "routes"
				}
				s := fmt.Sprintf("%s of %s %s to it", plural(int64(u.Values), "routing value", "routing values"), strings.Join(u.Tables, ", "), verb)
				if u.Values == 1 {
					s += fmt.Sprintf(" (%s, %s)", u.Example, plural(u.Rows, "row", "rows"))
				} else {
					s += fmt.Sprintf(" (%s; the commonest %s)", plural(u.Rows, "row", "rows"), u.Example)
				}
				what = append(what, s)
				fix += ", or fix the rows' " + strings.Join(u.Fields, " or ")
			}
			if len(what) > 0 {
				v += ": " + strings.Join(what, "; ")
			}
		}
		add("kafka.topic", verdict, v+"; "+why, fix)
	}
}

// cut joins at most n of ss, saying how many more there are.
func cut(ss []string, n int) string {
	if len(ss) <= n {
		return strings.Join(ss, ", ")
	}
	return strings.Join(ss[:n], ", ") + fmt.Sprintf(" and %d more", len(ss)-n)
}
