-- Dead-letter bookkeeping. A poison event (one that can never be published
-- as it is) goes to the dead-letter topic and its row is marked here, so an
-- operator finds it with SQL; `outbox-relay dlq replay` resolves it.
-- attempt_count and last_error are added too for outbox tables created
-- before this migration by hand. ADD COLUMN with no default rewrites nothing.
ALTER TABLE {{table}}
    ADD COLUMN IF NOT EXISTS attempt_count    INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS last_error       TEXT,
    ADD COLUMN IF NOT EXISTS dead_lettered_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS dlq_resolved_at  TIMESTAMPTZ;

-- The "DLQ size > 0" alert counts these rows; the index keeps it cheap.
CREATE INDEX IF NOT EXISTS {{dlq_index}} ON {{table}} (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL AND dlq_resolved_at IS NULL;
