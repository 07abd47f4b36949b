-- The outbox table: one row per event, written in the same transaction as the
-- business change. {{table}}, {{index}} and {{publication}} are replaced by
-- the configured, quoted names.
CREATE TABLE IF NOT EXISTS {{table}} (
    id             BIGSERIAL PRIMARY KEY,
    aggregate_type TEXT        NOT NULL,          -- routes to the topic: outbox.event.<aggregate_type>
    aggregate_id   TEXT        NOT NULL,          -- Kafka key: one aggregate, one partition, in order
    event_type     TEXT        NOT NULL,          -- e.g. order.created; breaking change => new type
    payload        JSONB       NOT NULL,          -- the event body, published byte for byte
    headers        JSONB,                         -- trace_id, tenant_id, schema_version, traceparent...
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at   TIMESTAMPTZ,                   -- for a polling fallback; the CDC relay leaves it NULL
    attempt_count  INTEGER     NOT NULL DEFAULT 0,
    last_error     TEXT
);

-- For operators and a polling fallback: unpublished rows in creation order.
CREATE INDEX IF NOT EXISTS {{index}} ON {{table}} (created_at) WHERE published_at IS NULL;

-- The relay reads inserts only; updates (published_at, attempt_count) stay
-- out of the WAL stream it decodes.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {{publication_literal}}) THEN
        CREATE PUBLICATION {{publication}} FOR TABLE {{table}} WITH (publish = 'insert');
    END IF;
END
$$;
