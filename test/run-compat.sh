#!/usr/bin/env bash
# run-compat.sh: what `make compat` runs. The relay's `compat: debezium` against the real thing, record by record:
#
#   1. PostgreSQL 15 + Kafka (test/services.sh, private run dir), Debezium 3.6.1.Final + Kafka Connect 4.3.0 jars
#      (test/compat/debezium.sh fetch: Maven Central, cached in ~/.cache/outbox-relay).
#   2. Debezium's recommended outbox table public.outbox (id uuid, aggregatetype, aggregateid, type, payload jsonb),
#      one slot + publication for Debezium and one for the relay, both created BEFORE the backlog, so both read
#      the same WAL.
#   3. The backlog (test/compat `write`): OUTBOX_COMPAT_EVENTS events (20000) over OUTBOX_COMPAT_AGGREGATES (300)
#      aggregates of 5 types in transactions of 1-40 rows; unicode, quotes, backslashes, control characters in keys
#      and payloads, an empty aggregateid, nested JSON, top-level JSON scalars, a ~100 KB payload, JSON null and
#      SQL NULL payloads, one transaction in ten deleting its rows before it commits, 5 UPDATEs of earlier rows.
#   4. Debezium (connector + EventRouter, settings in test/compat/debezium.sh) until every event is in Kafka; a real
#      consumer dumps every record of outbox.* (test/compat `dump`); the dump is checked against the backlog
#      (`verify`: each event once, in order per key).
#   5. The event topics are deleted and created again (same names, 4 partitions, offsets from 0), then the relay
#      runs with `--compat debezium` on its own slot until every event is in Kafka; dump and verify again.
#   6. `compare`: record by record (matched by the `id` header): topic, partition, offset, key bytes, value bytes,
#      headers (names, order, value bytes). A summary table, each difference class with a count and one example;
#      exit 1 on any class not in the allow-list of docs/migrating-from-debezium.md.
#
# Fails (never skips) when a service, Kafka Connect or Debezium cannot start or a step times out.
# Knobs: OUTBOX_COMPAT_EVENTS, OUTBOX_COMPAT_AGGREGATES, OUTBOX_COMPAT_RUN_DIR (default test/.run/compat),
#   OUTBOX_COMPAT_KEEP=1 (leave the services running afterwards), PEER_TIMEOUT (per contender, 10m),
#   OUTBOX_COMPAT_B=debezium (the harness's self-check: Debezium against a second Debezium run instead of the
#   relay; everything must be identical but the per-run header __debezium.context.runId),
#   OUTBOX_COMPAT_DBZ_SETTINGS="KEY=VALUE ..." (more Debezium settings, e.g. extended.headers.enabled=false) and
#   OUTBOX_COMPAT_RELAY_FLAGS="--flag value ..." (more relay flags), e.g. a placement on both sides:
#   OUTBOX_COMPAT_DBZ_SETTINGS=transforms.outbox.table.fields.additional.placement=type:header:eventType
#   OUTBOX_COMPAT_RELAY_FLAGS="--columns-additional type:header:eventType"
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
RUN="${OUTBOX_COMPAT_RUN_DIR:-$REPO/test/.run/compat}"
EVENTS="${OUTBOX_COMPAT_EVENTS:-20000}"
AGGS="${OUTBOX_COMPAT_AGGREGATES:-300}"
B="${OUTBOX_COMPAT_B:-relay}"
ALLOW_DOC="$REPO/docs/migrating-from-debezium.md"
T0=$SECONDS
. test/compat/lib.sh

on_exit() {
  local rc=$?
  set +e
  peer_cleanup
  echo "make compat: $([ $rc = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - T0))s (run dir $RUN)"
  exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT TERM

case "$B" in relay|debezium) ;; *) echo "OUTBOX_COMPAT_B must be relay or debezium, not '$B'"; exit 2 ;; esac
peer_setup

say "outbox table, slots and publications (before the backlog), backlog of $EVENTS events"
second=(-slot relay_compat:relay_compat_pub)
[ "$B" = debezium ] && second=(-slot debezium_compat2:debezium_compat2_pub)
"$C" prepare -table public.outbox -slot debezium_compat:debezium_compat_pub "${second[@]}"
"$C" write -table public.outbox -events "$EVENTS" -aggregates "$AGGS" -manifest "$RUN/manifest.jsonl"
"$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4

say "Debezium: start, stream the backlog, stop"
# shellcheck disable=SC2086
peer_debezium debezium "$EVENTS" ${OUTBOX_COMPAT_DBZ_SETTINGS:-}

say "fresh topics (same names, offsets from 0), then $B"
"$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4
if [ "$B" = relay ]; then
  # shellcheck disable=SC2086
  peer_relay relay "$EVENTS" relay_compat relay_compat_pub ${OUTBOX_COMPAT_RELAY_FLAGS:-}
else
  DBZ_SLOT=debezium_compat2 DBZ_PUBLICATION=debezium_compat2_pub peer_debezium debezium2 "$EVENTS"
  B=debezium2
  # Debezium against itself: only the per-run id may differ.
  ALLOW_DOC="$RUN/self-check-allow.md"
  printf '%s\n' '<!-- compat-allow-list:begin -->' \
    '- `header_value:__debezium.context.runId`: a random id per Debezium run' '<!-- compat-allow-list:end -->' >"$ALLOW_DOC"
fi

say "compare record by record (allow-list: ${ALLOW_DOC#$REPO/})"
status=0
"$C" compare -a "$RUN/debezium.jsonl" -b "$RUN/$B.jsonl" -a-name debezium -b-name "$B" -allow "$ALLOW_DOC" \
  | tee "$RUN/compare.md" || status=1
echo
echo "debezium: $(cat "$RUN/debezium-wait.json")"
echo "$B: $(cat "$RUN/$B-wait.json")"
[ "$PEER_VERIFY_FAILED" = 0 ] || { echo "the $B output does not match the backlog (see verify above)"; status=1; }
exit "$status"
