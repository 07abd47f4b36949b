package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// quoteTable quotes "schema.table" (or "table": public) for SQL.
func quoteTable(t string) (string, error) {
	schema, name, ok := strings.Cut(t, ".")
	if !ok {
		schema, name = "public", t
	}
	if schema == "" || name == "" {
		return "", fmt.Errorf("table %q: want schema.table", t)
	}
	return pgx.Identifier{schema, name}.Sanitize(), nil
}

// cmdPrepare (re)creates Debezium's recommended outbox table and, for each -slot NAME:PUBLICATION, a publication
// for that table and a pgoutput slot, all BEFORE the backlog is written: every contender then reads the same WAL.
func cmdPrepare(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prepare", flag.ExitOnError)
	pgURL := fs.String("pg", os.Getenv("OUTBOX_TEST_PG_URL"), "PostgreSQL URL")
	table := fs.String("table", "public.outbox", "outbox table (schema.table)")
	var slots listFlag
	fs.Var(&slots, "slot", "NAME:PUBLICATION (repeatable)")
	_ = fs.Parse(args)
	qt, err := quoteTable(*table)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, *pgURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	for _, s := range slots {
		name, pub, ok := strings.Cut(s, ":")
		if !ok || name == "" || pub == "" {
			return fmt.Errorf("-slot %q: want NAME:PUBLICATION", s)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name); err != nil {
			return fmt.Errorf("drop slot %s: %w", name, err)
		}
		if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize()); err != nil {
			return fmt.Errorf("drop publication %s: %w", pub, err)
		}
	}
	// Debezium's documented outbox table (Outbox Event Router, "Example outbox table").
	ddl := "DROP TABLE IF EXISTS " + qt + ";\n" +
		"CREATE TABLE " + qt + ` (
  id            uuid         NOT NULL PRIMARY KEY,
  aggregatetype varchar(255) NOT NULL,
  aggregateid   varchar(255) NOT NULL,
  type          varchar(255) NOT NULL,
  payload       jsonb
)`
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create table %s: %w", *table, err)
	}
	for _, s := range slots {
		name, pub, _ := strings.Cut(s, ":")
		if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{pub}.Sanitize()+" FOR TABLE "+qt); err != nil {
			return fmt.Errorf("create publication %s: %w", pub, err)
		}
		var lsn string
		if err := conn.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, name).Scan(&lsn); err != nil {
			return fmt.Errorf("create slot %s: %w", name, err)
		}
		fmt.Printf("slot %s at %s, publication %s on %s\n", name, lsn, pub, *table)
	}
	return nil
}

// Event is one row of the backlog as the manifest records it.
type Event struct {
	ID      string  `json:"id"`
	Type    string  `json:"type"`    // aggregatetype
	Agg     string  `json:"agg"`     // aggregateid
	Event   string  `json:"event"`   // type
	Payload *string `json:"payload"` // the JSON text inserted; nil = SQL NULL
	Txn     int     `json:"txn"`
	Deleted bool    `json:"deleted,omitempty"` // deleted again in its own transaction (Debezium's recommended pattern)
}

// Manifest is the first line of the manifest file; events follow, one a line, in commit order.
type Manifest struct {
	Table   string   `json:"table"`
	Events  int      `json:"events"`
	Updates int      `json:"updates"` // UPDATEs of earlier rows: the EventRouter skips them (warning), no record
	Types   []string `json:"types"`
	Seed    uint64   `json:"seed"`
}

// aggregate types: each one a topic outbox.event.<type>; legal topic characters only (a type that is not a legal
// topic name fails Debezium's producer and is a poison event for the relay: not a comparison of outputs).
var aggTypes = []string{"order", "customer", "payment_method", "ship-ment", "Invoice.V2"}

