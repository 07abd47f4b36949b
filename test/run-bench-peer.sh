#!/usr/bin/env bash
# run-bench-peer.sh: what `make bench-peer` runs (issue 16, "Debezium in the bench"). Debezium 3.6.1.Final
# (PostgreSQL connector + Outbox Event Router on Kafka Connect 4.3.0 standalone) and the relay with
# `compat: debezium` drain the same backlog into the same broker, one after the other, OUTBOX_PEER_REPEATS (3)
# times. The backlog is written once: every repeat R has a slot and publication of its own per contender
# (debezium_peer_R, relay_peer_R), all created before the backlog, so each drain reads the whole backlog; who
# goes first alternates (Debezium in odd repeats, the relay in even ones); the topics are recreated empty before
# each drain, and a real consumer checks each output once (every event once, in order per key, its payload as
# value: test/compat `verify -kafka`). Measured per drain: events/s from process start to the last record (with
# startup) and from the first record to the last (without), CPU per event (all of the process's CPU, startup
# included, and only the CPU spent between the first and the last record), peak RSS (VmHWM). Reported
# (test/compat `report`): min/median/max of each per contender, the ratio relay/Debezium per repeat, each drain.
#
# Backlog (test/compat `write -simple`): OUTBOX_PEER_EVENTS (1000000) events of ~200 B JSON over
# OUTBOX_PEER_AGGREGATES (10000) aggregates of 5 types, OUTBOX_PEER_TXN (100) rows per transaction; topics
# outbox.event.<type> with 4 partitions.
#
# Debezium's tuning (every setting is in $RUN/debezium/{worker,connector}.properties; these on top of
# test/compat/debezium.sh's), overridable with OUTBOX_PEER_DBZ_SETTINGS:
#   max.batch.size=8192 (default 2048), max.queue.size=65536 (default 8192), poll.interval.ms=10 (default 500),
#   worker.producer.linger.ms=5 (Kafka 4.x's default, stated), worker.producer.batch.size=262144 (default 16384),
#   worker.producer.compression.type=none (the relay's default), worker.offset.flush.interval.ms=1000 (slot
#   confirmed about once a second, like the relay's status_interval), heap -Xms256m -Xmx2g (DBZ_HEAP_OPTS).
# The relay: its defaults (docs/configuration.md) plus OUTBOX_PEER_RELAY_FLAGS.
#
# Writes $RUN/peer.md (the tables, the settings) and $RUN/peer.png (the plot) and prints peer.md; with the
# default 1M events also bench/results/<date>-peer.{md,png} and bench/results/latest-peer.{md,png}. Fails when a
# contender does not start or deliver, or an output is wrong. Knobs: OUTBOX_PEER_RUN_DIR (bench/.run/peer),
# OUTBOX_COMPAT_KEEP=1, PEER_TIMEOUT (15m, per drain).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
RUN="${OUTBOX_PEER_RUN_DIR:-$REPO/bench/.run/peer}"
EVENTS="${OUTBOX_PEER_EVENTS:-1000000}"
AGGS="${OUTBOX_PEER_AGGREGATES:-10000}"
TXN="${OUTBOX_PEER_TXN:-100}"
REPEATS="${OUTBOX_PEER_REPEATS:-3}"
[[ "$REPEATS" =~ ^[1-9][0-9]?$ ]] && ((REPEATS <= 15)) || { echo "OUTBOX_PEER_REPEATS=$REPEATS: want a number of repeats from 1 to 15 (each needs 2 replication slots; the services allow 32)"; exit 2; }
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

# drain_debezium R: repeat R's Debezium drain, from topics recreated empty to the verified output
drain_debezium() {
  local r=$1 t
  say "repeat $r: Debezium: fresh topics, start, drain, stop (tuning: $DBZ_TUNING)"
  "$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4
  rm -rf "${RUN:?}/debezium-$r"
  t=$(date +%s.%N)
  # shellcheck disable=SC2086
  DBZ_SLOT="debezium_peer_$r" DBZ_PUBLICATION="debezium_peer_${r}_pub" bash test/compat/debezium.sh start "$RUN/debezium-$r" $DBZ_TUNING
  "$C" wait -prefix outbox. -records "$EVENTS" -pid "$(cat "$RUN/debezium-$r/connect.pid")" -since "$t" \
    -timeout "$PEER_TIMEOUT" -out "$RUN/debezium-$r-wait.json" ||
    { tail -n 60 "$RUN/debezium-$r/connect.log"; exit 1; }
  bash test/compat/debezium.sh stop "$RUN/debezium-$r"
  peer_verify "debezium-$r"
}

