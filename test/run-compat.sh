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
#   OUTBOX_COMPAT_KEEP=1 (leave the services running afterwards), OUTBOX_COMPAT_TIMEOUT (per contender, 10m).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
RUN="${OUTBOX_COMPAT_RUN_DIR:-$REPO/test/.run/compat}"
EVENTS="${OUTBOX_COMPAT_EVENTS:-20000}"
AGGS="${OUTBOX_COMPAT_AGGREGATES:-300}"
TIMEOUT="${OUTBOX_COMPAT_TIMEOUT:-10m}"
ALLOW_DOC="$REPO/docs/migrating-from-debezium.md"
export OUTBOX_TEST_RUN_DIR="$RUN"
T0=$SECONDS

say() { printf '\n== [%(%H:%M:%S)T +%ss] %s\n' -1 "$((SECONDS - T0))" "$*"; }

RELAY_PID=""
cleanup() {
  local rc=$?
  set +e
  bash test/compat/debezium.sh stop "$RUN/debezium" >/dev/null 2>&1
  if [ -n "$RELAY_PID" ] && kill -0 "$RELAY_PID" 2>/dev/null; then kill -KILL "$RELAY_PID"; fi
  if [ "${OUTBOX_COMPAT_KEEP:-0}" != 1 ]; then bash test/services.sh stop >/dev/null 2>&1; fi
  echo "make compat: $([ $rc = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - T0))s (run dir $RUN)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$RUN"
say "build the relay and test/compat"
go build -o "$RUN/outbox-relay" ./cmd/outbox-relay
go build -o "$RUN/outbox-compat" ./test/compat
C="$RUN/outbox-compat"

say "Kafka Connect + Debezium jars"
bash test/compat/debezium.sh fetch

say "PostgreSQL 15 + Kafka"
bash test/services.sh start >/dev/null
set -a; . "$RUN/env"; set +a

say "outbox table, slots and publications (before the backlog), backlog of $EVENTS events"
"$C" prepare -table public.outbox -slot debezium_compat:debezium_compat_pub -slot relay_compat:relay_compat_pub
"$C" write -table public.outbox -events "$EVENTS" -aggregates "$AGGS" -manifest "$RUN/manifest.jsonl"
"$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4

say "Debezium: start, stream the backlog, stop"
rm -rf "$RUN/debezium"
t_dbz=$(date +%s.%N)
DBZ_SLOT=debezium_compat DBZ_PUBLICATION=debezium_compat_pub bash test/compat/debezium.sh start "$RUN/debezium"
"$C" wait -records "$EVENTS" -pid "$(cat "$RUN/debezium/connect.pid")" -since "$t_dbz" -timeout "$TIMEOUT" \
  -out "$RUN/debezium-wait.json"
bash test/compat/debezium.sh stop "$RUN/debezium"
"$C" dump -out "$RUN/debezium.jsonl"
"$C" verify -manifest "$RUN/manifest.jsonl" -dump "$RUN/debezium.jsonl" -name debezium

say "the relay (--compat debezium): fresh topics, start, stream the backlog, stop"
"$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4
metrics="127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
relay_args=(run --compat debezium --postgres-url "$OUTBOX_TEST_PG_URL" --kafka-brokers "$OUTBOX_TEST_KAFKA_BROKERS"
  --slot relay_compat --publication relay_compat_pub --create-publication=false --leader-election=false
  --metrics-addr "$metrics" --log-format json)
echo "$RUN/outbox-relay ${relay_args[*]}" | sed 's|://[^@]*@|://***@|' >"$RUN/relay.cmd"
cat "$RUN/relay.cmd"
t_rel=$(date +%s.%N)
# Only the settings above: no OUTBOX_RELAY_* variable of the caller's shell.
env $(env | sed -n 's/^\(OUTBOX_RELAY_[A-Z0-9_]*\)=.*/-u \1/p') "$RUN/outbox-relay" "${relay_args[@]}" >"$RUN/relay.log" 2>&1 &
RELAY_PID=$!
if ! "$C" wait -records "$EVENTS" -pid "$RELAY_PID" -since "$t_rel" -timeout "$TIMEOUT" -out "$RUN/relay-wait.json"; then
  tail -n 40 "$RUN/relay.log"
  echo "the relay did not publish the backlog (log: $RUN/relay.log)"
  exit 1
fi
kill -TERM "$RELAY_PID"
wait "$RELAY_PID" || echo "relay exited with status $? after SIGTERM (log: $RUN/relay.log)"
RELAY_PID=""
"$C" dump -out "$RUN/relay.jsonl"
relay_ok=0
"$C" verify -manifest "$RUN/manifest.jsonl" -dump "$RUN/relay.jsonl" -name relay || relay_ok=1

say "compare record by record (allow-list: docs/migrating-from-debezium.md)"
status=0
"$C" compare -a "$RUN/debezium.jsonl" -b "$RUN/relay.jsonl" -a-name debezium -b-name relay -allow "$ALLOW_DOC" \
  | tee "$RUN/compare.md" || status=1
echo
echo "debezium: $(cat "$RUN/debezium-wait.json")"
echo "relay:    $(cat "$RUN/relay-wait.json")"
[ "$relay_ok" = 0 ] || { echo "the relay's output does not match the backlog (see verify above)"; status=1; }
exit "$status"
