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

# The PostgreSQL versions beside the main one (15) and what runs on them:
# make test runs the smoke subset on OUTBOX_PG_SMOKE_VERSIONS, make matrix
# the whole end-to-end suite on OUTBOX_PG_MATRIX_VERSIONS. Each is a major
# (its zonky build in test/pg-fetch.sh) or a full zonky version (17.6.0).
OUTBOX_PG_SMOKE_VERSIONS="${OUTBOX_PG_SMOKE_VERSIONS-14 16 17 18}"
OUTBOX_PG_MATRIX_VERSIONS="${OUTBOX_PG_MATRIX_VERSIONS-14 16 17 18}"

# The smoke subset: delivery (clean run, in order), SIGTERM restart, kill -9,
# broker down, idle slot advance, and the publication checks whose server
# behaviour changed in 18 (a missing publication filters instead of failing).
SMOKE_TESTS='^(TestCleanRunExactlyOnceInOrder|TestSigtermRestartNoLossNoDuplicates|TestKill9RestartNoLossDuplicatesOnlyUnconfirmed|TestBrokerDownSlotHoldsThenDelivers|TestIdleOutboxSlotAdvances|TestPublicationDroppedWhileRunningStops|TestRefusesBadSetups)$/^publication'

# run_on_versions NAME "VERSIONS" go-test-args...: for each version in turn,
# start an extra PostgreSQL of it beside the running services (services.sh
# start-pg, sharing their Kafka), run go test against it (log:
# $OUTBOX_TEST_RUN_DIR/pg-VERSION/NAME.log) and stop it. Every version runs;
# prints a table (version, build, result, seconds) and returns 1 if any
# failed, including one whose PostgreSQL could not start.
run_on_versions() {
  local name=$1 versions=$2 v t0 rc build failed=0 rows=""
  shift 2
  for v in $versions; do
    echo "== $name on PostgreSQL $v (services.sh start-pg $v)"
    t0=$SECONDS
    rc=0
    if bash test/services.sh start-pg "$v" >/dev/null; then
      build="$(sed -n 's/^OUTBOX_TEST_PG_BUILD=//p' "$OUTBOX_TEST_RUN_DIR/pg-$v/env")"
      (
        export OUTBOX_TEST_RUN_DIR="$OUTBOX_TEST_RUN_DIR/pg-$v"
        set -a
        # shellcheck disable=SC1091
        . "$OUTBOX_TEST_RUN_DIR/env"
        set +a
        run_suite "$name" "$PROGRESS" "$@"
      ) || rc=$?
    else
      rc=$?
      build="(did not start: services.sh start-pg $v said why above)"
    fi
    bash test/services.sh stop-pg "$v" >/dev/null 2>&1 || true
    if [ "$rc" = 0 ]; then
      rows+="| $v | $build | ok | $((SECONDS - t0)) |"$'\n'
    elif [ -f "$OUTBOX_TEST_RUN_DIR/pg-$v/$name.log" ]; then
      failed=1
      rows+="| $v | $build | FAILED (log: $OUTBOX_TEST_RUN_DIR/pg-$v/$name.log) | $((SECONDS - t0)) |"$'\n'
    else
      failed=1
      rows+="| $v | $build | FAILED | $((SECONDS - t0)) |"$'\n'
    fi
  done
  echo
  echo "| PostgreSQL | build | $name | seconds |"
  echo "|---|---|---|---|"
  printf '%s' "$rows"
  if [ "$failed" != 0 ]; then
    echo "$name FAILED on at least one PostgreSQL version (table above)"
    return 1
  fi
}
