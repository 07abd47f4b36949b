#!/usr/bin/env bash
# run-matrix.sh: what `make matrix` runs. Starts ONE PostgreSQL (15) and ONE
# Kafka, runs the whole end-to-end suite on 15, then on every version of
# OUTBOX_PG_MATRIX_VERSIONS (default 14 16 17 18, test/lib.sh) in turn, each
# an extra PostgreSQL started beside the services and stopped after its run.
# Every version runs; any failure fails the run, with a table of the results.
set -euo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

start_services
status=0
t0=$SECONDS
echo "== end-to-end suite on PostgreSQL $OUTBOX_TEST_PG_VERSION ($OUTBOX_TEST_PG_BUILD)"
run_suite e2e "$PROGRESS" -timeout 25m -parallel 3 ./test/e2e/ || status=$?
main="| $OUTBOX_TEST_PG_VERSION | $OUTBOX_TEST_PG_BUILD | $([ "$status" = 0 ] && echo ok || echo "FAILED (log: $OUTBOX_TEST_RUN_DIR/e2e.log)") | $((SECONDS - t0)) |"
run_on_versions e2e "$OUTBOX_PG_MATRIX_VERSIONS" -timeout 25m -parallel 3 ./test/e2e/ || status=1
echo "$main (the main PostgreSQL)"
exit "$status"