// aggregate ids: hostile for keys (non-ASCII, quotes, backslash, spaces, emoji, the empty string).
func aggID(a int) string {
	switch a % 8 {
	case 0:
		return fmt.Sprintf("ord-%d", a)
	case 1:
		return fmt.Sprintf("клиент-%d", a)
	case 2:
		return fmt.Sprintf(`客户"%d'`, a)
	case 3:
		return fmt.Sprintf("emoji😀-%d", a)
	case 4:
		return fmt.Sprintf(`sp ace\%d`, a)
	case 5:
		return fmt.Sprintf("%d", a)
	case 6:
		if a == 6 {
			return "" // one aggregate with an empty (not NULL) aggregateid: an empty, non-null key
		}
		return fmt.Sprintf("x-%d\t", a)
	default:
		return fmt.Sprintf("Ω≈ç√-%d", a)
	}
}

var hostileStrings = []string{
	`Grüße "quoted" 'single' \ back\slash`,
	"emoji 😀🚀👩‍👩‍👧 and CJK 漢字 and RTL مرحبا",
	"newline\nand\ttab and \r carriage",
	"</script><!-- -->",
	"line sep \u2028 para sep \u2029",
	"control \u0001\u001f",
	"e\u0301 vs \u00e9",
	"",
}

// payloadText returns the JSON text inserted for event i (nil = SQL NULL).
func payloadText(rng *rand.Rand, i int, agg string, seq int) *string {
	s := func(v string) *string { return &v }
	switch {
	case i == 7:
		return nil // SQL NULL payload
	case i == 11:
		return s("null") // JSON null
	case i == 13:
		// ~100 KB: a large payload (under Kafka's default 1 MB record limit)
		var b strings.Builder
		b.WriteString(`{"blob":"`)
		for b.Len() < 100*1024 {
			b.WriteString(`abcdefghij ÄÖÜ 😀 \"q\" `)
		}
		b.WriteString(`","n":1}`)
		return s(b.String())
	case i%997 == 17:
		return nil
	case i%991 == 19:
		return s("null")
	}
	switch i % 10 {
	case 0:
		return s(`"just a JSON string"`)
	case 1:
		return s(`12345678901234567890123456789.123456789`)
	case 2:
		return s(`{"a":1,"a":2, "b" : [ ] , "c":{}, "d":-0.5e-7, "e":true, "f":false, "g":null}`)
	case 3:
		// nested 20 deep
		return s(strings.Repeat(`{"n":[`, 20) + "1" + strings.Repeat(`]}`, 20))
	}
	h := hostileStrings[rng.IntN(len(hostileStrings))]
	v := map[string]any{
		"aggregate": agg,
		"seq":       seq,
		"amount":    float64(rng.IntN(100000)) / 100,
		"note":      h,
		"items":     []any{map[string]any{"sku": "SKU-" + fmt.Sprint(rng.IntN(1000)), "qty": rng.IntN(9) + 1}},
		"meta":      map[string]any{"ünïcødé-key": h, `key "with" quotes`: []any{nil, 1.5, "x"}},
	}
	b, _ := json.Marshal(v)
	return s(string(b))
}

