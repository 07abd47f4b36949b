-- Delivery proof and retention (package retention). The relay never
-- updates a row per event; delivery is proven by transaction position:
-- a row is delivered when published_at is set (by `outbox-relay replay`
-- or an earlier publisher) or when its inserting transaction's xid lies in
-- [floor_xid, delivered_xid) of the slot's row here. See retention/horizon.go.
CREATE TABLE IF NOT EXISTS {{delivery_table}} (
    slot_name     TEXT PRIMARY KEY,
    floor_xid     XID8        NOT NULL,  -- xids below it may predate the slot: never proven by position
    delivered_xid XID8,                  -- committed xids in [floor_xid, delivered_xid) are delivered
    delivered_lsn PG_LSN,
    delivered_at  TIMESTAMPTZ,           -- everything committed before it is delivered
    pending_xid   XID8,                  -- the sample waiting for the slot to pass pending_lsn
    pending_lsn   PG_LSN,
    pending_at    TIMESTAMPTZ,
    paused_reason TEXT,                  -- set while retention is paused (slot missing or unhealthy)
    last_run_at   TIMESTAMPTZ,
    last_deleted  BIGINT,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The xid below which a slot's transactions may predate it, read right after
-- the slot was created (NULL for slots registered before this migration).
ALTER TABLE {{slot_registry}} ADD COLUMN IF NOT EXISTS created_xid XID8;

-- published_at is written by replay only; an outbox created by hand may lack it.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS published_at TIMESTAMPTZ;

-- The partial index on published_at IS NULL held every row (the CDC relay
-- never sets published_at), costing each insert an index write for nothing.
-- Retention, the undelivered count and replay --since read by created_at.
DROP INDEX IF EXISTS {{unpublished_index}};
CREATE INDEX IF NOT EXISTS {{created_at_index}} ON {{table}} (created_at);
