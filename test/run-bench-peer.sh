#!/usr/bin/env bash
# run-bench-peer.sh: what `make bench-peer` runs (issue 16, "Debezium in the bench"). Debezium 3.6.1.Final
# (PostgreSQL connector + Outbox Event Router on Kafka Connect 4.3.0 standalone) and the relay with
# `compat: debezium` drain the same backlog into the same broker, one after the other, each from its own slot
# created before the backlog; a real consumer then checks each output once (every event once, in order per key,
# its payload as value: test/compat `verify -kafka`). Reported for each: events/s from process start to the last
# record (with startup) and from the first record to the last (without), CPU per event (all of the process's
# CPU, startup included, and only the CPU spent between the first and the last record), peak RSS (VmHWM).
#
# Backlog (test/compat `write -simple`): OUTBOX_PEER_EVENTS (1000000) events of ~200 B JSON over
# OUTBOX_PEER_AGGREGATES (10000) aggregates of 5 types, OUTBOX_PEER_TXN (100) rows per transaction; topics
# outbox.event.<type> with 4 partitions, recreated empty between the two runs.
#
# Debezium's tuning (every setting is in $RUN/debezium/{worker,connector}.properties; these on top of
# test/compat/debezium.sh's), overridable with OUTBOX_PEER_DBZ_SETTINGS:
#   max.batch.size=8192 (default 2048), max.queue.size=65536 (default 8192), poll.interval.ms=10 (default 500),
#   worker.producer.linger.ms=5 (Kafka 4.x's default, stated), worker.producer.batch.size=262144 (default 16384),
#   worker.producer.compression.type=none (the relay's default), worker.offset.flush.interval.ms=1000 (slot
#   confirmed about once a second, like the relay's status_interval), heap -Xms256m -Xmx2g (DBZ_HEAP_OPTS).
# The relay: its defaults (docs/configuration.md) plus OUTBOX_PEER_RELAY_FLAGS.
#
# Writes $RUN/peer.md (the table, the settings) and prints it. Fails when a contender does not start or deliver,
# or an output is wrong. Knobs: OUTBOX_PEER_RUN_DIR (bench/.run/peer), OUTBOX_COMPAT_KEEP=1, PEER_TIMEOUT (15m).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
RUN="${OUTBOX_PEER_RUN_DIR:-$REPO/bench/.run/peer}"
EVENTS="${OUTBOX_PEER_EVENTS:-1000000}"
AGGS="${OUTBOX_PEER_AGGREGATES:-10000}"
TXN="${OUTBOX_PEER_TXN:-100}"
PEER_TIMEOUT="${PEER_TIMEOUT:-15m}"
DBZ_TUNING="${OUTBOX_PEER_DBZ_SETTINGS:-max.batch.size=8192 max.queue.size=65536 poll.interval.ms=10 worker.producer.linger.ms=5 worker.producer.batch.size=262144 worker.producer.compression.type=none worker.offset.flush.interval.ms=1000}"
T0=$SECONDS
. test/compat/lib.sh