func uuidFrom(rng *rand.Rand) string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// cmdWrite writes the backlog: events in transactions of 1..40 rows, aggregates and types mixed, about one
// transaction in ten deleting its rows again before it commits (the pattern Debezium recommends), and a few
// UPDATEs of earlier rows (the EventRouter skips them), then writes the manifest.
func cmdWrite(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("write", flag.ExitOnError)
	pgURL := fs.String("pg", os.Getenv("OUTBOX_TEST_PG_URL"), "PostgreSQL URL")
	table := fs.String("table", "public.outbox", "outbox table")
	events := fs.Int("events", 20000, "events to insert")
	aggs := fs.Int("aggregates", 300, "distinct aggregates")
	maxTxn := fs.Int("max-txn", 40, "largest transaction (rows): sizes are random in 1..max-txn")
	txnRows := fs.Int("txn", 0, "rows per transaction, all the same (0: random, see -max-txn)")
	updates := fs.Int("updates", 5, "UPDATEs of earlier rows (Debezium skips them)")
	simple := fs.Bool("simple", false, "plain payloads only (~200 B JSON objects), no deletes or updates: the bench backlog")
	seed := fs.Uint64("seed", 1, "random seed (the backlog is a function of the flags)")
	manifest := fs.String("manifest", "", "manifest file to write (required)")
	_ = fs.Parse(args)
	if *manifest == "" {
		return fmt.Errorf("-manifest is required")
	}
	if *simple {
		*updates = 0
	}
	qt, err := quoteTable(*table)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, *pgURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	rng := rand.New(rand.NewPCG(*seed, 0x0b0c))
	f, err := os.Create(*manifest)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	hdr, _ := json.Marshal(Manifest{Table: *table, Events: *events, Updates: *updates, Types: aggTypes, Seed: *seed})
	w.Write(append(hdr, '\n'))

	ins := "INSERT INTO " + qt + " (id, aggregatetype, aggregateid, type, payload) VALUES ($1::uuid, $2, $3, $4, $5::jsonb)"
	del := "DELETE FROM " + qt + " WHERE id = ANY($1::uuid[])"
	seqs := map[string]int{}
	start := time.Now()
	var kept []string // ids of committed, not deleted rows (UPDATE targets)
	txn := 0
	for i := 0; i < *events; {
		n := 1 + rng.IntN(*maxTxn)
		if *txnRows > 0 {
			n = *txnRows
		}
		if n > *events-i {
			n = *events - i
		}
		deleteAll := !*simple && rng.IntN(10) == 0
		txn++
		batch := &pgx.Batch{}
		var evs []Event
		var ids []string
		for j := 0; j < n; j, i = j+1, i+1 {
			a := rng.IntN(*aggs)
			typ := aggTypes[a%len(aggTypes)]
			agg := aggID(a)
			if *simple {
				agg = fmt.Sprintf("agg-%d", a) // plain keys: no empty one (a poison row for the relay)
			}
			seqs[typ+"\x00"+agg]++
			var p *string
			if *simple {
				b, _ := json.Marshal(map[string]any{"aggregate": agg, "seq": seqs[typ+"\x00"+agg],
					"amount": float64(rng.IntN(100000)) / 100, "currency": "EUR", "note": "plain bench payload of about two hundred bytes"})
				s := string(b)
				p = &s
			} else {
				p = payloadText(rng, i, agg, seqs[typ+"\x00"+agg])
			}
			ev := Event{ID: uuidFrom(rng), Type: typ, Agg: agg, Event: []string{"Created", "Updated", "Shipped", "Cancelled"}[rng.IntN(4)] + "Event", Payload: p, Txn: txn, Deleted: deleteAll}
			var pv any
			if p != nil {
				pv = *p
			}
			batch.Queue(ins, ev.ID, ev.Type, ev.Agg, ev.Event, pv)
			evs = append(evs, ev)
			ids = append(ids, ev.ID)
		}
		if deleteAll {
			batch.Queue(del, ids)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("transaction %d: %w", txn, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit %d: %w", txn, err)
		}
		for _, ev := range evs {
			b, _ := json.Marshal(ev)
			w.Write(append(b, '\n'))
		}
		if !deleteAll {
			kept = append(kept, ids...)
		}
	}
	for u := 0; u < *updates && len(kept) > 0; u++ {
		id := kept[rng.IntN(len(kept))]
		if _, err := conn.Exec(ctx, "UPDATE "+qt+` SET payload = '{"updated": true}' WHERE id = $1::uuid`, id); err != nil {
			return fmt.Errorf("update %s: %w", id, err)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Printf("wrote %d events in %d transactions (%d aggregates, %d types, %d updates) in %s\n",
		*events, txn, *aggs, len(aggTypes), *updates, time.Since(start).Round(time.Millisecond))
	return nil
}

// readManifest reads a manifest file.
func readManifest(path string) (Manifest, []Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return Manifest{}, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var m Manifest
	var evs []Event
	first := true
	for sc.Scan() {
		if first {
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				return m, nil, fmt.Errorf("%s: header: %w", path, err)
			}
			first = false
			continue
		}
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return m, nil, fmt.Errorf("%s: %w", path, err)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		return m, nil, err
	}
	if len(evs) != m.Events {
		return m, nil, fmt.Errorf("%s: %d events, header says %d", path, len(evs), m.Events)
	}
	return m, evs, nil
}
