#!/usr/bin/env bash
# test/compat/debezium.sh - Debezium's PostgreSQL connector with the Outbox Event Router on a Kafka Connect
# standalone worker, for `make compat` (test/run-compat.sh) and `make bench-peer`.
#
# Usage: bash test/compat/debezium.sh <command> ...
#   fetch                     resolve the jars once (mvn + test/compat/pom.xml, cached outside the repo);
#                             prints the cache dir
#   start DIR [KEY=VALUE...]  write DIR/worker.properties and DIR/connector.properties (the defaults below, then
#                             each KEY=VALUE: a key starting with "worker." goes to the worker without that prefix,
#                             e.g. worker.producer.linger.ms=5; any other key to the connector, e.g.
#                             max.batch.size=8192), start the worker in the background (pid in DIR/connect.pid,
#                             log DIR/connect.log) and wait until the connector and its task are RUNNING.
#                             Fails loudly (exit 1, the log's tail) when the worker exits, the connector or the
#                             task fails, or neither runs within DBZ_START_TIMEOUT seconds.
#   stats DIR                 CPU seconds (user+system, all threads) and peak RSS (VmHWM) of the running worker,
#                             from /proc/<pid>: "cpu_s=12.34 rss_peak_kb=123456 rss_kb=120000"
#   stop DIR                  write `stats` to DIR/stats, SIGTERM the worker, wait (SIGKILL after 30 s); idempotent
#
# The database and broker come from the env file of test/services.sh (OUTBOX_TEST_PG_*, OUTBOX_TEST_KAFKA_BROKERS:
# load it first). The slot and the publication are NOT created here: create them before the backlog is written
# (test/compat's `prepare`), so Debezium streams the backlog from the WAL exactly like the relay, with
# snapshot.mode=no_data (no initial SELECT of the table).
#
# Knobs: DBZ_SLOT (debezium_compat), DBZ_PUBLICATION (debezium_compat_pub), DBZ_TABLE (public.outbox),
#   DBZ_NAME (outbox-compat: the connector's name and topic.prefix), DBZ_HEAP_OPTS (-Xms256m -Xmx2g, what
#   Kafka's connect-standalone.sh sets), DBZ_START_TIMEOUT (180), DBZ_CACHE (default
#   ~/.cache/outbox-relay/connect-<connect.version>-debezium-<debezium.version>), JAVA_HOME (Java 17 is enough:
#   Debezium 3.6.1's classes are Java 17 bytecode).
#
# Known noise: at start the worker logs one ERROR "Failed to discover Converter in .../debezium-connector-postgres:
# Failed to statically initialize plugin class": Debezium 3.6.1's CloudEventsConverter looks up
# JsonConverter.convertToConnect(Schema, JsonNode) by reflection, which Kafka Connect 4.3.0 no longer has. That
# converter is not used here (StringConverter is); the connector and the EventRouter load and run.
set -euo pipefail

