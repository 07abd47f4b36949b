package preflight

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// OldXact is the age from which check calls a prepared transaction
// forgotten, and a transaction holding an xid one that a slot's creation
// would wait for.
const OldXact = time.Minute

// oldXact is OldXact as the checks write it.
var oldXact = strings.TrimSuffix(OldXact.String(), "0s")

// Names of the checks on transactions holding an xid.
const (
	CheckPreparedXacts = "prepared_xacts"
	CheckSlotCreation  = "slot_creation"
)

// gatherXacts reads the transactions holding an xid in the cluster
// (pgsetup.ReadXidHolders) into f; an error is a fact (XidErr).
func gatherXacts(ctx context.Context, conn *pgx.Conn, f *PGFacts, scrub func(error) string) {
	hs, err := pgsetup.ReadXidHolders(ctx, conn, 0)
	if err != nil {
		f.XidErr = scrub(err)
		return
	}
	f.XidHolders = hs
}

// xactChecks judges the transactions holding an xid: prepared ones older
// than OldXact (prepared_xacts), and, while the slot does not exist yet,
// any older than OldXact, which its creation would wait for
// (slot_creation).
func xactChecks(p PGFacts, o Options, add addFunc) {
	if p.XidErr != "" {
		add(CheckPreparedXacts, Skip, "cannot read the transactions holding an xid: "+p.XidErr, "")
		return
	}
	var prepared, oldPrepared, old []pgsetup.XidHolder
	for _, h := range p.XidHolders {
		isOld := h.AgeKnown && h.Age >= OldXact
		if h.Prepared {
			prepared = append(prepared, h)
			if isOld {
				oldPrepared = append(oldPrepared, h)
			}
		}
		if isOld {
			old = append(old, h)
		}
	}
	switch {
	case len(oldPrepared) > 0:
		add(CheckPreparedXacts, Warn, fmt.Sprintf("%d of %d prepared transaction(s) older than %s (forgotten?): %s. Each keeps the creation of a slot waiting (`outbox-relay migrate`, a first start), and the relay's slot from releasing the WAL written since it began, whatever its database",
			len(oldPrepared), len(prepared), oldXact, names(oldPrepared)), fixes(oldPrepared))
	case len(prepared) > 0:
		add(CheckPreparedXacts, OK, fmt.Sprintf("%d prepared transaction(s), none older than %s", len(prepared), oldXact), "")
	default:
		add(CheckPreparedXacts, OK, "none", "")
	}
	if p.Slot.Exists || p.Slot.Err != "" {
		return
	}
	if len(old) > 0 {
		add(CheckSlotCreation, Warn, fmt.Sprintf("slot %s does not exist yet, and creating it (`outbox-relay migrate`, the relay's first start) waits until every transaction holding an xid in the cluster has ended; %d have for %s or more: %s",
			o.Slot, len(old), oldXact, names(old)), fixes(old))
		return
	}
	add(CheckSlotCreation, OK, fmt.Sprintf("slot %s does not exist yet; no transaction has held an xid for %s or more, so creating it should not wait long", o.Slot, oldXact), "")
}

func names(hs []pgsetup.XidHolder) string {
	return pgsetup.ListXidHolders(hs, pgsetup.XidHolder.Describe)
}

func fixes(hs []pgsetup.XidHolder) string { return pgsetup.ListXidHolders(hs, pgsetup.XidHolder.Fix) }
