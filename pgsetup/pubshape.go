package pgsetup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Shape is what a publication does with one outbox table's inserts: the
// facts that decide whether every insert is streamed, whole and under the
// table's own name. ReadShape reads it; Problems judges it. A plain value.
type Shape struct {
	Publication string
	Table       outboxschema.Table
	// Tables are all the outbox tables the relay reads from the
	// publication: a SET TABLE fix lists them all.
	Tables     []outboxschema.Table
	VersionNum int // server_version_num

	Exists  bool // the publication exists
	Insert  bool // pubinsert: publish includes insert
	ViaRoot bool // publish_via_partition_root
	// GenStored: stored generated columns are published
	// (publish_generated_columns = stored, PostgreSQL 18+).
	GenStored   bool
	Partitioned bool // the table is partitioned (relkind 'p')
	// Covered: pg_publication_tables lists the table under its own name.
	Covered bool
	// StreamedAs is the ancestor the table's rows are streamed under (the
	// table is a partition of a table the publication streams with
	// publish_via_partition_root); "" when none.
	StreamedAs string
	// ColumnList is the table's column list in the publication (PostgreSQL
	// 15+), nil when it has none: every column is published.
	ColumnList []string
	// RowFilter is the table's row filter (WHERE) in the publication
	// (PostgreSQL 15+), "" when it has none.
	RowFilter string
	// Generated are the columns the relay reads that are generated
	// columns: name -> 's' (stored) or 'v' (virtual, PostgreSQL 18).
	Generated map[string]byte
	// Read are the columns the relay reads that the table has.
	Read []string
	// Others: the publication holds tables (or schemas) besides the outbox
	// tables, which a SET TABLE would remove.
	Others bool
}

// Problem is one way a publication drops or changes what is streamed for
// an outbox table, with the statement that fixes it.
type Problem struct {
	Kind string // one of the Kind* constants
	What string // what is wrong, naming the publication and the table
	Fix  string // the SQL (or step) that fixes it
}

// Kinds of Problem.
const (
	KindMissing     = "missing"      // the publication does not exist
	KindPublish     = "publish"      // publish lacks insert
	KindViaRoot     = "via_root"     // a partitioned outbox streamed under its partitions' names
	KindStreamedAs  = "streamed_as"  // a partition streamed under its ancestor's name
	KindNotIncluded = "not_included" // the table is not in the publication
	KindColumnList  = "column_list"  // a column list: columns not streamed
	KindRowFilter   = "row_filter"   // a row filter: rows not streamed
	KindGenerated   = "generated"    // a column the relay reads is generated and not streamed
)

func (p Problem) String() string { return p.What + ": " + Statement(p.Fix) }

// Statement ends SQL with a semicolon unless it has one. Pure.
func Statement(sql string) string {
	if strings.HasSuffix(sql, ";") || strings.HasSuffix(sql, ".") {
		return sql
	}
	return sql + ";"
}

