-- Slots the relay created for this outbox. A slot that is listed here but
-- missing from pg_replication_slots was dropped behind the relay's back;
-- recreating it would silently skip every event committed in between, so
-- the relay refuses to start until an operator has republished them and
-- deleted the row.
CREATE TABLE IF NOT EXISTS {{slot_registry}} (
    slot_name   TEXT PRIMARY KEY,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_lsn PG_LSN
);
