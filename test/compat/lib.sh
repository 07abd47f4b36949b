# test/compat/lib.sh - sourced by test/run-compat.sh (make compat) and test/run-bench-peer.sh (make bench-peer):
# the steps both run. The caller sets RUN (run dir), REPO (repo root) and T0 (=$SECONDS at start), and
# `set -euo pipefail`.
#
#   peer_setup                        build the relay and test/compat into $RUN, fetch the Connect/Debezium jars,
#                                     start PostgreSQL + Kafka (test/services.sh, run dir $RUN), load the env file
#   peer_debezium NAME EVENTS [KEY=VALUE...]
#                                     Debezium (test/compat/debezium.sh, settings as given) from process start
#                                     until EVENTS records are in outbox.event.*: $RUN/NAME-wait.json (events/s with
#                                     and without startup, CPU, peak RSS), worker stopped, then $RUN/NAME.jsonl
#                                     (every record, dumped by a real consumer) and `verify` against the backlog
#   peer_relay NAME EVENTS SLOT PUBLICATION [FLAG...]
#                                     the same for `outbox-relay run --compat debezium` plus FLAGs
#   peer_cleanup                      stop whatever is still running (the services unless OUTBOX_COMPAT_KEEP=1)
#
# A contender that does not start, exits, or does not deliver EVENTS records within $PEER_TIMEOUT (10m) fails
# the run (never a skip). `verify` failing on the relay sets PEER_VERIFY_FAILED=1 and goes on (so the comparison
# still shows the differences); failing on Debezium is fatal (the harness is broken).

PEER_TIMEOUT="${PEER_TIMEOUT:-10m}"
PEER_VERIFY_FAILED=0
RELAY_PID=""
C=""

say() { printf '\n== [%(%H:%M:%S)T +%ss] %s\n' -1 "$((SECONDS - T0))" "$*"; }

peer_setup() {
  mkdir -p "$RUN"
  export OUTBOX_TEST_RUN_DIR="$RUN"
  say "build the relay and test/compat"
  go build -o "$RUN/outbox-relay" ./cmd/outbox-relay
  go build -o "$RUN/outbox-compat" ./test/compat
  C="$RUN/outbox-compat"
  say "Kafka Connect + Debezium jars"
  bash test/compat/debezium.sh fetch
  say "PostgreSQL 15 + Kafka"
  bash test/services.sh start >/dev/null
  set -a; . "$RUN/env"; set +a
}

peer_debezium() {
  local name=$1 events=$2; shift 2
  local t
  rm -rf "${RUN:?}/$name"
  t=$(date +%s.%N)
  bash test/compat/debezium.sh start "$RUN/$name" "$@"
  if ! "$C" wait -prefix outbox. -records "$events" -pid "$(cat "$RUN/$name/connect.pid")" -since "$t" -timeout "$PEER_TIMEOUT" \
      -out "$RUN/$name-wait.json"; then
    tail -n 60 "$RUN/$name/connect.log"
    echo "Debezium did not publish the backlog (log: $RUN/$name/connect.log)"
    return 1
  fi
  bash test/compat/debezium.sh stop "$RUN/$name"
  if grep -E ' (ERROR) ' "$RUN/$name/connect.log" | grep -v 'Failed to discover Converter' | head -5 | grep -q .; then
    echo "note: Kafka Connect logged errors (log: $RUN/$name/connect.log):"
    grep -E ' ERROR ' "$RUN/$name/connect.log" | grep -v 'Failed to discover Converter' | head -5
  fi
  "$C" dump -out "$RUN/$name.jsonl"
  "$C" verify -manifest "$RUN/manifest.jsonl" -dump "$RUN/$name.jsonl" -name "$name"
}

peer_relay() {
  local name=$1 events=$2 slot=$3 pub=$4; shift 4
  local metrics t args
  metrics="127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  args=(run --compat debezium --postgres-url "$OUTBOX_TEST_PG_URL" --kafka-brokers "$OUTBOX_TEST_KAFKA_BROKERS"
    --slot "$slot" --publication "$pub" --create-publication=false --leader-election=false
    --metrics-addr "$metrics" --log-format json "$@")
  echo "$RUN/outbox-relay ${args[*]}" | sed 's|://[^@]*@|://***@|' | tee "$RUN/$name.cmd"
  t=$(date +%s.%N)
  # Only the settings above: no OUTBOX_RELAY_* variable of the caller's shell.
  # shellcheck disable=SC2046
  env $(env | sed -n 's/^\(OUTBOX_RELAY_[A-Z0-9_]*\)=.*/-u \1/p') "$RUN/outbox-relay" "${args[@]}" >"$RUN/$name.log" 2>&1 &
  RELAY_PID=$!
  if ! "$C" wait -prefix outbox. -records "$events" -pid "$RELAY_PID" -since "$t" -timeout "$PEER_TIMEOUT" -out "$RUN/$name-wait.json"; then
    tail -n 40 "$RUN/$name.log"
    echo "the relay did not publish the backlog (log: $RUN/$name.log)"
    return 1
  fi
  kill -TERM "$RELAY_PID"
  wait "$RELAY_PID" || echo "relay exited with status $? after SIGTERM (log: $RUN/$name.log)"
  RELAY_PID=""
  "$C" dump -out "$RUN/$name.jsonl"
  "$C" verify -manifest "$RUN/manifest.jsonl" -dump "$RUN/$name.jsonl" -name "$name" || PEER_VERIFY_FAILED=1
}

peer_cleanup() {
  local d
  for d in "$RUN"/*/; do
    [ -f "$d/worker.properties" ] && bash test/compat/debezium.sh stop "$d" >/dev/null 2>&1
  done
  if [ -n "$RELAY_PID" ] && kill -0 "$RELAY_PID" 2>/dev/null; then kill -KILL "$RELAY_PID"; fi
  if [ "${OUTBOX_COMPAT_KEEP:-0}" != 1 ]; then bash test/services.sh stop >/dev/null 2>&1; fi
  return 0
}
