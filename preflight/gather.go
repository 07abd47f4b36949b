package preflight

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// Facts is everything the checks read; Evaluate judges it. Unknown values
// are nil or empty, never a made-up zero; a query that failed leaves its
// error in the matching *Err field (ConnectError when the server or the
// brokers could not be reached).
type Facts struct {
	Options  Options `json:"-"`
	PG       PGFacts
	Kafka    KafkaFacts
	Registry RegistryFacts
}

// PGFacts is what PostgreSQL answered.
type PGFacts struct {
	Addr         string // host:port of postgres.url, never the password
	ConnectError string // password removed

	Role            string // current_user
	Super           bool
	Replication     bool
	Version         string // server_version
	VersionNum      int    // server_version_num
	WalLevel        string
	MaxSlots        int
	UsedSlots       int
	MaxSenders      int
	ActiveSenders   int
	MaxSlotWALKeep  string // SHOW max_slot_wal_keep_size: "-1" = unlimited
	SchemaUsage     bool
	SettingsErr     string
	TableExists     bool
	Partitioned     bool
	OwnsTable       bool     // has the privileges of the outbox's owner
	MissingRequired []string // required columns absent
	MissingBookkeep []string // bookkeeping columns absent (migration 0003)
	TableErr        string
	Privs           []PrivFact
	Fence           *leader.FenceRights
	FenceErr        string
	EmitMessage     *bool // EXECUTE on pg_logical_emit_message
	Publication     PubFacts
	Slot            SlotFacts
	CanCreateInDB   bool // CREATE on the database (CREATE PUBLICATION needs it)

	// Routes are the routing values of the rows in each outbox table now
	// (Options.Routes, same index), bounded (MaxRouteValues).
	Routes []RouteRead
	// HeaderNames are the header names of the rows in each outbox table
	// now that the relay refuses (Options.Routes, same index), bounded
	// (MaxHeaderNames).
	HeaderNames []HeaderNamesRead

	// Failover is what the server says about phantom events
	// (pgsetup.ReadFailover).
	Failover pgsetup.FailoverFacts

	// MappingErrs say why mapped tables (Options.Mappings) do not fit
	// their mapping; PubMissing are mapped tables the publication lacks.
	MappingErrs []string
	PubMissing  []string

	// XidHolders are the transactions holding an xid in the cluster now
	// (pgsetup.ReadXidHolders), the checking session left out; XidErr says
	// why they could not be read.
	XidHolders []pgsetup.XidHolder
	XidErr     string

	// Inheritance are the outbox tables (own or mapped) that have
	// inheritance children (pgsetup.ReadInheritance), or whose children
	// could not be read.
	Inheritance []InheritFact
}

// InheritFact is one outbox table's inheritance children.
type InheritFact struct {
	Table    string
	Children string // schema-qualified, comma-separated
	Problem  string
	Fix      string
	Err      string
}

// PrivFact is one Need and whether the role has it.
type PrivFact struct {
	Need
	Exists bool // the table exists
	Have   bool
	Err    string
}

// PubFacts describes the publication.
type PubFacts struct {
	Exists                          bool
	Insert, Update, Delete, Truncat bool
	ViaRoot                         bool
	HasTable                        bool
	// Shape are the problems of the column lists, row filters, generated
	// columns and names the outbox tables are streamed with
	// (pgsetup.Shape.Problems of the shapeKinds).
	Shape []pgsetup.Problem
	Err   string
}

// shapeKinds are the pgsetup.Problem kinds PubFacts.Shape holds; the
// others (missing, publish, not included, via root) have their own facts.
var shapeKinds = map[string]bool{pgsetup.KindColumnList: true, pgsetup.KindRowFilter: true,
	pgsetup.KindGenerated: true, pgsetup.KindStreamedAs: true}

// SlotFacts describes the relay's slot.
type SlotFacts struct {
	Exists      bool
	Plugin      string
	SlotType    string
	Database    string
	CurrentDB   string
	WALStatus   string
	SafeWALSize *int64
	Registered  bool // in the slot registry
	Err         string
}

// Gather reads PostgreSQL and Kafka. It never fails: an error is a fact.
// It blocks up to ctx's deadline; the caller bounds it.
func Gather(ctx context.Context, o Options) Facts {
	f := Facts{Options: o}
	f.PG = gatherPG(ctx, o)
	names := planRoutes(o, f.PG.Routes).names()
	f.Kafka = gatherKafka(ctx, o, names)
	f.Registry = gatherRegistry(ctx, o, names)
	return f
}

// pgAddr is host:port of url, for messages; "" when it cannot be parsed.
func pgAddr(url string) (addr, password string) {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return "", ""
	}
	return net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))), pc.Password
}

func noSecret(msg, password string) string {
	if password != "" {
		msg = strings.ReplaceAll(msg, password, "xxxxx")
	}
	return msg
}

