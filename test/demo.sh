#!/usr/bin/env bash
# demo.sh: what `make demo` runs. Starts a local PostgreSQL and Kafka with the
# test harness, migrates, runs the relay, the sample order service
# (examples/orders, package outbox) and the sample billing consumer
# (examples/billing, package inbox), prints what each does plus the slot lag,
# and once publishes a few delivered records again so that billing shows them
# skipped as duplicates; until Ctrl-C. DEMO_DURATION=30s stops it by itself
# (used to check the demo).
set -euo pipefail
cd "$(dirname "$0")/.."

export OUTBOX_TEST_RUN_DIR="$PWD/test/.run/demo"
mkdir -p "$OUTBOX_TEST_RUN_DIR"
RELAY_PID="" ORDERS_PID="" BILLING_PID=""
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "== stopping"
  for pid in $ORDERS_PID $BILLING_PID $RELAY_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  bash test/services.sh stop >/dev/null 2>&1 || true
  echo "relay log: $OUTBOX_TEST_RUN_DIR/relay.log"
}
trap cleanup EXIT INT TERM

echo "== starting PostgreSQL 15 and Kafka (first run downloads the Kafka jars)"
bash test/services.sh stop >/dev/null 2>&1 || true
bash test/services.sh start >/dev/null
set -a
# shellcheck disable=SC1091
. "$OUTBOX_TEST_RUN_DIR/env"
set +a

export OUTBOX_RELAY_POSTGRES_URL="$OUTBOX_TEST_PG_URL"
export OUTBOX_RELAY_KAFKA_BROKERS="$OUTBOX_TEST_KAFKA_BROKERS"
METRICS_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export OUTBOX_RELAY_METRICS_ADDR="127.0.0.1:$METRICS_PORT"
export OUTBOX_RELAY_LOG_FORMAT=console
# The demo's topics (outbox.event.order, outbox.dlq) do not exist yet: let the
# relay create them. In production create topics beforehand instead.
export OUTBOX_RELAY_KAFKA_AUTO_CREATE_TOPICS=true

echo "== outbox-relay migrate"
bin/outbox-relay migrate

echo "== outbox-relay run  (log: $OUTBOX_TEST_RUN_DIR/relay.log, metrics: http://$OUTBOX_RELAY_METRICS_ADDR/metrics)"
bin/outbox-relay run >"$OUTBOX_TEST_RUN_DIR/relay.log" 2>&1 &
RELAY_PID=$!
for _ in $(seq 1 100); do
  curl -fsS "http://$OUTBOX_RELAY_METRICS_ADDR/readyz" >/dev/null 2>&1 && break
  kill -0 "$RELAY_PID" 2>/dev/null || { cat "$OUTBOX_TEST_RUN_DIR/relay.log"; exit 1; }
  sleep 0.2
done
go build -o bin/orders-example ./examples/orders
go build -o bin/billing-example ./examples/billing
go build -o "$OUTBOX_TEST_RUN_DIR/demo-viewer" ./test/demo
echo "== relay ready. orders: examples/orders writes each order change and its event in ONE transaction (package outbox);"
echo "   billing: examples/billing consumes outbox.event.order once per event (package inbox); relay: slot lag"
bin/orders-example --rate 4 ${DEMO_DURATION:+--duration "$DEMO_DURATION"} &
ORDERS_PID=$!
bin/billing-example ${DEMO_DURATION:+--duration "$DEMO_DURATION"} &
BILLING_PID=$!
"$OUTBOX_TEST_RUN_DIR/demo-viewer" --metrics "http://$OUTBOX_RELAY_METRICS_ADDR/metrics" ${DEMO_DURATION:+--duration "$DEMO_DURATION"}
# The examples stop by themselves after DEMO_DURATION; wait for billing's totals.
wait "$ORDERS_PID" "$BILLING_PID" 2>/dev/null || true
