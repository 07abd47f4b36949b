# test/services-registry.sh - sourced by test/services.sh: a real Confluent-compatible Schema Registry for the tests,
# Apicurio Registry's ready-to-run distribution (io.apicurio:apicurio-registry-app:<version>:tar.gz:all, resolved
# with mvn and test/registry-pom.xml like the Kafka jars with test/pom.xml), unpacked once into
# ~/.cache/outbox-relay/apicurio-registry-<version> and run with a Java 21+ of its own (the broker keeps its Java).
#
# `start` launches it in the background before PostgreSQL and Kafka start, and waits for it after them (a 200 from
# GET <url>/subjects, OUTBOX_TEST_REGISTRY_START_TIMEOUT seconds from the launch, default 90): it adds about a
# second to a warm start. A registry that cannot start fails `start` with its log's tail. `stop` stops it.
#   registry-stop              SIGTERM (SIGKILL after 30 s) and wait until it is gone; clients get "connection
#                              refused". Its storage is in memory (H2): every schema is LOST, so after
#                              registry-start the ids a test registered are unknown (40403) and new ones are
#                              handed out again from 1
#   registry-start             start it again on the same port (the URL stays valid); wait until it serves
#   registry-pause             SIGSTOP (returns once every thread is stopped): the port still accepts connections
#                              (the kernel's backlog) but nothing answers, so clients hit their own timeouts, as
#                              with a hung registry or a network blackhole. Schemas are KEPT
#   registry-resume            SIGCONT: it answers again, with every schema and id it had
#   registry-status            exit 0 only if it answers
# Env lines (KEY=value, in the services' env file):
#   OUTBOX_TEST_SCHEMA_REGISTRY_URL=http://127.0.0.1:<port>/apis/ccompat/v7   the Confluent API's base URL: a client
#                              appends /subjects/..., /schemas/ids/<id> to it (POSTs need Content-Type
#                              application/vnd.schemaregistry.v1+json)
#   OUTBOX_TEST_SCHEMA_REGISTRY_PORT, _PID, _LOG, _DIR (its run temp dir), _APP (the unpacked app), _JAVA, _VERSION
# Knobs:
#   OUTBOX_TEST_REGISTRY=0     start no registry (the env file then has no OUTBOX_TEST_SCHEMA_REGISTRY_* lines, and
#                              tests that need it fail)
#   OUTBOX_REGISTRY_VERSION    default test/registry-pom.xml's registry.version (3.3.3)
#   OUTBOX_REGISTRY_APP        the unpacked app; default $HOME/.cache/outbox-relay/apicurio-registry-<version>
#   OUTBOX_REGISTRY_JAVA_HOME  a Java 21+ for it; default /usr/lib/jvm/temurin-25-jdk-amd64, else the newest 21+
#                              under /usr/lib/jvm, else JAVA_HOME or java on PATH if 21+, else Debian's
#                              openjdk-21/25-jre-headless when apt has one
#   OUTBOX_REGISTRY_HEAP_OPTS  default -Xmx256m (with -XX:+UseSerialGC -XX:TieredStopAtLevel=1: about 255 MB RSS)
#   OUTBOX_TEST_REGISTRY_START_TIMEOUT  seconds from launch to a 200; default 90
# The first run of a Java version records an AppCDS archive of the app's classes (written at the JVM's exit, kept
# as <app>/.cds/java-<version>.jsa, about 75 MB); later starts map it: 1.2 s instead of 1.8 s to a 200 on an idle
# machine.