on_exit() {
  local rc=$?
  set +e
  peer_cleanup
  echo "make bench-peer: $([ $rc = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - T0))s (run dir $RUN)"
  exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# peer_verify NAME: the output in Kafka against the backlog, read once by a real consumer
peer_verify() { "$C" verify -kafka -dead-ok=false -manifest "$RUN/manifest.jsonl" -name "$1"; }

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
peer_setup
say "outbox table, slots and publications (before the backlog), backlog of $EVENTS events"
"$C" prepare -table public.outbox -slot debezium_peer:debezium_peer_pub -slot relay_peer:relay_peer_pub
"$C" write -simple -table public.outbox -events "$EVENTS" -aggregates "$AGGS" -txn "$TXN" -manifest "$RUN/manifest.jsonl"
"$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4

say "Debezium: start, drain, stop (tuning: $DBZ_TUNING)"
rm -rf "${RUN:?}/debezium"
t=$(date +%s.%N)
# shellcheck disable=SC2086
DBZ_SLOT=debezium_peer DBZ_PUBLICATION=debezium_peer_pub bash test/compat/debezium.sh start "$RUN/debezium" $DBZ_TUNING
"$C" wait -prefix outbox. -records "$EVENTS" -pid "$(cat "$RUN/debezium/connect.pid")" -since "$t" \
  -timeout "$PEER_TIMEOUT" -out "$RUN/debezium-wait.json"
bash test/compat/debezium.sh stop "$RUN/debezium"
peer_verify debezium

say "the relay (--compat debezium): fresh topics, start, drain, stop"
"$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4
metrics="127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# shellcheck disable=SC2206
args=(run --compat debezium --postgres-url "$OUTBOX_TEST_PG_URL" --kafka-brokers "$OUTBOX_TEST_KAFKA_BROKERS"
  --slot relay_peer --publication relay_peer_pub --create-publication=false --leader-election=false
  --metrics-addr "$metrics" --log-format json ${OUTBOX_PEER_RELAY_FLAGS:-})
echo "$RUN/outbox-relay ${args[*]}" | sed 's|://[^@]*@|://***@|' | tee "$RUN/relay.cmd"
t=$(date +%s.%N)
# shellcheck disable=SC2046
env $(env | sed -n 's/^\(OUTBOX_RELAY_[A-Z0-9_]*\)=.*/-u \1/p') "$RUN/outbox-relay" "${args[@]}" >"$RUN/relay.log" 2>&1 &
RELAY_PID=$!
"$C" wait -prefix outbox. -records "$EVENTS" -pid "$RELAY_PID" -since "$t" -timeout "$PEER_TIMEOUT" -out "$RUN/relay-wait.json" ||
  { tail -n 40 "$RUN/relay.log"; exit 1; }
kill -TERM "$RELAY_PID"
wait "$RELAY_PID" || echo "relay exited with status $? after SIGTERM (log: $RUN/relay.log)"
RELAY_PID=""
peer_verify relay

say "result"
python3 - "$RUN" "$EVENTS" "$AGGS" "$TXN" "$LOAD_START" "$(cut -d' ' -f1-3 /proc/loadavg)" >"$RUN/peer.md" <<'PY'
import json, sys, os
run, events, aggs, txn, load0, load1 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def row(name, f):
    w = json.load(open(os.path.join(run, f)))
    n = w["records"]
    total = w["done_unix"] - w["start_unix"]
    drain = w["done_unix"] - w["first_unix"]
    cpu_drain = w["cpu_done_s"] - w["cpu_first_s"]
    return "| %s | %d | %.1f | %.0f | %.1f | %.0f | %.1f | %.1f | %.1f | %.0f |" % (
        name, n, total, n / total, drain, n / drain if drain > 0 else float("nan"),
        w["cpu_done_s"], w["cpu_done_s"] / n * 1e6, cpu_drain / n * 1e6, w["rss_peak_kb"] / 1024)
print("## make bench-peer: Debezium 3.6.1.Final vs outbox-relay (compat: debezium)\n")
print("Backlog: %d events (~200 B JSON payloads), %s aggregates, 5 types, %s rows per transaction; 4 partitions per topic; one after the other on the same PostgreSQL 15 and Kafka. Machine: %d cores, load average %s at the start, %s at the end.\n" % (events, aggs, txn, os.cpu_count(), load0, load1))
print("| contender | records | start to last record (s) | events/s with startup | first to last record (s) | events/s without startup | CPU total (s) | CPU us/event (total) | CPU us/event (drain only) | peak RSS (MB) |")
print("|---|---|---|---|---|---|---|---|---|---|")
print(row("Debezium 3.6.1 + Connect 4.3.0", "debezium-wait.json"))
print(row("outbox-relay", "relay-wait.json"))
print("\nDebezium worker settings:\n\n```\n" + "".join(l for l in open(os.path.join(run, "debezium", "worker.properties")) if not l.startswith("#")) + "```\n")
conn = "".join(l for l in open(os.path.join(run, "debezium", "connector.properties")) if not l.startswith("#") and not l.startswith("database.password"))
print("Debezium connector settings (password omitted):\n\n```\n" + conn + "```\n")
print("Relay command line:\n\n```\n" + open(os.path.join(run, "relay.cmd")).read() + "```")
PY
cat "$RUN/peer.md"
