#!/usr/bin/env bash
# demo.sh: what `make demo` runs. Starts a local PostgreSQL and Kafka with the
# test harness, migrates, runs the relay and a sample order service, and
# prints events as Kafka delivers them plus the slot lag, until Ctrl-C.
# DEMO_DURATION=30s stops it by itself (used to check the demo).
set -euo pipefail
cd "$(dirname "$0")/.."

export OUTBOX_TEST_RUN_DIR="$PWD/test/.run/demo"
mkdir -p "$OUTBOX_TEST_RUN_DIR"
RELAY_PID=""
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "== stopping"
  if [ -n "$RELAY_PID" ] && kill -0 "$RELAY_PID" 2>/dev/null; then
    kill -TERM "$RELAY_PID" 2>/dev/null || true
    wait "$RELAY_PID" 2>/dev/null || true
  fi
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
echo "== relay ready; the sample order service writes orders + outbox rows in one transaction each"
go run ./test/demo --metrics "http://$OUTBOX_RELAY_METRICS_ADDR/metrics" ${DEMO_DURATION:+--duration "$DEMO_DURATION"}
