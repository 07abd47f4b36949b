#!/usr/bin/env bash
# run-tests.sh: what `make test` runs. Starts ONE PostgreSQL and ONE Kafka,
# runs the unit tests and the end-to-end suite, stops the services. Any
# failure, including a service that cannot start, fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

export OUTBOX_TEST_RUN_DIR="${OUTBOX_TEST_RUN_DIR:-$PWD/test/.run}"
cleanup() { bash test/services.sh stop || true; }
trap cleanup EXIT INT TERM

echo "== unit tests (race detector on)"
go test -race -count=1 ./...

echo "== starting PostgreSQL and Kafka"
bash test/services.sh stop >/dev/null 2>&1 || true
bash test/services.sh start >/dev/null  # prints the env file, password included
set -a
# shellcheck disable=SC1091
. "$OUTBOX_TEST_RUN_DIR/env"
set +a

echo "== end-to-end tests (real PostgreSQL, real Kafka, real consumer)"
set +e
go test -count=1 -tags e2e -timeout 12m -v ./test/e2e/ 2>&1 | tee "$OUTBOX_TEST_RUN_DIR/e2e.log" |
  grep --line-buffered -E '^(=== RUN|--- |PASS|FAIL|ok|panic|\s+\S+_test\.go)'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "end-to-end tests failed (full log: $OUTBOX_TEST_RUN_DIR/e2e.log)"
  exit "$status"
fi