dlog() { printf '[debezium %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
ddie() { printf '[debezium %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2; exit 1; }

DBZ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DBZ_POM="$DBZ_DIR/pom.xml"
CONNECT_VERSION="$(sed -n 's:.*<connect\.version>\([^<]*\)</connect\.version>.*:\1:p' "$DBZ_POM" | head -n1)"
DEBEZIUM_VERSION="$(sed -n 's:.*<debezium\.version>\([^<]*\)</debezium\.version>.*:\1:p' "$DBZ_POM" | head -n1)"
[ -n "$CONNECT_VERSION" ] && [ -n "$DEBEZIUM_VERSION" ] || ddie "cannot read the versions from $DBZ_POM"
USER_HOME="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
DBZ_CACHE="${DBZ_CACHE:-$USER_HOME/.cache/outbox-relay/connect-$CONNECT_VERSION-debezium-$DEBEZIUM_VERSION}"
CONNECT_LIBS="$DBZ_CACHE/connect"
PLUGIN_PATH="$DBZ_CACHE/plugins"
PLUGIN_LIBS="$PLUGIN_PATH/debezium-connector-postgres"
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
DBZ_SLOT="${DBZ_SLOT:-debezium_compat}"
DBZ_PUBLICATION="${DBZ_PUBLICATION:-debezium_compat_pub}"
DBZ_TABLE="${DBZ_TABLE:-public.outbox}"
DBZ_NAME="${DBZ_NAME:-outbox-compat}"
DBZ_HEAP_OPTS="${DBZ_HEAP_OPTS:--Xms256m -Xmx2g}"
DBZ_START_TIMEOUT="${DBZ_START_TIMEOUT:-180}"
# kafka-run-class.sh's JVM options (as test/services.sh runs the broker)
DBZ_JVM_OPTS="-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
-XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -XX:+ExitOnOutOfMemoryError \
-Djava.awt.headless=true -Djava.net.preferIPv4Stack=true"

# The jars each set must have for the run to mean anything.
CONNECT_MUST=("connect-runtime-$CONNECT_VERSION.jar" "connect-json-$CONNECT_VERSION.jar"
  "connect-transforms-$CONNECT_VERSION.jar" "kafka-clients-$CONNECT_VERSION.jar" "log4j-slf4j-impl-")
PLUGIN_MUST=("debezium-connector-postgres-$DEBEZIUM_VERSION.jar" "debezium-connect-plugins-$DEBEZIUM_VERSION.jar"
  "debezium-connector-common-$DEBEZIUM_VERSION.jar" "postgresql-")

jars_ok() { # jars_ok DIR NAME-PREFIX...
  local d=$1 j; shift
  for j in "$@"; do compgen -G "$d/$j*" >/dev/null || return 1; done
}

resolve_set() { # resolve_set PROFILE DEST NAME-PREFIX...
  local profile=$1 dest=$2 partial="$2.partial.$$"; shift 2
  jars_ok "$dest" "$@" && return 0
  command -v mvn >/dev/null || ddie "mvn is missing (apt-get install maven)"
  mkdir -p "$DBZ_CACHE"
  rm -rf "$partial"
  dlog "resolving the $profile jars into $dest"
  if ! mvn -B -q -Dstyle.color=never -f "$DBZ_POM" -P "$profile" -Dlibs.dir="$partial" dependency:copy-dependencies \
      >"$DBZ_CACHE/mvn-$profile.log" 2>&1; then
    tail -n 60 "$DBZ_CACHE/mvn-$profile.log" >&2
    rm -rf "$partial"
    ddie "maven could not resolve the $profile jars (log: $DBZ_CACHE/mvn-$profile.log)"
  fi
  jars_ok "$partial" "$@" || { ls "$partial" >&2; rm -rf "$partial"; ddie "maven ran but the $profile jars are incomplete"; }
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  mv -T "$partial" "$dest"
}

cmd_fetch() {
  resolve_set connect "$CONNECT_LIBS" "${CONNECT_MUST[@]}"
  resolve_set debezium "$PLUGIN_LIBS" "${PLUGIN_MUST[@]}"
  echo "$DBZ_CACHE"
}

need_env() {
  local v
  for v in OUTBOX_TEST_PG_HOST OUTBOX_TEST_PG_PORT OUTBOX_TEST_PG_USER OUTBOX_TEST_PG_PASSWORD \
      OUTBOX_TEST_PG_DATABASE OUTBOX_TEST_KAFKA_BROKERS; do
    [ -n "${!v:-}" ] || ddie "$v is not set: load the env file of test/services.sh first (set -a; . test/.run/env; set +a)"
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# props_set FILE KEY VALUE: replace or append KEY=VALUE
props_set() {
  local f=$1 k=$2 v=$3 tmp
  tmp="$f.tmp"
  awk -v k="$k" -v v="$v" 'BEGIN{done=0} { i=index($0,"="); if (i>0 && substr($0,1,i-1)==k) { if (!done) print k"="v; done=1; next } print } END{ if (!done) print k"="v }' "$f" >"$tmp"
  mv -f "$tmp" "$f"
}

pid_of() { # pid_of DIR: the worker's pid if it is alive and ours
  local p
  p="$(cat "$1/connect.pid" 2>/dev/null || true)"
  [ -n "$p" ] && [ -r "/proc/$p/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$p/cmdline" | grep -q "ConnectStandalone $1/worker.properties" || return 1
  echo "$p"
}

cmd_start() {
  local dir=${1:?start needs DIR}; shift
  case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
  need_env
  jars_ok "$CONNECT_LIBS" "${CONNECT_MUST[@]}" && jars_ok "$PLUGIN_LIBS" "${PLUGIN_MUST[@]}" || cmd_fetch >/dev/null
  if p="$(pid_of "$dir")"; then ddie "a worker already runs from $dir (pid $p): stop it first"; fi
  mkdir -p "$dir"
  rm -f "$dir/connect.offsets" "$dir/stats" "$dir/connect.pid"
  local rest_port
  rest_port="$(free_port)"

  # Every setting the run uses is written here (and overridable with KEY=VALUE); anything not written is the
  # default of Kafka Connect 4.3.0 / Debezium 3.6.1.Final.
  cat >"$dir/worker.properties" <<EOF
# Kafka Connect $CONNECT_VERSION standalone worker; written by test/compat/debezium.sh
bootstrap.servers=$OUTBOX_TEST_KAFKA_BROKERS
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
header.converter=org.apache.kafka.connect.storage.SimpleHeaderConverter
offset.storage.file.filename=$dir/connect.offsets
offset.flush.interval.ms=1000
plugin.path=$PLUGIN_PATH
plugin.discovery=service_load
listeners=http://127.0.0.1:$rest_port
EOF
  cat >"$dir/connector.properties" <<EOF
# Debezium $DEBEZIUM_VERSION PostgreSQL connector + Outbox Event Router; written by test/compat/debezium.sh
name=$DBZ_NAME
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
plugin.name=pgoutput
database.hostname=$OUTBOX_TEST_PG_HOST
database.port=$OUTBOX_TEST_PG_PORT
database.user=$OUTBOX_TEST_PG_USER
database.password=$OUTBOX_TEST_PG_PASSWORD
database.dbname=$OUTBOX_TEST_PG_DATABASE
topic.prefix=$DBZ_NAME
slot.name=$DBZ_SLOT
slot.drop.on.stop=false
publication.name=$DBZ_PUBLICATION
publication.autocreate.mode=disabled
table.include.list=$DBZ_TABLE
snapshot.mode=no_data
tombstones.on.delete=false
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
EOF
  local kv k v
  for kv in "$@"; do
    [[ "$kv" == *=* ]] || ddie "setting '$kv' is not KEY=VALUE"
    k="${kv%%=*}"; v="${kv#*=}"
    case "$k" in
      worker.*) props_set "$dir/worker.properties" "${k#worker.}" "$v" ;;
      *) props_set "$dir/connector.properties" "$k" "$v" ;;
    esac
  done
  rest_port="$(sed -n 's|^listeners=http://127.0.0.1:\([0-9]*\)$|\1|p' "$dir/worker.properties")"
  [ -n "$rest_port" ] || ddie "worker.listeners must stay http://127.0.0.1:<port>"

  cat >"$dir/log4j2.properties" <<EOF
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $dir/connect.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
EOF
  : >"$dir/connect.log"
  dlog "starting Kafka Connect $CONNECT_VERSION (standalone) with Debezium $DEBEZIUM_VERSION: REST 127.0.0.1:$rest_port, dir $dir"
  # shellcheck disable=SC2086
  setsid "$JAVA" $DBZ_HEAP_OPTS $DBZ_JVM_OPTS "-Dlog4j2.configurationFile=$dir/log4j2.properties" \
    -cp "$CONNECT_LIBS/*" org.apache.kafka.connect.cli.ConnectStandalone \
    "$dir/worker.properties" "$dir/connector.properties" >"$dir/connect.out" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$dir/connect.pid"
  date +%s.%N >"$dir/started_at"

  local deadline=$((SECONDS + DBZ_START_TIMEOUT)) st=""
  while :; do
    if ! pid_of "$dir" >/dev/null; then
      tail -n 80 "$dir/connect.log" >&2; tail -n 20 "$dir/connect.out" >&2
      ddie "Kafka Connect exited during start (log: $dir/connect.log)"
    fi
    st="$(curl -fsS "http://127.0.0.1:$rest_port/connectors/$DBZ_NAME/status" 2>/dev/null || true)"
    if [[ "$st" == *'"FAILED"'* ]]; then
      printf '%s\n' "$st" >&2
      tail -n 80 "$dir/connect.log" >&2
      cmd_stop "$dir" >/dev/null 2>&1 || true
      ddie "the Debezium connector or its task FAILED (log: $dir/connect.log)"
    fi
    # {"name":..,"connector":{"state":"RUNNING",..},"tasks":[{"id":0,"state":"RUNNING",..}],..}
    if [[ "$(grep -o '"state":"RUNNING"' <<<"$st" | wc -l)" -ge 2 ]]; then
      break
    fi
    if (( SECONDS >= deadline )); then
      printf '%s\n' "$st" >&2
      tail -n 80 "$dir/connect.log" >&2
      cmd_stop "$dir" >/dev/null 2>&1 || true
      ddie "the Debezium connector did not reach RUNNING within ${DBZ_START_TIMEOUT}s (log: $dir/connect.log)"
    fi
    sleep 0.2
  done
  echo "$rest_port" >"$dir/rest_port"
  dlog "connector $DBZ_NAME RUNNING (pid $pid)"
}

cmd_stats() {
  local dir=${1:?stats needs DIR} p stat ut st clk hwm rss
  p="$(pid_of "$dir")" || ddie "no running worker from $dir"
  stat="$(sed -E 's/^[0-9]+ \(.*\) //' "/proc/$p/stat")"
  ut="$(awk '{print $12}' <<<"$stat")"; st="$(awk '{print $13}' <<<"$stat")"
  clk="$(getconf CLK_TCK)"
  hwm="$(awk '/^VmHWM:/{print $2}' "/proc/$p/status")"
  rss="$(awk '/^VmRSS:/{print $2}' "/proc/$p/status")"
  printf 'cpu_s=%s rss_peak_kb=%s rss_kb=%s\n' "$(awk -v a="$ut" -v b="$st" -v c="$clk" 'BEGIN{printf "%.2f", (a+b)/c}')" "$hwm" "$rss"
}

cmd_stop() {
  local dir=${1:?stop needs DIR} p
  case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
  p="$(pid_of "$dir")" || { dlog "no worker running from $dir"; return 0; }
  cmd_stats "$dir" | tee "$dir/stats"
  kill -TERM "$p" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$p" 2>/dev/null; do
    if (( SECONDS >= deadline )); then
      dlog "worker $p ignored SIGTERM for 30s: SIGKILL"
      kill -KILL "$p" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$dir/connect.pid"
  dlog "worker $p stopped"
}

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) shift; cmd_start "$@" ;;
  stats) cmd_stats "${2:-}" ;;
  stop) cmd_stop "${2:-}" ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
