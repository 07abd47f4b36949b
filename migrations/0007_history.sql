-- The generation counter of the relay's history (package history). The
-- relay raises it at every replication session start and records it with
-- every position it keeps (its exactly-once checkpoint, its own ack
-- watermark). It lives in the database, so a restore from a backup or a
-- snapshot winds it back with the data: a kept position with a higher
-- generation than the database's was taken on a history the database no
-- longer has, and is never applied.
ALTER TABLE {{slot_registry}} ADD COLUMN IF NOT EXISTS generation BIGINT NOT NULL DEFAULT 0;

-- The slot's creation xid (0005 adds it beside an outbox table; a mapped
-- table's registry gets only this file): NULL is unknown.
ALTER TABLE {{slot_registry}} ADD COLUMN IF NOT EXISTS created_xid XID8;