# drain_relay R: the same for the relay (--compat debezium)
drain_relay() {
  local r=$1 t metrics args
  say "repeat $r: the relay (--compat debezium): fresh topics, start, drain, stop"
  "$C" topics -manifest "$RUN/manifest.jsonl" -recreate -partitions 4
  metrics="127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  # shellcheck disable=SC2206
  args=(run --compat debezium --postgres-url "$OUTBOX_TEST_PG_URL" --kafka-brokers "$OUTBOX_TEST_KAFKA_BROKERS"
    --slot "relay_peer_$r" --publication "relay_peer_${r}_pub" --create-publication=false --leader-election=false
    --metrics-addr "$metrics" --log-format json ${OUTBOX_PEER_RELAY_FLAGS:-})
  echo "$RUN/outbox-relay ${args[*]}" | sed 's|://[^@]*@|://***@|' | tee "$RUN/relay-$r.cmd"
  t=$(date +%s.%N)
  # shellcheck disable=SC2046
  env $(env | sed -n 's/^\(OUTBOX_RELAY_[A-Z0-9_]*\)=.*/-u \1/p') "$RUN/outbox-relay" "${args[@]}" >"$RUN/relay-$r.log" 2>&1 &
  RELAY_PID=$!
  "$C" wait -prefix outbox. -records "$EVENTS" -pid "$RELAY_PID" -since "$t" -timeout "$PEER_TIMEOUT" -out "$RUN/relay-$r-wait.json" ||
    { tail -n 40 "$RUN/relay-$r.log"; exit 1; }
  kill -TERM "$RELAY_PID"
  wait "$RELAY_PID" || echo "relay exited with status $? after SIGTERM (log: $RUN/relay-$r.log)"
  RELAY_PID=""
  peer_verify "relay-$r"
}

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
peer_setup
rm -rf "${RUN:?}"/debezium-* "${RUN:?}"/relay-* "${RUN:?}"/debezium "${RUN:?}"/peer.md "${RUN:?}"/peer.png
slots=()
for ((r = 1; r <= REPEATS; r++)); do
  slots+=(-slot "debezium_peer_$r:debezium_peer_${r}_pub" -slot "relay_peer_$r:relay_peer_${r}_pub")
done
say "outbox table, $((2 * REPEATS)) slots and publications (before the backlog), backlog of $EVENTS events"
"$C" prepare -table public.outbox "${slots[@]}"
"$C" write -simple -table public.outbox -events "$EVENTS" -aggregates "$AGGS" -txn "$TXN" -manifest "$RUN/manifest.jsonl"

FIRST=()
for ((r = 1; r <= REPEATS; r++)); do
  if ((r % 2 == 1)); then
    FIRST+=(debezium)
    drain_debezium "$r"
    drain_relay "$r"
  else
    FIRST+=(relay)
    drain_relay "$r"
    drain_debezium "$r"
  fi
done

say "result"
report() {
  "$C" report -run "$RUN" -repeats "$REPEATS" -first "$(IFS=,; echo "${FIRST[*]}")" -events "$EVENTS" -aggregates "$AGGS" \
    -txn "$TXN" -load-start "$LOAD_START" -load-end "$(cut -d' ' -f1-3 /proc/loadavg)" -elapsed "$((SECONDS - T0)) s" "$@"
}
report -out "$RUN/peer.md" -png "$RUN/peer.png"
cat "$RUN/peer.md"
if [ "$EVENTS" = 1000000 ]; then
  stamp="$(date -u +%Y-%m-%d-%H%M%S)"
  report -out "bench/results/$stamp-peer.md" -png "bench/results/$stamp-peer.png"
  report -out bench/results/latest-peer.md -png bench/results/latest-peer.png
  say "copied to bench/results/$stamp-peer.{md,png} and bench/results/latest-peer.{md,png}"
fi