REGISTRY_POM="$SCRIPT_DIR/registry-pom.xml"
REGISTRY_ENABLED="${OUTBOX_TEST_REGISTRY:-1}"
REGISTRY_VERSION="${OUTBOX_REGISTRY_VERSION:-$(sed -n 's:.*<registry\.version>\([^<]*\)</registry\.version>.*:\1:p' "$REGISTRY_POM" | head -n1)}"
REGISTRY_APP="${OUTBOX_REGISTRY_APP:-$USER_HOME/.cache/outbox-relay/apicurio-registry-$REGISTRY_VERSION}"
REGISTRY_HEAP_OPTS="${OUTBOX_REGISTRY_HEAP_OPTS:--Xmx256m}"
REGISTRY_START_TIMEOUT="${OUTBOX_TEST_REGISTRY_START_TIMEOUT:-90}"
REGISTRY_LOG="$RUN_DIR/registry.log"
REGISTRY_PORT="" REGISTRY_PID="" REGISTRY_DIR="" REGISTRY_JAVA="" REGISTRY_LAUNCHED_AT=""

case "$REGISTRY_ENABLED" in 0|1) ;; *) die "OUTBOX_TEST_REGISTRY must be 0 or 1, not '$REGISTRY_ENABLED'" ;; esac
[[ "$REGISTRY_START_TIMEOUT" =~ ^[0-9]+$ ]] || die "OUTBOX_TEST_REGISTRY_START_TIMEOUT must be a number of seconds"
for v in "$REGISTRY_APP" "${OUTBOX_REGISTRY_JAVA_HOME:-}"; do
  case "$v" in *[[:space:]\'\"\$\`\\]*) die "path with whitespace/quotes is not supported: '$v'" ;; esac
done

registry_url() { echo "http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7"; }

# registry_env_lines: the env file's lines of a running registry (none when it was not started)
registry_env_lines() {
  [ -n "$REGISTRY_PORT" ] || return 0
  cat <<EOF
OUTBOX_TEST_SCHEMA_REGISTRY_URL=$(registry_url)
OUTBOX_TEST_SCHEMA_REGISTRY_PORT=$REGISTRY_PORT
OUTBOX_TEST_SCHEMA_REGISTRY_PID=$REGISTRY_PID
OUTBOX_TEST_SCHEMA_REGISTRY_LOG=$REGISTRY_LOG
OUTBOX_TEST_SCHEMA_REGISTRY_DIR=$REGISTRY_DIR
OUTBOX_TEST_SCHEMA_REGISTRY_APP=$REGISTRY_APP
OUTBOX_TEST_SCHEMA_REGISTRY_JAVA=$REGISTRY_JAVA
OUTBOX_TEST_SCHEMA_REGISTRY_VERSION=$REGISTRY_VERSION
EOF
}

# registry_load_var KEY VALUE: load_env's share of the env file
registry_load_var() {
  case "$1" in
    OUTBOX_TEST_SCHEMA_REGISTRY_PORT) REGISTRY_PORT=$2 ;;
    OUTBOX_TEST_SCHEMA_REGISTRY_PID) REGISTRY_PID=$2 ;;
    OUTBOX_TEST_SCHEMA_REGISTRY_LOG) REGISTRY_LOG=$2 ;;
    OUTBOX_TEST_SCHEMA_REGISTRY_DIR) REGISTRY_DIR=$2 ;;
    OUTBOX_TEST_SCHEMA_REGISTRY_APP) REGISTRY_APP=$2 ;;
    OUTBOX_TEST_SCHEMA_REGISTRY_JAVA) REGISTRY_JAVA=$2 ;;
    OUTBOX_TEST_SCHEMA_REGISTRY_VERSION) REGISTRY_VERSION=$2 ;;
  esac
}

# ----------------------------------------------------------------------------------------------- the app

registry_app_ok() { [ -f "$REGISTRY_APP/.complete" ] && [ -f "$REGISTRY_APP/quarkus-run.jar" ] && [ -d "$REGISTRY_APP/lib" ]; }

