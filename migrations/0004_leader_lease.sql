-- The leader lease: one row per slot. The leader renews renewed_at every
-- renew interval on a dedicated connection that also holds a session
-- advisory lock; a standby takes over when the lock is free, or fences a
-- leader whose renewal is older than the TTL (see leader/leader.go).
-- epoch grows by one with every new leader.
CREATE TABLE IF NOT EXISTS {{leader_table}} (
    slot_name   TEXT PRIMARY KEY,
    holder      TEXT        NOT NULL,
    epoch       BIGINT      NOT NULL,
    renewed_at  TIMESTAMPTZ NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL,
    holder_pid  INTEGER
);
