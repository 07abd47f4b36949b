#!/usr/bin/env bash
# run-tests.sh: what `make test` runs. Checks the alert rules, runs the unit
# tests, starts ONE PostgreSQL (15), ONE Kafka and ONE Schema Registry, runs
# the end-to-end suite, the serialize package's real-registry test
# (TestE2ERealRegistry) and the short fault-injection (chaos) suite (each
# scenario in one delivery
# mode, at_least_once or exactly_once, relay_kill9 and the three-node Kafka
# cluster scenario in both: docs/chaos.md), then the end-to-end smoke
# subset on PostgreSQL 14, 16, 17 and 18 in turn against the same Kafka
# (OUTBOX_PG_SMOKE_VERSIONS, test/lib.sh), stops the services. Any failure,
# including a service, a PostgreSQL version or promtool that cannot start,
# fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

# First: the alert rules (promtool check rules + promtool test rules; fetches
# promtool when missing, fails if it cannot or a rule test fails).
bash test/alerts.sh

echo "== unit tests (race detector on)"
go test -race -count=1 ./...

start_services

echo "== end-to-end tests (real PostgreSQL, real Kafka, real consumer)"
if ! run_suite e2e "$PROGRESS" -timeout 20m -parallel 4 ./test/e2e/; then
  echo "end-to-end tests failed (full log: $OUTBOX_TEST_RUN_DIR/e2e.log)"
  exit 1
fi

echo "== serialize against the real Schema Registry (TestE2ERealRegistry: every format registered, encoded, read back)"
if ! run_suite serialize-registry "$PROGRESS" -run TestE2ERealRegistry ./serialize/; then
  echo "serialize real-registry test failed (full log: $OUTBOX_TEST_RUN_DIR/serialize-registry.log)"
  exit 1
fi

echo "== chaos tests, short (kills, restarts, pauses, network cuts under load, a three-node Kafka cluster losing leaders; docs/chaos.md)"
rm -f "$OUTBOX_TEST_RUN_DIR/chaos-table.md"
status=0
# the cluster scenario starts the three-node cluster (services.sh cluster-start) and stops it at the end
OUTBOX_CHAOS=short run_suite chaos "$PROGRESS" -timeout 25m ./test/chaos/ || status=$?
[ -f "$OUTBOX_TEST_RUN_DIR/chaos-table.md" ] && cat "$OUTBOX_TEST_RUN_DIR/chaos-table.md"
if [ "$status" -ne 0 ]; then
  echo "chaos tests failed (full log: $OUTBOX_TEST_RUN_DIR/chaos.log, relay logs: $OUTBOX_TEST_RUN_DIR/chaos-relay-logs)"
  exit "$status"
fi

echo "== end-to-end smoke subset on the other PostgreSQL versions: $OUTBOX_PG_SMOKE_VERSIONS"
run_on_versions smoke "$OUTBOX_PG_SMOKE_VERSIONS" -timeout 6m -run "$SMOKE_TESTS" ./test/e2e/
