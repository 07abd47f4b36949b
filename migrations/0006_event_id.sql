-- The event's identity (issue 35). event_id was the row id, which a new
-- history hands out again: after a failover to a lagging standby or a
-- restore, the sequence repeats ids whose events were already published,
-- and consumers deduplicating on event_id drop the new events as
-- duplicates. A random UUID filled by the database does not repeat.
--
-- ADD COLUMN without a default rewrites nothing and takes the lock only
-- for a moment; the default is set in a second statement, so it applies to
-- new rows only: rows written before keep NULL and stay published under
-- their id, the identity they were published with (their replay stays
-- deduplicable). A volatile default in ADD COLUMN would rewrite the table
-- under an exclusive lock. gen_random_uuid() is core since PostgreSQL 13.
--
-- No unique index: 122 random bits do not collide in practice, and an
-- index would cost every insert a write (and a partitioned table's unique
-- index must include created_at, so it could not promise uniqueness
-- anyway). Consumers detect a repeat the same way as a redelivery.
--
-- dlq_replay_of is set by `outbox-relay dlq replay` on the copy it inserts:
-- the id of the dead-lettered row, so the copy is published under that
-- row's identity (its event_id, or for a row from before this migration
-- its id) and marked as a replay.
DO $$
DECLARE
    typ text;
BEGIN
    SELECT format_type(atttypid, atttypmod) INTO typ FROM pg_attribute
        WHERE attrelid = {{table_literal}}::regclass AND attname = 'event_id' AND attnum > 0 AND NOT attisdropped;
    IF typ IS NOT NULL AND typ <> 'uuid' THEN
        RAISE EXCEPTION 'outbox table % has a column event_id of type %, not uuid: the relay publishes it as the event identity', {{table_literal}}, typ
            USING HINT = 'rename that column (ALTER TABLE ... RENAME COLUMN event_id TO ...), then run migrate again';
    END IF;
    SELECT format_type(atttypid, atttypmod) INTO typ FROM pg_attribute
        WHERE attrelid = {{table_literal}}::regclass AND attname = 'dlq_replay_of' AND attnum > 0 AND NOT attisdropped;
    IF typ IS NOT NULL AND typ <> 'bigint' THEN
        RAISE EXCEPTION 'outbox table % has a column dlq_replay_of of type %, not bigint', {{table_literal}}, typ
            USING HINT = 'rename that column, then run migrate again';
    END IF;
END
$$;

ALTER TABLE {{table}}
    ADD COLUMN IF NOT EXISTS event_id      UUID,
    ADD COLUMN IF NOT EXISTS dlq_replay_of BIGINT;
ALTER TABLE {{table}} ALTER COLUMN event_id SET DEFAULT gen_random_uuid();
