package pgsetup

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// RowReader is the part of a pgx connection, pool or transaction that
// reads one row.
type RowReader interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// FromItem is the FROM item that reads exactly the rows of outbox table t
// the slot streams: "ONLY t" for a plain table (an inheritance child's
// rows are not streamed as t's: see Inheritance), t itself for a
// partitioned one (publish_via_partition_root streams every partition's
// rows as the root's, and ONLY would read none). Pure.
func FromItem(t outboxschema.Table, partitioned bool) string {
	if partitioned {
		return t.Quoted()
	}
	return "ONLY " + t.Quoted()
}

// From reads t's kind and returns its FromItem. A missing table is read as
// plain (the statement then fails naming it). Any goroutine; blocks on one
// query on q, which the caller must not use from another goroutine
// meanwhile.
func From(ctx context.Context, q RowReader, t outboxschema.Table) (string, error) {
	var kind *string
	if err := q.QueryRow(ctx, "SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))", t.Quoted()).Scan(&kind); err != nil {
		return "", fmt.Errorf("read the kind of %s: %w", t, err)
	}
	return FromItem(t, kind != nil && *kind == "p"), nil
}

// Inheritance is what pg_inherits says of a plain outbox table: the tables
// that inherit from it (recursively), old-style partitioning. Their
// inserts are not streamed as the outbox's (a publication lists the
// children that existed when it was created, under their own names, and
// none created later), and every statement of the relay reads the outbox
// with ONLY: their rows are never published.
type Inheritance struct {
	Table    outboxschema.Table
	Children []Child // empty: none (or a partitioned table, whose partitions are streamed as the root)
	// Columns of Table that take an INSERT (not generated), quoted, in
	// order; Override when one is GENERATED ALWAYS AS IDENTITY.
	Columns  []string
	Override bool
}

// Child is one inheritance child and its direct parent.
type Child struct {
	Table, Parent outboxschema.Table
}

// InheritanceSQL reads what ReadInheritance returns, with the outbox table
// (quoted) as $1.
const InheritanceSQL = `WITH RECURSIVE d(rel, parent) AS (
	SELECT i.inhrelid, i.inhparent FROM pg_inherits i
		WHERE i.inhparent = to_regclass($1) AND (SELECT relkind FROM pg_class WHERE oid = to_regclass($1)) = 'r'
	UNION SELECT i.inhrelid, i.inhparent FROM pg_inherits i JOIN d ON i.inhparent = d.rel)
SELECT array(SELECT cn.nspname::text FROM d JOIN pg_class c ON c.oid = d.rel JOIN pg_namespace cn ON cn.oid = c.relnamespace ORDER BY cn.nspname, c.relname),
	array(SELECT c.relname::text FROM d JOIN pg_class c ON c.oid = d.rel JOIN pg_namespace cn ON cn.oid = c.relnamespace ORDER BY cn.nspname, c.relname),
	array(SELECT pn.nspname::text FROM d JOIN pg_class c ON c.oid = d.rel JOIN pg_namespace cn ON cn.oid = c.relnamespace
		JOIN pg_class p ON p.oid = d.parent JOIN pg_namespace pn ON pn.oid = p.relnamespace ORDER BY cn.nspname, c.relname),
	array(SELECT p.relname::text FROM d JOIN pg_class c ON c.oid = d.rel JOIN pg_namespace cn ON cn.oid = c.relnamespace
		JOIN pg_class p ON p.oid = d.parent ORDER BY cn.nspname, c.relname),
	array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
		AND a.attgenerated = '' ORDER BY a.attnum),
	EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attidentity = 'a')`

// ReadInheritance reads the inheritance children of outbox table t (none
// for a partitioned or missing table). Start (Prepare), the horizon
// sampler and `check` call it. Any goroutine; blocks on one query on q,
// which the caller must not use from another goroutine meanwhile.
func ReadInheritance(ctx context.Context, q RowReader, t outboxschema.Table) (Inheritance, error) {
	in := Inheritance{Table: t}
	var cs, cn, ps, pn, cols []string
	if err := q.QueryRow(ctx, InheritanceSQL, t.Quoted()).Scan(&cs, &cn, &ps, &pn, &cols, &in.Override); err != nil {
		return in, fmt.Errorf("read the inheritance children of %s: %w", t, err)
	}
	if len(cs) != len(cn) || len(cs) != len(ps) || len(cs) != len(pn) {
		return in, fmt.Errorf("read the inheritance children of %s: %d, %d, %d, %d names", t, len(cs), len(cn), len(ps), len(pn))
	}
	for i := range cs {
		in.Children = append(in.Children, Child{Table: outboxschema.Table{Schema: cs[i], Name: cn[i]}, Parent: outboxschema.Table{Schema: ps[i], Name: pn[i]}})
	}
	for _, c := range cols {
		in.Columns = append(in.Columns, outboxschema.QuoteIdent(c))
	}
	return in, nil
}

// Names are the children, schema-qualified, comma-separated.
func (in Inheritance) Names() string {
	n := make([]string, len(in.Children))
	for i, c := range in.Children {
		n[i] = c.Table.String()
	}
	return strings.Join(n, ", ")
}

// Problem says what the children do to the events written into them; ""
// when there are none. Pure.
func (in Inheritance) Problem() string {
	if len(in.Children) == 0 {
		return ""
	}
	return fmt.Sprintf("outbox table %s has inheritance children (%s): rows inserted into them are not streamed as %s's and the relay reads %s alone (FROM ONLY), so their events would never be published and retention could not tell",
		in.Table, in.Names(), in.Table, in.Table)
}

// Fix is the SQL that moves the children's rows into the outbox (each
// child read with ONLY, so no row is copied twice; the moved rows are new
// inserts, streamed by the slot) and detaches the children, in one
// transaction. Pure.
func (in Inheritance) Fix() string {
	if len(in.Children) == 0 {
		return ""
	}
	cols := strings.Join(in.Columns, ", ")
	over := ""
	if in.Override {
		over = " OVERRIDING SYSTEM VALUE"
	}
	var b strings.Builder
	b.WriteString("BEGIN; ")
	for _, c := range in.Children {
		fmt.Fprintf(&b, "INSERT INTO %s (%s)%s SELECT %s FROM ONLY %s; ", in.Table.Quoted(), cols, over, cols, c.Table.Quoted())
	}
	for _, c := range in.Children {
		if c.Parent == in.Table {
			fmt.Fprintf(&b, "ALTER TABLE %s NO INHERIT %s; ", c.Table.Quoted(), in.Table.Quoted())
		}
	}
	drop := make([]string, len(in.Children))
	for i, c := range in.Children {
		drop[i] = c.Table.Quoted()
	}
	fmt.Fprintf(&b, "COMMIT; then make the writers insert into %s, and DROP TABLE %s; once nothing writes to them", in.Table.Quoted(), strings.Join(drop, ", "))
	return b.String()
}

// checkInheritance fails start while an outbox table has inheritance
// children, naming them and the SQL that fixes it.
func checkInheritance(ctx context.Context, conn *pgx.Conn, t outboxschema.Table) error {
	in, err := ReadInheritance(ctx, conn, t)
	if err != nil {
		return err
	}
	if p := in.Problem(); p != "" {
		return fault.Fatal.Wrap(fmt.Errorf("%s. Move their rows into the outbox and detach them: %s", p, in.Fix()))
	}
	return nil
}
