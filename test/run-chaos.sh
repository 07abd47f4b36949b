#!/usr/bin/env bash
# run-chaos.sh: what `make chaos` runs. Starts ONE PostgreSQL and ONE Kafka,
# runs the long fault-injection suite (test/chaos with OUTBOX_CHAOS=long,
# docs/chaos.md), every scenario in both delivery modes (at_least_once,
# exactly_once), the three-node Kafka cluster scenario among them (its cluster
# started by the suite: services.sh cluster-start), prints its tables, stops
# the services. Any loss, order or
# partition violation, any failed assertion, or a service that cannot start
# fails the run, and so does any duplicate or partial PostgreSQL transaction
# in exactly-once mode. OUTBOX_CHAOS_RELAY_BIN runs a prebuilt relay instead of a
# -race build of ./cmd/outbox-relay.
set -euo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

start_services

echo "== chaos tests, long (logs: $OUTBOX_TEST_RUN_DIR/chaos.log, $OUTBOX_TEST_RUN_DIR/chaos-relay-logs)"
rm -f "$OUTBOX_TEST_RUN_DIR/chaos-table.md"
start=$SECONDS
status=0
OUTBOX_CHAOS=long run_suite chaos '' -timeout 60m ./test/chaos/ || status=$?
echo "== chaos suite took $((SECONDS - start))s; table: $OUTBOX_TEST_RUN_DIR/chaos-table.md"
if [ "$status" -ne 0 ]; then
  echo "chaos tests failed"
  exit "$status"
fi
