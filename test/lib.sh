# lib.sh: sourced by run-tests.sh and run-chaos.sh (from the repo root).
# start_services starts ONE PostgreSQL and ONE Kafka (stopped again on exit)
# and exports their env file; run_suite runs one go test suite, logging to
# $OUTBOX_TEST_RUN_DIR/<name>.log and showing only test progress.

export OUTBOX_TEST_RUN_DIR="${OUTBOX_TEST_RUN_DIR:-$PWD/test/.run}"

start_services() {
  trap 'bash test/services.sh stop || true' EXIT INT TERM
  echo "== starting PostgreSQL and Kafka"
  bash test/services.sh stop >/dev/null 2>&1 || true
  bash test/services.sh start >/dev/null # prints the env file, password included
  set -a
  # shellcheck disable=SC1091
  . "$OUTBOX_TEST_RUN_DIR/env"
  set +a
}

# run_suite NAME FILTER go-test-args...: FILTER is a grep -E pattern for the
# lines to show ('' shows all). Returns go test's exit status.
run_suite() {
  local name=$1 filter=$2
  shift 2
  set +e
  if [ -n "$filter" ]; then
    go test -count=1 -tags e2e -v "$@" 2>&1 | tee "$OUTBOX_TEST_RUN_DIR/$name.log" | grep --line-buffered -E "$filter"
  else
    go test -count=1 -tags e2e -v "$@" 2>&1 | tee "$OUTBOX_TEST_RUN_DIR/$name.log"
  fi
  local status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

PROGRESS='^(=== RUN|--- |PASS|FAIL|ok|panic|\s+\S+_test\.go)'