# ensure_registry_app: the distribution resolved by mvn and unpacked once: into a temp dir first, checked, then
# renamed, so the cache dir either is complete or does not exist
ensure_registry_app() {
  [[ "$REGISTRY_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.Final)?$ ]] ||
    die "OUTBOX_REGISTRY_VERSION must be an Apicurio Registry release like 3.3.3, not '$REGISTRY_VERSION'"
  if registry_app_ok; then
    log "Apicurio Registry $REGISTRY_VERSION cached in $REGISTRY_APP"
    return 0
  fi
  local t0=$SECONDS partial="$REGISTRY_APP.partial.$$" tgz
  command -v mvn >/dev/null 2>&1 || apt_install maven
  log "resolving io.apicurio:apicurio-registry-app:$REGISTRY_VERSION:tar.gz:all (about 160 MB) into $REGISTRY_APP (mvn dependency:copy)"
  mkdir -p "$(dirname "$REGISTRY_APP")"
  rm -rf "$partial"
  mkdir -p "$partial/tgz" "$partial/app"
  if ! mvn -B -q -Dstyle.color=never -f "$REGISTRY_POM" -Dregistry.version="$REGISTRY_VERSION" \
        -Dout.dir="$partial/tgz" dependency:copy >"$RUN_DIR/mvn-registry.log" 2>&1; then
    tail_file "$RUN_DIR/mvn-registry.log" 40
    rm -rf "$partial"
    die "maven could not resolve io.apicurio:apicurio-registry-app:$REGISTRY_VERSION:tar.gz:all (log: $RUN_DIR/mvn-registry.log)"
  fi
  tgz="$partial/tgz/apicurio-registry-app-$REGISTRY_VERSION-all.tar.gz"
  [ -f "$tgz" ] || { rm -rf "$partial"; die "maven ran but $tgz is missing"; }
  tar -xzf "$tgz" --no-same-owner -C "$partial/app" || { rm -rf "$partial"; die "cannot unpack $tgz"; }
  [ -f "$partial/app/quarkus-run.jar" ] && [ -d "$partial/app/lib" ] ||
    { rm -rf "$partial"; die "$tgz holds no quarkus-run.jar and lib/: not the runnable distribution"; }
  printf 'io.apicurio:apicurio-registry-app:%s:tar.gz:all %s\n' "$REGISTRY_VERSION" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    >"$partial/app/.complete"
  if ! mv -T "$partial/app" "$REGISTRY_APP" 2>/dev/null; then
    registry_app_ok || { rm -rf "$partial"; die "$REGISTRY_APP exists but is incomplete: remove it and run again"; }
  fi
  rm -rf "$partial"
  log "Apicurio Registry $REGISTRY_VERSION unpacked into $REGISTRY_APP ($(du -sh "$REGISTRY_APP" | cut -f1)) in $((SECONDS - t0))s"
}

# java_version JAVA: the version of a java binary (25.0.3, 17.0.15), from its home's release file or by running it
java_version() {
  local j=$1 home v=""
  home="$(dirname "$(dirname "$(readlink -f "$j")")")"
  [ -f "$home/release" ] && v="$(sed -n 's/^JAVA_VERSION="\([^"]*\)".*/\1/p' "$home/release")"
  [ -n "$v" ] || v="$("$j" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.version = //p')"
  echo "${v#1.}"
}

# java_major JAVA: its feature release (25, 21, 17)
java_major() { local v; v="$(java_version "$1")"; echo "${v%%[.+-]*}"; }

# ensure_registry_java: REGISTRY_JAVA, a Java 21+ (3.x is class file 65: Java 17 fails with UnsupportedClassVersionError)
ensure_registry_java() {
  local c m cands=()
  if [ -n "${OUTBOX_REGISTRY_JAVA_HOME:-}" ]; then
    c="$OUTBOX_REGISTRY_JAVA_HOME/bin/java"
    [ -x "$c" ] || die "OUTBOX_REGISTRY_JAVA_HOME=$OUTBOX_REGISTRY_JAVA_HOME has no bin/java"
    m="$(java_major "$c")"
    [ -n "$m" ] && (( m >= 21 )) || die "OUTBOX_REGISTRY_JAVA_HOME=$OUTBOX_REGISTRY_JAVA_HOME is Java '$m': Apicurio Registry $REGISTRY_VERSION needs 21+"
    REGISTRY_JAVA=$c
    return 0
  fi
  cands+=(/usr/lib/jvm/temurin-25-jdk-amd64/bin/java)
  for c in $(ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV); do cands+=("$c"); done
  [ -n "${JAVA_HOME:-}" ] && cands+=("$JAVA_HOME/bin/java")
  c="$(command -v java 2>/dev/null || true)"; [ -n "$c" ] && cands+=("$c")
  for c in "${cands[@]}"; do
    [ -x "$c" ] || continue
    m="$(java_major "$c")"
    if [ -n "$m" ] && (( m >= 21 )); then REGISTRY_JAVA=$c; return 0; fi
  done
  for c in openjdk-25-jre-headless openjdk-21-jre-headless; do
    if command -v apt-cache >/dev/null && [ -n "$(apt-cache policy "$c" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -v none)" ]; then
      apt_install "$c"
      ensure_registry_java_installed && return 0
    fi
  done
  die "no Java 21+ for Apicurio Registry $REGISTRY_VERSION (looked in /usr/lib/jvm, JAVA_HOME, PATH; apt has no openjdk-21/25): set OUTBOX_REGISTRY_JAVA_HOME, or OUTBOX_TEST_REGISTRY=0 to start without it"
}

ensure_registry_java_installed() {
  local c m
  for c in $(ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV); do
    m="$(java_major "$c")"
    if [ -n "$m" ] && (( m >= 21 )); then REGISTRY_JAVA=$c; return 0; fi
  done
  return 1
}

# ----------------------------------------------------------------------------------------------- the process

# is_our_registry PID: the PID is a live registry JVM of this run dir (of the main services' in a start-pg run dir)
is_our_registry() {
  alive "${1:-}" || return 1
  case "$(cmdline_of "$1")" in *"-Doutbox.test.registry=${KAFKA_RUN_DIR:-$RUN_DIR} "*quarkus-run.jar*) return 0 ;; esac
  return 1
}

# registry_cds_archive: the AppCDS archive of this app for this exact Java (an archive fits one JVM build only)
registry_cds_archive() { echo "$REGISTRY_APP/.cds/java-$(java_version "$REGISTRY_JAVA").jsa"; }

# registry_launch: start the JVM in the background of THIS shell (never inside $(...)) and record its PID; its
# working and temp dirs are REGISTRY_DIR. With no AppCDS archive for this Java yet, this run records one in
# REGISTRY_DIR at its exit (registry_keep_archive moves it into the cache).
registry_launch() {
  local cds
  cds="$(registry_cds_archive)"
  if [ -s "$cds" ]; then cds="-XX:SharedArchiveFile=$cds"
  else cds="-XX:ArchiveClassesAtExit=$REGISTRY_DIR/app.jsa"
  fi
  {
    echo
    echo "===== $(date -u +%Y-%m-%dT%H:%M:%SZ) test/services.sh: starting Apicurio Registry $REGISTRY_VERSION on 127.0.0.1:$REGISTRY_PORT ($REGISTRY_JAVA) ====="
  } >>"$REGISTRY_LOG"
  REGISTRY_LAUNCHED_AT=$SECONDS
  # shellcheck disable=SC2086
  (cd "$REGISTRY_DIR" && exec nohup "$REGISTRY_JAVA" $REGISTRY_HEAP_OPTS -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -XX:+ExitOnOutOfMemoryError "$cds" \
    -Doutbox.test.registry="$RUN_DIR" -Djava.io.tmpdir="$REGISTRY_DIR" -Dvertx.cacheDirBase="$REGISTRY_DIR/vertx-cache" \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$REGISTRY_PORT" \
    -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port=0 \
    -jar "$REGISTRY_APP/quarkus-run.jar" >>"$REGISTRY_LOG" 2>&1 </dev/null) &
  REGISTRY_PID=$!
}

# registry_http_code PATH: the HTTP status of GET <url>PATH (000: no answer within 3 s)
registry_http_code() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$(registry_url)$1" 2>/dev/null || true
}

# registry_wait_ready: a 200 from GET <url>/subjects within REGISTRY_START_TIMEOUT of the launch
registry_wait_ready() {
  local deadline=$((REGISTRY_LAUNCHED_AT + REGISTRY_START_TIMEOUT)) code=""
  while (( SECONDS < deadline )); do
    if ! alive "$REGISTRY_PID"; then
      log "registry (pid $REGISTRY_PID) exited during startup"
      return 1
    fi
    code="$(registry_http_code /subjects)"
    [ "$code" = 200 ] && return 0
    sleep 0.2
  done
  log "registry not ready ${REGISTRY_START_TIMEOUT}s after its launch (last GET /subjects: HTTP $code)"
  return 1
}

registry_stop_pid() { # SIGTERM, SIGKILL after 30 s; waits until gone
  local pid=$1
  alive "$pid" || return 0
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone 30 "$pid"; then
    log "registry pid $pid ignored SIGTERM for 30s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone 30 "$pid" || die "registry pid $pid survived SIGKILL for 30s"
  fi
}

# registry_keep_archive: the AppCDS archive a stopped registry recorded, into the cache (first one wins)
registry_keep_archive() {
  local cds tmp
  [ -n "$REGISTRY_DIR" ] && [ -s "$REGISTRY_DIR/app.jsa" ] || return 0
  cds="$(registry_cds_archive)"
  if [ ! -s "$cds" ]; then
    mkdir -p "$(dirname "$cds")"
    tmp="$cds.tmp.$$"
    cp -f "$REGISTRY_DIR/app.jsa" "$tmp" && mv -f "$tmp" "$cds" && log "kept the registry's AppCDS archive: $cds"
    rm -f "$tmp"
  fi
  rm -f "$REGISTRY_DIR/app.jsa"
}

# registry_begin (start): fetch, pick a port, launch without waiting: the JVM starts while PostgreSQL and Kafka do
registry_begin() {
  [ "$REGISTRY_ENABLED" = 1 ] || { log "OUTBOX_TEST_REGISTRY=0: no schema registry"; return 0; }
  command -v curl >/dev/null 2>&1 || apt_install curl
  ensure_registry_app
  ensure_registry_java
  REGISTRY_DIR="$(mktemp -d "$TMP_PARENT/outbox-registry.XXXXXX")"
  REGISTRY_PORT="$(pick_ports 1)"
  RESERVED_PORTS="$REGISTRY_PORT" # Kafka picks its ports before the registry listens
  : >"$REGISTRY_LOG"
  registry_launch
}

# registry_finish (start): wait until it serves; on a port taken meanwhile, again on another port (3 tries)
registry_finish() {
  [ -n "$REGISTRY_PID" ] || return 0
  local attempt
  for attempt in 1 2 3; do
    if registry_wait_ready; then
      log "schema registry ready: pid $REGISTRY_PID, $(registry_url) ($((SECONDS - REGISTRY_LAUNCHED_AT))s after its launch; Apicurio Registry $REGISTRY_VERSION, Java $(java_major "$REGISTRY_JAVA"))"
      return 0
    fi
    registry_stop_pid "$REGISTRY_PID"
    if tail -n 100 "$REGISTRY_LOG" | grep -qi 'in use\|BindException' && (( attempt < 3 )); then
      log "registry port $REGISTRY_PORT was taken; retrying on another port"
      REGISTRY_PORT="$(pick_ports 1)"
      registry_launch
      continue
    fi
    break
  done
  die "the schema registry did not start (log: $REGISTRY_LOG, its tail below)" # on_start_exit prints the tail
}

# registry_teardown: stop it and remove its temp dir (stop, a failed start)
registry_teardown() {
  if [ -n "$REGISTRY_PID" ] && alive "$REGISTRY_PID"; then
    if is_our_registry "$REGISTRY_PID"; then
      log "stopping schema registry pid $REGISTRY_PID"
      registry_stop_pid "$REGISTRY_PID"
    else
      log "pid $REGISTRY_PID is not our schema registry any more: not touching it"
    fi
  fi
  registry_keep_archive
  case "$REGISTRY_DIR" in */outbox-registry.*) rm -rf "$REGISTRY_DIR" ;; esac
}

# set_registry_pid PID: in our env file and in every extra PostgreSQL's
set_registry_pid() {
  local f
  set_env OUTBOX_TEST_SCHEMA_REGISTRY_PID "$1"
  for f in $(extra_env_files); do set_env OUTBOX_TEST_SCHEMA_REGISTRY_PID "$1" "$f"; done
}

# ----------------------------------------------------------------------------------------------- commands

registry_require() {
  require_env
  [ -n "$REGISTRY_PORT" ] || die "no schema registry in $ENV_FILE (started with OUTBOX_TEST_REGISTRY=0?)"
}

cmd_registry_stop() {
  registry_require
  kafka_elsewhere registry-stop && return 0
  if is_our_registry "$REGISTRY_PID"; then
    log "stopping schema registry pid $REGISTRY_PID (its in-memory schemas are lost)"
    registry_stop_pid "$REGISTRY_PID"
    registry_keep_archive
  else
    log "schema registry is not running"
  fi
  set_registry_pid ""
}

cmd_registry_start() {
  registry_require
  kafka_elsewhere registry-start && return 0
  if is_our_registry "$REGISTRY_PID"; then
    if [ "$(registry_http_code /subjects)" = 200 ]; then
      log "schema registry already running: pid $REGISTRY_PID"
      return 0
    fi
    die "schema registry pid $REGISTRY_PID is alive but does not answer (paused? registry-resume; or registry-stop first)"
  fi
  [ -d "$REGISTRY_DIR" ] || die "registry run dir $REGISTRY_DIR is gone"
  registry_app_ok || die "Apicurio Registry missing from $REGISTRY_APP"
  wait_port_free 60 "$REGISTRY_PORT" || die "registry port $REGISTRY_PORT is still taken"
  registry_launch
  if ! registry_wait_ready; then
    registry_stop_pid "$REGISTRY_PID"
    set_registry_pid ""
    tail_file "$REGISTRY_LOG" 60
    die "the schema registry did not restart (log: $REGISTRY_LOG)"
  fi
  set_registry_pid "$REGISTRY_PID"
  log "schema registry restarted: pid $REGISTRY_PID, $(registry_url) (empty: schemas do not survive a restart)"
}

cmd_registry_signal() { # STOP|CONT
  registry_require
  if [ "$1" = STOP ]; then kafka_elsewhere registry-pause && return 0; else kafka_elsewhere registry-resume && return 0; fi
  if ! is_our_registry "$REGISTRY_PID"; then
    [ "$1" = CONT ] && { log "schema registry is not running: nothing to resume"; return 0; }
    die "schema registry is not running"
  fi
  kill "-$1" "$REGISTRY_PID"
  if [ "$1" = STOP ] && ! wait_stopped 10 "$REGISTRY_PID"; then
    die "registry pid $REGISTRY_PID: not every thread stopped within 10s of SIGSTOP"
  fi
  log "sent SIG$1 to schema registry pid $REGISTRY_PID"
}

# registry_status_line: status's line; 1 if the registry should run but does not answer
registry_status_line() {
  if [ -z "$REGISTRY_PORT" ]; then
    echo "registry: not started (OUTBOX_TEST_REGISTRY=0)"
    return 0
  fi
  if is_our_registry "$REGISTRY_PID" && [ "$(registry_http_code /subjects)" = 200 ]; then
    echo "registry: up   pid=$REGISTRY_PID url=$(registry_url) apicurio=$REGISTRY_VERSION"
  else
    echo "registry: DOWN pid=${REGISTRY_PID:-none} url=$(registry_url)"
    return 1
  fi
}

cmd_registry_status() {
  registry_require
  registry_status_line
}
