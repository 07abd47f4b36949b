//go:build e2e

package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// BenchmarkWrite compares the two ways Write sends a pgx batch, multi-row
// INSERT and COPY, committing one transaction of n events per iteration
// against the PostgreSQL of test/services.sh (CopyThreshold comes from it):
//
//	go test -tags e2e -run '^$' -bench BenchmarkWrite -benchtime 2s ./outbox/
func BenchmarkWrite(b *testing.B) {
	svcs, err := testkit.LoadServices()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	db, err := pgxpool.New(ctx, svcs.PGURL)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	schema := "bench_outbox_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if _, err := db.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.outbox (
		id BIGSERIAL PRIMARY KEY, aggregate_type TEXT NOT NULL, aggregate_id TEXT NOT NULL, event_type TEXT NOT NULL,
		payload JSONB NOT NULL, headers JSONB, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		b.Fatal(err)
	}
	defer db.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	for _, n := range []int{1, 10, 50, 100, 500, 1000, 10000} {
		events := make([]Event, n)
		for i := range events {
			events[i] = Event{AggregateType: "order", AggregateID: fmt.Sprintf("ord_%d", i%50), EventType: "order.created", SchemaVersion: 2,
				Payload: json.RawMessage(fmt.Sprintf(`{"order_id":"ord_%d","customer":"cust_17","total":129.5,"items":[{"sku":"A-1","qty":2}]}`, i)),
				Headers: map[string]string{"tenant_id": "acme"}}
		}
		for _, m := range []struct {
			name   string
			copyAt int
		}{{"insert", 0}, {"copy", 1}} {
			w, err := NewWriter(WithTable(schema+".outbox"), withCopyAt(m.copyAt))
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("n=%d/%s", n, m.name), func(b *testing.B) {
				for b.Loop() {
					tx, err := db.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if err := w.Write(ctx, tx, events...); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1e3, "us/event")
			})
		}
	}
}
