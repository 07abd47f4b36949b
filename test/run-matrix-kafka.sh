#!/usr/bin/env bash
# run-matrix-kafka.sh: what `make matrix-kafka` runs. For each Kafka release of
# OUTBOX_KAFKA_MATRIX_VERSIONS (default 3.9.1 4.2.0 4.4.0) in turn: a fresh
# PostgreSQL 15 and a fresh single-node broker of that release
# (OUTBOX_KAFKA_VERSION=V test/services.sh start, jars cached per release),
# then two passes of end-to-end tests against them:
#   direct: the delivery, kill -9 and exactly-once tests (KAFKA_TESTS) with the
#           relay's defaults (kafka.producer direct, kafka.version 3.6.0);
#   sarama: the delivery, kill -9 and exactly-once core (SARAMA_TESTS) with
#           kafka.producer sarama and kafka.version set to the broker's release
#           (OUTBOX_RELAY_KAFKA_* in the relay's environment).
# A version fails if its broker cannot start, its log lacks "Kafka version: V"
# or "Kafka Server started" (wrong jars, or no logging binding), a test fails,
# or a listed test did not run. Every version runs; prints a table; exits 1 if
# any failed. Not part of `make test` (about 6.5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

VERSIONS="${OUTBOX_KAFKA_MATRIX_VERSIONS-3.9.1 4.2.0 4.4.0}"
KAFKA_TESTS="TestCleanRunExactlyOnceInOrder TestSigtermRestartNoLossNoDuplicates TestBrokerDownSlotHoldsThenDelivers
TestCompressionCodecs TestSASLScramAuthentication TestTLSProducer TestReturnedErrorRewindsInOrder
TestKill9RestartNoLossDuplicatesOnlyUnconfirmed TestMessageOutboxKill9NoLossDuplicatesOnlyUnconfirmed
TestExactlyOnceCleanRun TestExactlyOnceKill9NoLossNoDuplicates TestExactlyOncePoisonDeadLetteredOnce
TestExactlyOnceCheckpointSkipsCommitted TestExactlyOnceSharedTransactionalIDRefused
TestExactlyOnceBrokerStallLongerThanTransactionTimeout TestExactlyOnceLargeTransaction TestReadCommittedReader
TestMissingTopicExactlyOnce"
SARAMA_TESTS="TestCleanRunExactlyOnceInOrder TestSigtermRestartNoLossNoDuplicates
TestKill9RestartNoLossDuplicatesOnlyUnconfirmed TestExactlyOnceCleanRun TestExactlyOnceKill9NoLossNoDuplicates"

MAIN_RUN_DIR="$OUTBOX_TEST_RUN_DIR"
CURRENT=""
cleanup() { [ -n "$CURRENT" ] && OUTBOX_TEST_RUN_DIR="$CURRENT" bash test/services.sh stop >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM

# run_pass NAME "TESTS" [ENV=VALUE...]: go test of exactly TESTS against the
# loaded services; prints "passed/listed" and returns 1 unless every listed test
# passed (a name that matched no test counts as failed)
run_pass() {
  local name=$1 tests=$2 t ok=0 n=0 rc=0 missing=""
  shift 2
  (
    [ $# = 0 ] || export "$@"
    run_suite "$name" "$PROGRESS" -timeout 15m -parallel 3 -run "^($(tr -s ' \n' '|' <<<"$tests" | sed 's/|$//'))\$" ./test/e2e/
  ) >&2 || rc=$?
  for t in $tests; do
    n=$((n + 1))
    if grep -q "^--- PASS: $t " "$OUTBOX_TEST_RUN_DIR/$name.log"; then ok=$((ok + 1)); else missing+=" $t"; fi
  done
  echo "$ok/$n"
  [ "$rc" = 0 ] && [ "$ok" = "$n" ] || { echo "$name: not passed:$missing" >&2; return 1; }
}

failed=0
rows=""
t00=$SECONDS
for v in $VERSIONS; do
  echo "== Kafka $v: fresh PostgreSQL 15 + broker (OUTBOX_KAFKA_VERSION=$v test/services.sh start)"
  t0=$SECONDS
  dir="$MAIN_RUN_DIR/kafka-$v"
  mkdir -p "$dir"
  export OUTBOX_TEST_RUN_DIR="$dir"
  direct="-" sarama="-" logging="-" txv="-" bad=0
  bash test/services.sh stop >/dev/null 2>&1 || true
  CURRENT="$dir"
  if OUTBOX_KAFKA_VERSION="$v" bash test/services.sh start >"$dir/services.out" 2>&1; then
    set -a
    # shellcheck disable=SC1091
    . "$dir/env"
    set +a
    logging="$(cd "$OUTBOX_TEST_KAFKA_LIBS" && ls slf4j-reload4j-*.jar log4j-slf4j*-impl-*.jar 2>/dev/null | sed 's/\.jar$//' | paste -sd ' ' || true)"
    # the release that really ran, logging through its binding: both lines come from the broker's own log
    if ! grep -q "Kafka version: $v " "$OUTBOX_TEST_KAFKA_LOG" || ! grep -q 'Kafka Server started' "$OUTBOX_TEST_KAFKA_LOG"; then
      echo "broker log $OUTBOX_TEST_KAFKA_LOG lacks 'Kafka version: $v' or 'Kafka Server started'"
      bad=1
    fi
    # KIP-890 transaction protocol v2 is finalized on new 4.x clusters: the table says which the test ran against
    txv="$(grep -o 'finalizedFeatures={[^}]*}' "$OUTBOX_TEST_KAFKA_LOG" | tail -n1 | grep -o 'transaction.version=[0-9]*' | cut -d= -f2 || true)"
    txv="${txv:-0}"
    direct="$(run_pass direct "$KAFKA_TESTS")" || bad=1
    sarama="$(run_pass sarama "$SARAMA_TESTS" OUTBOX_RELAY_KAFKA_PRODUCER=sarama OUTBOX_RELAY_KAFKA_VERSION="$v")" || bad=1
  else
    echo "Kafka $v: services did not start:"
    tail -n 30 "$dir/services.out"
    bad=1
  fi
  bash test/services.sh stop >/dev/null 2>&1 || true
  CURRENT=""
  result=ok
  [ "$bad" = 0 ] || { result="FAILED (logs: $dir)"; failed=1; }
  rows+="| $v | $logging | $txv | $direct | $sarama | $result | $((SECONDS - t0)) |"$'\n'
done
export OUTBOX_TEST_RUN_DIR="$MAIN_RUN_DIR"
echo
echo "| Kafka | SLF4J binding | transaction.version | direct, defaults | sarama, kafka.version = broker | result | seconds |"
echo "|---|---|---|---|---|---|---|"
printf '%s' "$rows"
echo "wall time $((SECONDS - t00)) s"
if [ "$failed" != 0 ]; then
  echo "matrix-kafka FAILED on at least one Kafka release (table above)"
  exit 1
fi
