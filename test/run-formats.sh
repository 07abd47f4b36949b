#!/usr/bin/env bash
# run-formats.sh: what `make formats` runs. Starts ONE PostgreSQL, ONE Kafka
# and ONE Schema Registry (Apicurio, Confluent API; test/services.sh), runs
# the long suite of the Schema Registry formats and CloudEvents
# (test/e2e/formats_long_test.go, build tags e2e and formats, the tests
# named TestFormats*: docs/testing.md), stops the services. Two of the tests
# stop and restart the registry. Any failure, or a service that cannot
# start, fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

start_services

echo "== formats suite, long (log: $OUTBOX_TEST_RUN_DIR/formats.log, relay logs: $OUTBOX_TEST_RUN_DIR/relay-logs)"
start=$SECONDS
set +e
go test -tags 'e2e formats' -count=1 -timeout 20m -run '^TestFormats' -v ./test/e2e/ 2>&1 |
  tee "$OUTBOX_TEST_RUN_DIR/formats.log" | grep --line-buffered -E "$PROGRESS"
status=${PIPESTATUS[0]}
set -e
echo "== formats suite took $((SECONDS - start))s"
if [ "$status" -ne 0 ]; then
  echo "formats tests failed (full log: $OUTBOX_TEST_RUN_DIR/formats.log)"
fi
exit "$status"
