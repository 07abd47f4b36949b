package replication

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/fault"
)

// PostgreSQL 18's pgoutput warns about a publication it cannot find and
// then filters every change instead of failing the stream: that warning on
// the replication connection must stop the relay, with the recovery; other
// notices are only logged.
func TestNoticeError(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Publication, cfg.Slot = "Outbox Pub", "outbox_slot"
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	skipped := func(code, msg string) *pgproto3.NoticeResponse {
		return &pgproto3.NoticeResponse{Severity: "WARNING", Code: code, Message: msg,
			Detail: "The publication does not exist at this point in the WAL."}
	}
	tests := []struct {
		name   string
		notice *pgproto3.NoticeResponse
		want   []string // nil: not an error
	}{
		{"PostgreSQL 18 skipped publication", skipped("55000", `skipped loading publication "Outbox Pub"`),
			[]string{`publication "Outbox Pub"`, `slot "outbox_slot"`, "0/16B3748", "skipped loading publication",
				`CREATE PUBLICATION "Outbox Pub" FOR TABLE "public"."outbox" WITH (publish = 'insert')`,
				"pg_replication_slot_advance('outbox_slot', pg_current_wal_lsn())",
				"outbox-relay replay --since 2026-11-30T11:55:00Z", "event_id"}},
		{"translated message, same code and name", skipped("55000", `Publikation "Outbox Pub" beim Laden übersprungen`),
			[]string{`publication "Outbox Pub"`, "CREATE PUBLICATION"}},
		{"undefined_object", skipped("42704", `publication "Outbox Pub" does not exist`), []string{"CREATE PUBLICATION"}},
		{"another publication", skipped("55000", `skipped loading publication "Outbox Pub2"`), nil},
		{"another object not ready", skipped("55000", `replication slot "x" is active`), nil},
		{"another undefined object", skipped("42704", `role "x" does not exist`), nil},
		{"another warning", &pgproto3.NoticeResponse{Severity: "WARNING", Code: "01000", Message: "publication whatever"}, nil},
		{"a notice", &pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "hello"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := noticeError(cfg, tt.notice, 0x16B3748, at)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error: the relay would keep confirming past filtered changes")
			}
			if fault.KindOf(err) != fault.Fatal {
				t.Errorf("kind %v, want fatal", fault.KindOf(err))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%s", w, err)
				}
			}
		})
	}
}