func gatherPG(ctx context.Context, o Options) PGFacts {
	var f PGFacts
	addr, password := pgAddr(o.PostgresURL)
	f.Addr = addr
	conn, err := pg.Connect(ctx, o.PostgresURL)
	if err != nil {
		f.ConnectError = noSecret(err.Error(), password)
		return f
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := o.Table
	scrub := func(err error) string { return noSecret(err.Error(), password) }

	err = conn.QueryRow(ctx, `SELECT current_user::text, r.rolsuper, r.rolreplication,
		current_setting('server_version'), current_setting('server_version_num')::int, current_setting('wal_level'),
		current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots)::int,
		current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int,
		current_setting('max_slot_wal_keep_size'),
		coalesce(has_schema_privilege((SELECT oid FROM pg_namespace WHERE nspname = $1), 'USAGE'), false),
		has_database_privilege(current_database(), 'CREATE')
		FROM pg_roles r WHERE r.rolname = current_user`, t.Schema).
		Scan(&f.Role, &f.Super, &f.Replication, &f.Version, &f.VersionNum, &f.WalLevel, &f.MaxSlots, &f.UsedSlots,
			&f.MaxSenders, &f.ActiveSenders, &f.MaxSlotWALKeep, &f.SchemaUsage, &f.CanCreateInDB)
	if err != nil {
		f.SettingsErr = scrub(err)
	}

	// The outbox table, its columns and owner.
	var cols []string
	err = conn.QueryRow(ctx, `SELECT c.relkind = 'p', pg_has_role(c.relowner, 'USAGE'),
		array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		t.Schema, t.Name).Scan(&f.Partitioned, &f.OwnsTable, &cols)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		f.TableErr = scrub(err)
	default:
		f.TableExists = true
		for _, c := range outboxschema.RequiredColumns {
			if !slices.Contains(cols, c) {
				f.MissingRequired = append(f.MissingRequired, c)
			}
		}
		for _, c := range outboxschema.BookkeepingColumns {
			if !slices.Contains(cols, c) {
				f.MissingBookkeep = append(f.MissingBookkeep, c)
			}
		}
	}

	// Why an outbox table's rows cannot be read for their routes ("" when
	// they can): outbox_table reports it.
	unreadable := map[outboxschema.Table]string{}
	switch {
	case f.TableErr != "" || !f.TableExists:
		unreadable[t] = "the table cannot be read: see outbox_table"
	case len(f.MissingRequired) > 0:
		unreadable[t] = "required columns missing: see outbox_table"
	}
	if o.Mappings != nil {
		// Read through a mapping: the column types count, not the relay's
		// own columns (postgres.table may not even exist with tables).
		f.TableErr, f.MissingRequired, f.MissingBookkeep = "", nil, nil
		f.TableExists = true
		unreadable = map[outboxschema.Table]string{}
		for _, m := range o.Mappings {
			types, err := pgsetup.ColumnTypes(ctx, conn, m.Table)
			switch {
			case err != nil:
				f.MappingErrs = append(f.MappingErrs, scrub(err))
				unreadable[m.Table] = "its columns cannot be read: see outbox_table"
			case len(types) == 0:
				f.MappingErrs = append(f.MappingErrs, fmt.Sprintf("outbox table %s does not exist", m.Table))
				unreadable[m.Table] = "it does not exist"
			default:
				if err := m.CheckTypes("", types); err != nil {
					f.MappingErrs = append(f.MappingErrs, strings.ReplaceAll(err.Error(), "\n", "; "))
					unreadable[m.Table] = "its columns do not fit the mapping: see outbox_table"
				}
			}
		}
	}

	// Inheritance children of each outbox table: their rows are never
	// streamed (the relay refuses to start).
	tables := []outboxschema.Table{t}
	if o.Mappings != nil {
		tables = nil
		for _, m := range o.Mappings {
			tables = append(tables, m.Table)
		}
	}
	for _, x := range tables {
		in, err := pgsetup.ReadInheritance(ctx, conn, x)
		switch {
		case err != nil:
			f.Inheritance = append(f.Inheritance, InheritFact{Table: x.String(), Err: scrub(err)})
		case len(in.Children) > 0:
			f.Inheritance = append(f.Inheritance, InheritFact{Table: x.String(), Children: in.Names(), Problem: in.Problem(), Fix: in.Fix()})
		}
	}

	// Every table privilege, with PostgreSQL's own has_*_privilege.
	for _, n := range Needs(o) {
		pf := PrivFact{Need: n}
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", n.Table.Quoted()).Scan(&pf.Exists); err != nil {
			pf.Err = scrub(err)
		} else if pf.Exists {
			pf.Have = true
			if len(n.Columns) == 0 {
				err = conn.QueryRow(ctx, "SELECT has_table_privilege($1::text::regclass, $2)", n.Table.Quoted(), n.Privilege).Scan(&pf.Have)
			}
			for _, c := range n.Columns {
				var ok bool
				if err = conn.QueryRow(ctx, "SELECT has_column_privilege($1::text::regclass, $2, $3)", n.Table.Quoted(), c, n.Privilege).Scan(&ok); err != nil {
					break
				}
				pf.Have = pf.Have && ok
			}
			if err != nil {
				pf.Have, pf.Err = false, scrub(err)
			}
		}
		f.Privs = append(f.Privs, pf)
	}

	if o.LeaderEnabled {
		fr, err := leader.CheckFence(ctx, conn, o.Slot)
		if err != nil {
			f.FenceErr = scrub(err)
		} else {
			f.Fence = &fr
		}
	}
	if o.HeartbeatInterval > 0 {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT has_function_privilege($1, 'EXECUTE')", EmitMessageFunc(f.VersionNum)).Scan(&ok); err == nil {
			f.EmitMessage = &ok
		}
	}

	// The publication.
	p := &f.Publication
	err = conn.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot,
		EXISTS (SELECT 1 FROM pg_publication_tables pt WHERE pt.pubname = p.pubname AND pt.schemaname = $2 AND pt.tablename = $3)
		FROM pg_publication p WHERE pubname = $1`, o.Publication, t.Schema, t.Name).
		Scan(&p.Insert, &p.Update, &p.Delete, &p.Truncat, &p.ViaRoot, &p.HasTable)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		p.Err = scrub(err)
	default:
		p.Exists = true
	}
	if f.Partitioned && p.Exists && !p.HasTable {
		// pg_publication_tables lists a partitioned table under its root
		// only with publish_via_partition_root; without it, its leaves.
		_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
			WHERE p.pubname = $1 AND pr.prrelid = $2::text::regclass)`, o.Publication, t.Quoted()).Scan(&p.HasTable)
	}

	// What the publication does with each outbox table's inserts:
	// column lists, row filters, generated columns, another name.
	if p.Exists {
		ms, tables := o.Mappings, []outboxschema.Table{}
		if ms == nil {
			ms = []outboxschema.Mapping{outboxschema.DefaultMapping(t)}
		}
		for _, m := range ms {
			tables = append(tables, m.Table)
		}
		for _, m := range ms {
			shape, err := pgsetup.ReadShape(ctx, conn, o.Publication, m, tables)
			if err != nil {
				p.Err = scrub(err)
				break
			}
			for _, pr := range shape.Problems() {
				if shapeKinds[pr.Kind] {
					p.Shape = append(p.Shape, pr)
				}
			}
		}
	}

	// The slot, and whether the registry knows it.
	s := &f.Slot
	var plugin, slotType, database, walStatus *string
	err = conn.QueryRow(ctx, `SELECT plugin, slot_type, database, wal_status, safe_wal_size, current_database()
		FROM pg_replication_slots WHERE slot_name = $1`, o.Slot).Scan(&plugin, &slotType, &database, &walStatus, &s.SafeWALSize, &s.CurrentDB)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		s.Err = scrub(err)
	default:
		s.Exists = true
		s.Plugin, s.SlotType, s.Database, s.WALStatus = deref(plugin), deref(slotType), deref(database), deref(walStatus)
	}
	gatherXacts(ctx, conn, &f, scrub)
	f.Failover = pgsetup.ReadFailover(ctx, conn, o.Slot, o.StandbySlots)
	f.Failover.Error = noSecret(f.Failover.Error, password)
	reg := t.Sibling(outboxschema.SlotRegistry).Quoted()
	var hasReg bool
	if conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", reg).Scan(&hasReg) == nil && hasReg {
		_ = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+reg+" WHERE slot_name = $1)", o.Slot).Scan(&s.Registered)
	}

	// Publication membership of the mapped tables.
	for _, m := range o.Mappings {
		var in bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
			WHERE p.pubname = $1 AND pr.prrelid = to_regclass($2))`, o.Publication, m.Table.Quoted()).Scan(&in); err == nil && !in && p.Exists {
			f.PubMissing = append(f.PubMissing, m.Table.Quoted())
		}
	}

	// The routing values of the rows in the tables now (the templates
	// decide the rest): bounded, so a huge outbox cannot hold the check.
	// The own table's dead-lettered rows were judged already.
	hasMarks := !slices.Contains(f.MissingBookkeep, outboxschema.ColDeadLetteredAt)
	f.Routes = readRoutes(ctx, conn, routes(o),
		func(r Route) string { return unreadable[r.Table] },
		func(r Route) bool { return r.Own && o.Mappings == nil && hasMarks },
		scrub)
	f.HeaderNames = readHeaderNames(ctx, conn, routes(o), o.ReservedHeaders,
		func(r Route) string { return unreadable[r.Table] },
		func(r Route) bool { return r.Own && o.Mappings == nil && hasMarks },
		scrub)
	return f
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
