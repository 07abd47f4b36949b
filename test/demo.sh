#!/usr/bin/env bash
# demo.sh: what `make demo` runs. Starts a local PostgreSQL and Kafka with the
# test harness, migrates, runs the relay, the sample order service
# (examples/orders, package outbox) and the sample billing consumer
# (examples/billing, package inbox), and the viewer (test/demo): every record
# of every outbox topic and of the dead-letter topic, the relay's lag, and a
# footer with the metrics URL, a psql insert and three experiments. Once it
# publishes a few delivered records again so that billing shows them skipped
# as duplicates. Until Ctrl-C; DEMO_DURATION=30s stops it by itself.
#
# However it stops (Ctrl-C, also through `| tee`, SIGTERM, SIGHUP, the end of
# DEMO_DURATION) it stops every process it started, removes the services'
# temp dirs and its temporary run-dir files, and exits 0; logs stay in the run
# dir. A failure to start exits 1.
#
# Knobs: DEMO_DURATION (e.g. 30s; empty = until Ctrl-C), DEMO_RATE (order
# changes per second, default 2), DEMO_RUN_DIR (default test/.run/demo).
# The whole script is one { } block: bash reads it entirely before running it,
# so editing this file (git pull) while a demo runs cannot derail its cleanup.
{
set -euo pipefail
cd "$(dirname "$0")/.."

# In a terminal, run in a process group of our own that owns the terminal, so
# that Ctrl-C reaches only the demo, not make (which would die with SIGINT
# whatever we return) nor tee (which would die before our last lines).
if [ -z "${DEMO_FOREGROUND:-}" ] && [ -t 0 ] && command -v python3 >/dev/null 2>&1; then
  export DEMO_FOREGROUND=1
  exec python3 test/demo/foreground.py bash "$0" "$@"
fi

# stdout may be a pipe whose reader is gone: a write must fail, not kill us.
trap '' PIPE

RUN_DIR="${DEMO_RUN_DIR:-$PWD/test/.run/demo}"
case "$RUN_DIR" in /*) ;; *) RUN_DIR="$PWD/$RUN_DIR" ;; esac
SHOW_DIR="${RUN_DIR#"$PWD"/}" # as the footer shows it: relative to the repo root when inside it
export OUTBOX_TEST_RUN_DIR="$RUN_DIR" # also marks every process the demo starts (the test looks for it)
mkdir -p "$RUN_DIR"
CONFIG="$RUN_DIR/relay.yaml"
RATE="${DEMO_RATE:-2}"

say() { printf '%s\n' "$*" 2>/dev/null || true; }

PIDS=()         # background processes, stopped in reverse order
STARTED=0       # services.sh start was called
STOPPING=0
cleanup() {
  local why=$1 pid i
  [ "$STOPPING" = 1 ] && return 0
  STOPPING=1
  trap '' INT TERM HUP
  set +e
  : >"$RUN_DIR/.stopping"
  say ""
  say "== stopping ($why): the examples, the viewer, the relay, then PostgreSQL and Kafka"
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid=${PIDS[i]}
    kill -TERM "$pid" 2>/dev/null
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ "$STARTED" = 1 ]; then
    bash test/services.sh stop >>"$RUN_DIR/services.log" 2>&1
  fi
  rm -f "$CONFIG" "$RUN_DIR/relay.pid" "$RUN_DIR/footer.txt" "$RUN_DIR/.stopping"
  say "== stopped: no demo process left, temp dirs removed; logs: $SHOW_DIR/{relay,kafka,postgres,services}.log"
}
trap 'cleanup Ctrl-C; exit 0' INT
trap 'cleanup SIGTERM; exit 0' TERM
trap 'cleanup SIGHUP; exit 0' HUP
trap 'rc=$?; cleanup "exit $rc"; exit $rc' EXIT

t0=$SECONDS
say "== starting PostgreSQL 15 and Kafka (first run downloads the Kafka jars; then ~20-40 s)"
# Build the examples and the viewer while the services start.
( go build -o bin/orders-example ./examples/orders &&
  go build -o bin/billing-example ./examples/billing &&
  go build -o bin/demo-viewer ./test/demo ) >"$RUN_DIR/build.log" 2>&1 &
BUILD_PID=$!
PIDS+=("$BUILD_PID")
bash test/services.sh stop >"$RUN_DIR/services.log" 2>&1 || true
STARTED=1
if ! bash test/services.sh start >>"$RUN_DIR/services.log" 2>&1; then
  tail -n 40 "$RUN_DIR/services.log" >&2
  say "== PostgreSQL/Kafka did not start: $SHOW_DIR/services.log"
  exit 1
fi
set -a
# shellcheck disable=SC1091
. "$RUN_DIR/env"
set +a
if ! wait "$BUILD_PID"; then
  cat "$RUN_DIR/build.log" >&2
  exit 1
fi

PG_URL="$OUTBOX_TEST_PG_URL"
BROKERS="$OUTBOX_TEST_KAFKA_BROKERS"
METRICS_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
METRICS="http://127.0.0.1:$METRICS_PORT/metrics"
# The relay's config, also for the commands the footer shows (dlq list). It
# holds the demo database's password: 0600, removed when the demo stops.
(
  umask 077
  cat >"$CONFIG" <<EOF
# outbox-relay config written by test/demo.sh for this demo run; removed when it stops.
postgres:
  url: $PG_URL
kafka:
  brokers: [$BROKERS]
  # The demo's topics do not exist yet: let the relay create them.
  # In production create the topics beforehand instead.
  auto_create_topics: true
metrics_addr: 127.0.0.1:$METRICS_PORT
log:
  format: console
EOF
)

say "== outbox-relay migrate --config $SHOW_DIR/relay.yaml"
bin/outbox-relay migrate --config "$CONFIG" >"$RUN_DIR/relay.log" 2>&1 || { cat "$RUN_DIR/relay.log" >&2; exit 1; }

# The relay, restarted 1 s after it exits (the "kill the relay" experiment).
relay_loop() {
  local child="" rc
  set +e
  trap 'kill -TERM $child 2>/dev/null; wait $child 2>/dev/null; exit 0' TERM
  while [ ! -e "$RUN_DIR/.stopping" ]; do
    bin/outbox-relay run --config "$CONFIG" >>"$RUN_DIR/relay.log" 2>&1 &
    child=$!
    echo "$child" >"$RUN_DIR/relay.pid"
    wait "$child" 2>/dev/null # no "Killed" line from bash
    rc=$?
    sleep 1 &
    wait $!
    [ -e "$RUN_DIR/.stopping" ] && break
    say "demo     the relay (pid $child) exited with status $rc: starting it again"
  done
}
relay_loop &
PIDS+=($!)
for _ in $(seq 1 150); do
  curl -fsS "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null 2>&1 || { tail -n 40 "$RUN_DIR/relay.log" >&2; exit 1; }
say "== relay ready after $((SECONDS - t0)) s: bin/outbox-relay run --config $SHOW_DIR/relay.yaml (log: $SHOW_DIR/relay.log)"

PSQL="$(command -v psql || echo "$OUTBOX_TEST_PG_BINDIR/psql")"
[ "$PSQL" = /usr/bin/psql ] && PSQL=psql
cat >"$RUN_DIR/footer.txt" <<EOF
metrics $METRICS   relay log $SHOW_DIR/relay.log   stop: Ctrl-C
insert an event: $PSQL '$PG_URL' -c "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('customer', 'cust_1', 'customer.created', '{\"name\": \"Ada\"}')"
  -> a "kafka" line on outbox.event.customer (the relay creates the topic; billing reads only orders)
1) stop the broker: kill -STOP $OUTBOX_TEST_KAFKA_PID   then after ~30 s: kill -CONT $OUTBOX_TEST_KAFKA_PID
  -> lag_seconds and slot_lag grow, billed stays behind written (ready 0 after ~25 s); after -CONT the backlog drains in seconds and billed catches up with written: nothing lost
2) kill the relay: kill -9 \$(cat $SHOW_DIR/relay.pid)
  -> the demo starts it again within seconds; it resumes at the slot's confirmed position, nothing lost; events published but not yet confirmed (few or none at this rate) come again and billing shows them as "skipped duplicate"
3) insert a poison row: $PSQL '$PG_URL' -c "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('order', 'ord_poison', 'order.created', '{}', '{\"event_id\": \"x\"}')"
  -> a "dead letter" line with dlq.reason=reserved_header; then: bin/outbox-relay dlq list --config $SHOW_DIR/relay.yaml
EOF

say "== orders: examples/orders writes each order change and its event in ONE transaction (package outbox)"
say "   billing: examples/billing consumes outbox.event.order once per event (package inbox)"
say "   kafka: the viewer reads every outbox.event.* topic and outbox.dlq"
bin/orders-example --postgres-url "$PG_URL" --rate "$RATE" ${DEMO_DURATION:+--duration "$DEMO_DURATION"} &
PIDS+=($!)
ORDERS_PID=$!
bin/billing-example --postgres-url "$PG_URL" --kafka-brokers "$BROKERS" ${DEMO_DURATION:+--duration "$DEMO_DURATION"} &
PIDS+=($!)
BILLING_PID=$!
bin/demo-viewer --postgres-url "$PG_URL" --kafka-brokers "$BROKERS" --metrics "$METRICS" \
  --footer "$RUN_DIR/footer.txt" ${DEMO_DURATION:+--duration "$DEMO_DURATION"} &
PIDS+=($!)
VIEWER_PID=$!
# wait returns early when a trapped signal arrives (the trap then runs).
wait "$VIEWER_PID" || true
# After DEMO_DURATION the examples stop by themselves: wait for billing's totals.
wait "$ORDERS_PID" "$BILLING_PID" 2>/dev/null || true
cleanup "end of DEMO_DURATION"
exit 0
}