// MappingColumns are the columns the relay reads of m's table, in mapping
// order, without duplicates. Pure: any goroutine, never blocks.
func MappingColumns(m outboxschema.Mapping) []string {
	var cols []string
	add := func(c string) {
		if c != "" && !contains(cols, c) {
			cols = append(cols, c)
		}
	}
	for _, c := range []string{m.ID, m.Key, m.Type, m.Payload, m.RouteBy, m.Headers, m.EventID, m.ReplayOf} {
		add(c)
	}
	for _, p := range m.Additional {
		add(p.Column)
	}
	return cols
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// ReadShape reads what publication pub does with the inserts of m's table;
// all are every outbox table the relay reads from pub (m's among them).
// Column lists and row filters are read only from PostgreSQL 15, which
// has them. It blocks on conn, which the caller must not use from another
// goroutine meanwhile. Prepare, preflight and retention's horizon call it.
func ReadShape(ctx context.Context, conn *pgx.Conn, pub string, m outboxschema.Mapping, all []outboxschema.Table) (Shape, error) {
	t := m.Table
	s := Shape{Publication: pub, Table: t, Tables: all}
	quoted := make([]string, len(all))
	for i, x := range all {
		quoted[i] = x.Quoted()
	}
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&s.VersionNum); err != nil {
		return s, fmt.Errorf("read server_version_num: %w", err)
	}
	// Schemas in the publication (PostgreSQL 15+) are removed by SET TABLE
	// as well.
	schemas := "false"
	if s.VersionNum >= 150000 {
		schemas = "EXISTS (SELECT 1 FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid)"
	}
	var gencols string
	err := conn.QueryRow(ctx, `SELECT p.oid IS NOT NULL, coalesce(p.pubinsert, false), coalesce(p.pubviaroot, false),
		coalesce(to_jsonb(p) ->> 'pubgencols', ''),
		coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($2)), false),
		EXISTS (SELECT 1 FROM pg_publication_tables pt WHERE pt.pubname = $1 AND pt.schemaname = $3 AND pt.tablename = $4),
		coalesce((SELECT format('%I.%I', pt.schemaname, pt.tablename) FROM pg_partition_ancestors(to_regclass($2)) a
			JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace
			JOIN pg_publication_tables pt ON pt.pubname = $1 AND pt.schemaname = n.nspname AND pt.tablename = c.relname
			WHERE a.relid <> to_regclass($2) LIMIT 1), ''),
		coalesce(p.puballtables OR `+schemas+` OR EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid
			AND pr.prrelid NOT IN (SELECT to_regclass(x) FROM unnest($5::text[]) x WHERE to_regclass(x) IS NOT NULL)), false)
		FROM (SELECT 1) one LEFT JOIN pg_publication p ON p.pubname = $1`,
		pub, t.Quoted(), t.Schema, t.Name, quoted).Scan(&s.Exists, &s.Insert, &s.ViaRoot, &gencols, &s.Partitioned, &s.Covered, &s.StreamedAs, &s.Others)
	if err != nil {
		return s, fmt.Errorf("read publication %q for %s: %w", pub, t, err)
	}
	s.GenStored = gencols == "s" || gencols == "true"
	if s.Exists && s.VersionNum >= 150000 {
		var filter *string
		err := conn.QueryRow(ctx, `SELECT CASE WHEN pr.prattrs IS NULL THEN NULL ELSE
				ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = pr.prrelid AND a.attnum = ANY (pr.prattrs::int2[]) ORDER BY a.attnum) END,
			pg_get_expr(pr.prqual, pr.prrelid)
			FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
			WHERE p.pubname = $1 AND pr.prrelid = to_regclass($2)`, pub, t.Quoted()).Scan(&s.ColumnList, &filter)
		switch {
		case errors.Is(err, pgx.ErrNoRows): // in through FOR ALL TABLES or a schema, or not at all
		case err != nil:
			return s, fmt.Errorf("read the column list and row filter of %s in publication %q: %w", t, pub, err)
		case filter != nil:
			s.RowFilter = *filter
		}
	}
	rows, err := conn.Query(ctx, `SELECT attname::text, attgenerated::text FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped AND attname = ANY ($2::text[]) ORDER BY attnum`, t.Quoted(), MappingColumns(m))
	if err != nil {
		return s, fmt.Errorf("read the columns of %s: %w", t, err)
	}
	var name, gen string
	_, err = pgx.ForEachRow(rows, []any{&name, &gen}, func() error {
		s.Read = append(s.Read, name)
		if gen != "" {
			if s.Generated == nil {
				s.Generated = map[string]byte{}
			}
			s.Generated[name] = gen[0]
		}
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("read the columns of %s: %w", t, err)
	}
	return s, nil
}

// Problems says every way the publication drops or changes what is streamed
// for the table, most basic first, each with the SQL that fixes it; nil
// when it streams every insert, whole, under the table's own name. Pure:
// any goroutine, never blocks.
func (s Shape) Problems() []Problem {
	pub := outboxschema.QuoteIdent(s.Publication)
	t := s.Table
	name := fmt.Sprintf("publication %s", pub)
	if !s.Exists {
		return []Problem{{KindMissing, name + " does not exist", PublicationSQL(s.Publication, s.tables())}}
	}
	var ps []Problem
	if !s.Insert {
		ps = append(ps, Problem{KindPublish, fmt.Sprintf("%s does not publish inserts (its publish option lacks insert): no row of %s is streamed", name, t),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert')", pub)})
	}
	if s.Partitioned && !s.ViaRoot {
		ps = append(ps, Problem{KindViaRoot, fmt.Sprintf("outbox table %s is partitioned but %s lacks publish_via_partition_root: its rows are streamed under the partitions' names and ignored", t, name),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pub)})
	}
	switch {
	case s.StreamedAs != "":
		ps = append(ps, Problem{KindStreamedAs, fmt.Sprintf("outbox table %s is a partition of %s, which %s streams with publish_via_partition_root: its rows are streamed under %s's name and ignored", t, s.StreamedAs, name, s.StreamedAs),
			fmt.Sprintf("BEGIN; ALTER PUBLICATION %s DROP TABLE %s; ALTER PUBLICATION %s ADD TABLE %s; COMMIT;", pub, s.StreamedAs, pub, t.Quoted())})
	case !s.Covered && !(s.Partitioned && !s.ViaRoot):
		ps = append(ps, Problem{KindNotIncluded, fmt.Sprintf("%s does not include %s", name, t),
			fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, t.Quoted())})
	}
	if s.ColumnList != nil {
		var left []string
		for _, c := range s.Read {
			if !contains(s.ColumnList, c) {
				left = append(left, c)
			}
		}
		what := fmt.Sprintf("%s streams only the columns (%s) of %s", name, strings.Join(s.ColumnList, ", "), t)
		if len(left) > 0 {
			what += fmt.Sprintf(": %s, which the relay reads, would be published as NULL (headers stripped, event_id replaced by the row id)", strings.Join(left, ", "))
		} else {
			what += ": a column added later (a migration's event_id, for one) would never be streamed"
		}
		ps = append(ps, Problem{KindColumnList, what, s.plainTableSQL()})
	}
	if s.RowFilter != "" {
		ps = append(ps, Problem{KindRowFilter, fmt.Sprintf("%s has a row filter on %s (WHERE %s): the rows it filters out are never streamed, yet the slot passes them", name, t, s.RowFilter),
			s.plainTableSQL()})
	}
	for _, c := range s.Read {
		g, ok := s.Generated[c]
		switch {
		case !ok:
		case g == 's' && s.GenStored:
		case g == 's' && s.VersionNum >= 180000:
			ps = append(ps, Problem{KindGenerated, fmt.Sprintf("column %s of %s, which the relay reads, is a stored generated column and %s does not publish generated columns: it would be published as NULL", c, t, name),
				fmt.Sprintf("ALTER PUBLICATION %s SET (publish_generated_columns = stored)", pub)})
		case g == 's':
			ps = append(ps, Problem{KindGenerated, fmt.Sprintf("column %s of %s, which the relay reads, is a generated column, which PostgreSQL before 18 never streams: it would be published as NULL; make it a plain column (which the writer, a DEFAULT or a trigger then fills)", c, t),
				fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s DROP EXPRESSION", t.Quoted(), outboxschema.QuoteIdent(c))})
		default:
			ps = append(ps, Problem{KindGenerated, fmt.Sprintf("column %s of %s, which the relay reads, is a virtual generated column, which logical replication never streams: it would be published as NULL", c, t),
				fmt.Sprintf("replace %s of %s with a plain column the writer, a DEFAULT or a trigger fills, or with a stored generated column and ALTER PUBLICATION %s SET (publish_generated_columns = stored).", outboxschema.QuoteIdent(c), t.Quoted(), pub)})
		}
	}
	return ps
}

func (s Shape) tables() []outboxschema.Table {
	if len(s.Tables) == 0 {
		return []outboxschema.Table{s.Table}
	}
	return s.Tables
}

// plainTableSQL publishes the outbox tables whole: SET TABLE when the
// publication holds nothing else, which it would remove; otherwise the
// table dropped and added back in one transaction (no change falls in
// between).
func (s Shape) plainTableSQL() string {
	pub := outboxschema.QuoteIdent(s.Publication)
	if !s.Others {
		ts := s.tables()
		quoted := make([]string, len(ts))
		for i, x := range ts {
			quoted[i] = x.Quoted()
		}
		return fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s", pub, strings.Join(quoted, ", "))
	}
	return fmt.Sprintf("BEGIN; ALTER PUBLICATION %s DROP TABLE %s; ALTER PUBLICATION %s ADD TABLE %s; COMMIT;", pub, s.Table.Quoted(), pub, s.Table.Quoted())
}
