package replication

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// noticeError reads a notice the server sent on the replication connection.
// PostgreSQL 18's pgoutput no longer fails the stream when a publication it
// was asked for does not exist at a change's WAL position (dropped while the
// relay streams): it warns ("skipped loading publication", SQLSTATE 55000)
// and filters every later change of that publication while keepalives move
// on, so following them would confirm the slot past events never received.
// PostgreSQL 14 to 17 fail the stream instead, and the next session's
// publication check stops the relay. The warning arrives in the stream
// before anything decoded after it: stopping on it keeps the slot at or
// before the first filtered transaction. confirmed is the slot's last
// confirmed position, at the time the notice arrived. nil for other notices.
func noticeError(cfg Config, n *pgproto3.NoticeResponse, confirmed pglogrepl.LSN, at time.Time) error {
	// The code and the publication's name, not the text: lc_messages may
	// translate it. 18.3 says 55000 (object_not_in_prerequisite_state);
	// 42704 (undefined_object) is the code of a missing publication
	// elsewhere.
	if (n.Code != "55000" && n.Code != "42704") || !strings.Contains(n.Message, `"`+cfg.Publication+`"`) {
		return nil
	}
	t, _ := outboxschema.ParseTable(cfg.Table)
	since := at.Add(-5 * time.Minute).UTC().Format(time.RFC3339)
	return fault.Fatal.Wrap(fmt.Errorf("publication %q no longer exists for slot %q (server %s: %s): PostgreSQL 18 and later filter every outbox change while it is missing instead of failing, so the relay stops here, the slot confirmed no further than %s. Recreate the publication (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')), skip the gap with SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn()), start the relay, then republish the outbox rows created since the publication was dropped: `outbox-relay replay --since %s` with the relay's config (5 minutes before the relay noticed; use an earlier time if it lagged, see outbox_relay_lag_seconds); the duplicates are harmless, consumers deduplicate on event_id",
		cfg.Publication, cfg.Slot, n.Severity, n.Message, confirmed, outboxschema.QuoteIdent(cfg.Publication), t.Quoted(), cfg.Slot, since))
}
