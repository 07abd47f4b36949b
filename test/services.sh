#!/usr/bin/env bash
# test/services.sh - real throwaway services for outbox-relay's integration tests and benchmarks:
#   one PostgreSQL cluster (wal_level=logical; 15 = Debian's postgresql-15 unless OUTBOX_TEST_PG_VERSION says
#   otherwise), one single-node KRaft Apache Kafka broker (test/pom.xml's kafka.version unless OUTBOX_KAFKA_VERSION
#   says otherwise) and one Confluent-compatible Schema Registry (Apicurio Registry, test/registry-pom.xml; in-memory
#   storage), all on free 127.0.0.1 ports, in fresh temp dirs.
#
# Usage: bash test/services.sh <command>
#   start                      install missing prerequisites, resolve the Kafka jars and the registry (once, cached
#                              outside the repo), start the services, wait until each really serves, write the env file
#   stop                       stop them all (idempotent), remove temp dirs and the env file
#   status                     show state; exit 0 only if all serve
#   kafka-kill                 kill -9 the broker and wait until it is gone
#   kafka-start                start the broker again: same ports, same data dir (no re-format); wait until ready
#   kafka-pause | kafka-resume SIGSTOP / SIGCONT the broker (stalled-broker fault tests); kafka-pause returns once
#                              every broker thread is stopped (kill -STOP alone returns before that)
#   pg-restart [fast|immediate] pg_ctl stop -m MODE, then start on the same port/data dir; wait until ready
#   start-pg VERSION           an EXTRA PostgreSQL of VERSION (14, 16, 17, 18, 15 or a zonky version like 17.6.0)
#                              beside the running services, sharing their Kafka. Its run dir <run dir>/pg-VERSION
#                              holds a complete env file (that PostgreSQL + the running Kafka): point
#                              OUTBOX_TEST_RUN_DIR at it and load it to run tests there, e.g.
#                                bash test/services.sh start-pg 17
#                                export OUTBOX_TEST_RUN_DIR=$PWD/test/.run/pg-17; set -a; . $OUTBOX_TEST_RUN_DIR/env; set +a
#                                go test -tags e2e -run TestX ./test/e2e/
#                              With that run dir, pg-restart acts on the extra PostgreSQL and kafka-* on the shared
#                              broker. stop on the main run dir stops every extra PostgreSQL too.
#   stop-pg VERSION            stop that extra PostgreSQL (idempotent)
#   registry-stop | registry-start   stop the schema registry (its schemas are LOST: in-memory storage) / start it
#                              again on the same port, so OUTBOX_TEST_SCHEMA_REGISTRY_URL stays valid
#   registry-pause | registry-resume SIGSTOP / SIGCONT the registry: connections hang instead of being refused, and
#                              the schemas are KEPT. registry-status. test/services-registry.sh, which see
#   cluster-start | cluster-stop | cluster-status | cluster-kill N | cluster-term N | cluster-node-start N |
#   cluster-pause N | cluster-resume N
#                              a three-node KRaft cluster (replication factor 3, min.insync.replicas 2) beside the
#                              single broker, and faults on its node N: test/services-cluster.sh, which see
#
# Env file ($OUTBOX_TEST_RUN_DIR/env, default <repo>/test/.run/env): plain KEY=value lines, no quoting, e.g.
#   OUTBOX_TEST_PG_URL=postgres://relay:<pw>@127.0.0.1:<port>/outbox?sslmode=disable
#   OUTBOX_TEST_KAFKA_BROKERS=127.0.0.1:<port>
#   OUTBOX_TEST_KAFKA_PROXY_PORT=<Y>              the broker's PROXIED listener advertises 127.0.0.1:<Y>, where
#   OUTBOX_TEST_KAFKA_PROXY_TARGET=127.0.0.1:<X>  nothing listens until a test runs a TCP proxy there (test/proxy)
#                                                 forwarding to <X>, the port the PROXIED listener binds. A client
#                                                 bootstrapping on <Y> then reaches the broker only through the proxy,
#                                                 so the test can cut, blackhole or reset that path (test/chaos).
#   OUTBOX_TEST_SCHEMA_REGISTRY_URL=http://127.0.0.1:<port>/apis/ccompat/v7   the registry's Confluent API base URL
# Load it into a shell with:  set -a; . test/.run/env; set +a
#
# Knobs (all optional):
#   OUTBOX_TEST_RUN_DIR        run dir (env file, kafka.log, postgres.log copy); default <repo>/test/.run
#   OUTBOX_TEST_PG_VERSION     PostgreSQL of start: 15 (default: Debian's postgresql-15), 14, 16, 17, 18 or a full
#                              zonky version (17.6.0): a server build from Maven Central fetched once into a cache
#                              by test/pg-fetch.sh (which see). Recorded in the env file with the server's
#                              OUTBOX_TEST_PG_MAJOR, OUTBOX_TEST_PG_SERVER_VERSION_NUM and OUTBOX_TEST_PG_BUILD.
#   OUTBOX_KAFKA_VERSION       the broker's Kafka release (kafka_2.13 on Maven Central); default test/pom.xml's
#                              kafka.version (4.2.0). Tested: 3.9.1, 4.2.0, 4.4.0 (make matrix-kafka). 3.x logs through
#                              reload4j (log4j.properties), 4.x through log4j2: chosen from the jars the release pulls
#   OUTBOX_KAFKA_LIBS          Kafka jar cache; default $HOME/.cache/outbox-relay/kafka-<version>/libs
#   OUTBOX_KAFKA_HEAP_OPTS     default "-Xms256m -Xmx768m"
#   OUTBOX_KAFKA_CLUSTER_ID    default 5L6g3nShT-eMCtK--X86sw (fresh data dir every start, so a fixed id is fine)
#   OUTBOX_TEST_START_TIMEOUT  seconds to wait for each service to become ready; default 120
#   OUTBOX_KAFKA_SESSION_TIMEOUT_MS  broker.session.timeout.ms; default 9000 (Kafka's). Lower = faster kafka-start
#                              after kafka-kill, but spurious fencing when the machine is overloaded
#   OUTBOX_TEST_TMP            parent of the temp dirs; default /tmp (must be traversable by the postgres user)
#   OUTBOX_TEST_REGISTRY=0     no schema registry; its other knobs (version, Java, heap): test/services-registry.sh
set -euo pipefail

log() { printf '[services %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[services %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2; exit 1; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SELF="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
POM="$SCRIPT_DIR/pom.xml"

RUN_DIR="${OUTBOX_TEST_RUN_DIR:-$REPO_DIR/test/.run}"
case "$RUN_DIR" in /*) ;; *) RUN_DIR="$PWD/$RUN_DIR" ;; esac
ENV_FILE="$RUN_DIR/env"
LOCK_FILE="$RUN_DIR/.env.lock"
KAFKA_LOG="$RUN_DIR/kafka.log"
TMP_PARENT="${OUTBOX_TEST_TMP:-/tmp}"

KAFKA_VERSION="${OUTBOX_KAFKA_VERSION:-$(sed -n 's:.*<kafka\.version>\([^<]*\)</kafka\.version>.*:\1:p' "$POM" | head -n1)}"
[ -n "$KAFKA_VERSION" ] || die "cannot read <kafka.version> from $POM"
[[ "$KAFKA_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
  die "OUTBOX_KAFKA_VERSION must be a Kafka release like 3.9.1 or 4.2.0, not '$KAFKA_VERSION'"
KAFKA_VERSION_ASKED="$KAFKA_VERSION"
USER_HOME="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
KAFKA_LIBS="${OUTBOX_KAFKA_LIBS:-$USER_HOME/.cache/outbox-relay/kafka-$KAFKA_VERSION/libs}"
KAFKA_CLUSTER_ID="${OUTBOX_KAFKA_CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}"
KAFKA_HEAP_OPTS="${OUTBOX_KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"
START_TIMEOUT="${OUTBOX_TEST_START_TIMEOUT:-120}"
KAFKA_SESSION_TIMEOUT_MS="${OUTBOX_KAFKA_SESSION_TIMEOUT_MS:-9000}"
[[ "$KAFKA_SESSION_TIMEOUT_MS" =~ ^[0-9]+$ ]] && (( KAFKA_SESSION_TIMEOUT_MS >= 1000 )) ||
  { echo "OUTBOX_KAFKA_SESSION_TIMEOUT_MS must be an integer >= 1000" >&2; exit 1; }
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
JVM_PERF_OPTS="-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
-XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -XX:+ExitOnOutOfMemoryError \
-Djava.awt.headless=true -Djava.net.preferIPv4Stack=true"

PG_USER=relay
PG_DB=outbox
PG_VERSION="${OUTBOX_TEST_PG_VERSION:-15}"
[[ "$PG_VERSION" =~ ^[0-9]+(\.[0-9]+\.[0-9]+)?$ ]] ||
  die "OUTBOX_TEST_PG_VERSION must be a major (15, 17) or a full zonky version (17.6.0), not '$PG_VERSION'"
IS_ROOT=0; [ "$(id -u)" = 0 ] && IS_ROOT=1

# Libpq variables of the caller must not redirect our psql calls.
unset PGHOST PGHOSTADDR PGPORT PGUSER PGPASSWORD PGDATABASE PGSERVICE PGSERVICEFILE PGOPTIONS PGSSLMODE PGPASSFILE

for v in "$RUN_DIR" "$TMP_PARENT" "$KAFKA_LIBS" "$SELF"; do
  case "$v" in *[[:space:]\'\"\$\`\\]*) die "path with whitespace/quotes is not supported: '$v'" ;; esac
done

# ----------------------------------------------------------------------------------------------- helpers

# alive PID: the process exists and is not a zombie (PID 1 of a container may never reap it)
alive() {
  local pid=${1:-} st
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  st="$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null)" || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# wait_gone SECONDS PID...: 0 once none of the PIDs is alive, 1 on timeout
wait_gone() {
  local secs=$1; shift
  local deadline=$((SECONDS + secs)) p any
  while :; do
    any=0
    for p in "$@"; do alive "$p" && any=1; done
    [ "$any" = 0 ] && return 0
    (( SECONDS >= deadline )) && return 1
    sleep 0.1
  done
}

cmdline_of() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true; }

# is_our_kafka PID DIR: the PID is a live kafka.Kafka JVM started with DIR/server.properties
is_our_kafka() {
  alive "${1:-}" || return 1
  case "$(cmdline_of "$1")" in *kafka.Kafka*"$2/server.properties"*) return 0 ;; esac
  return 1
}

port_open() { timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# port_bindable PORT [reuse]: PORT can be bound on 127.0.0.1. Without "reuse" (picking a fresh port) any socket,
# even one in TIME_WAIT, makes it busy. With "reuse" (restarting on the same port) SO_REUSEADDR is set like the
# JVM and postgres do, so only a live listener makes it busy: a kill -9'd broker leaves its controller port in
# TIME_WAIT for 60s, which does not stop the new JVM from binding it.
port_bindable() {
  if command -v python3 >/dev/null 2>&1; then
    python3 - "$1" "${2:-}" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
if sys.argv[2] == "reuse":
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
    if sys.argv[2] == "reuse":
        s.listen(1)
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
  else
    if port_open "$1"; then return 1; fi
  fi
}

# pick_ports N: N distinct free ports, printed one per line. They are taken from 20000-31999, below the
# kernel's ephemeral range (32768+), so client sockets never grab them between a kill and a restart.
# RESERVED_PORTS: ports already given to a service that may not listen yet (the registry starting meanwhile).
RESERVED_PORTS=""
pick_ports() {
  local n=$1 got=() p tries=0 q dup
  while (( ${#got[@]} < n )); do
    (( tries++ < 500 )) || die "could not find $n free loopback ports"
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    dup=0; for q in "${got[@]}" $RESERVED_PORTS; do [ "$q" = "$p" ] && dup=1; done
    [ "$dup" = 0 ] && port_bindable "$p" && got+=("$p")
  done
  printf '%s\n' "${got[@]}"
}

# wait_port_free SECONDS PORT...: wait until no live socket listens on any PORT (TIME_WAIT is fine)
wait_port_free() {
  local secs=$1; shift
  local deadline=$((SECONDS + secs)) p busy
  while :; do
    busy=""
    for p in "$@"; do port_bindable "$p" reuse || busy="$busy $p"; done
    [ -z "$busy" ] && return 0
    (( SECONDS >= deadline )) && { log "ports still busy:$busy"; return 1; }
    sleep 0.2
  done
}

tail_file() { # tail_file FILE [N]
  local f=$1 n=${2:-60}
  if [ -s "$f" ]; then
    printf -- '----- last %s lines of %s -----\n' "$n" "$f" >&2
    tail -n "$n" "$f" >&2
    printf -- '----- end of %s -----\n' "$f" >&2
  else
    printf -- '----- %s is missing or empty -----\n' "$f" >&2
  fi
}

APT_UPDATED=0
apt_install() {
  [ "$IS_ROOT" = 1 ] || die "missing prerequisite(s) '$*' and not root: install them first"
  command -v apt-get >/dev/null || die "missing prerequisite(s) '$*' and no apt-get"
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
    APT_UPDATED=1
  fi
  log "apt-get install -y $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 \
    || die "apt-get install $* failed"
}

# ----------------------------------------------------------------------------------------------- env file

# write_env [KAFKA_LINES]: writes the whole env file atomically from the current shell variables. KAFKA_LINES
# (start-pg) replaces the Kafka part with the lines of the services the extra PostgreSQL shares.
write_env() {
  mkdir -p "$RUN_DIR"
  local tmp="$ENV_FILE.tmp.$$"
  {
    cat <<EOF
# written by $SELF $(date -u +%Y-%m-%dT%H:%M:%SZ); plain KEY=value lines: set -a; . $ENV_FILE; set +a
OUTBOX_TEST_SERVICES=$SELF
OUTBOX_TEST_RUN_DIR=$RUN_DIR
OUTBOX_TEST_ENV_FILE=$ENV_FILE
OUTBOX_TEST_PG_VERSION=$PG_VERSION
OUTBOX_TEST_PG_MAJOR=$PG_MAJOR
OUTBOX_TEST_PG_SERVER_VERSION_NUM=$PG_VERSION_NUM
OUTBOX_TEST_PG_BUILD=$PG_BUILD
OUTBOX_TEST_PG_URL=postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable
OUTBOX_TEST_PG_HOST=127.0.0.1
OUTBOX_TEST_PG_PORT=$PG_PORT
OUTBOX_TEST_PG_USER=$PG_USER
OUTBOX_TEST_PG_PASSWORD=$PG_PASSWORD
OUTBOX_TEST_PG_DATABASE=$PG_DB
OUTBOX_TEST_PG_DATA=$PG_DATA
OUTBOX_TEST_PG_BINDIR=$PG_BINDIR
OUTBOX_TEST_PG_SOCKET_DIR=$PG_TMP
OUTBOX_TEST_PG_LOG=$PG_LOG
OUTBOX_TEST_PG_PID=$PG_PID
OUTBOX_TEST_PG_TMP=$PG_TMP
EOF
    if [ $# -gt 0 ]; then
      printf '%s\n' "$1"
    else
      cat <<EOF
OUTBOX_TEST_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
OUTBOX_TEST_KAFKA_PORT=$KAFKA_PORT
OUTBOX_TEST_KAFKA_CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT
OUTBOX_TEST_KAFKA_SASL_BROKERS=127.0.0.1:$KAFKA_SASL_PORT
OUTBOX_TEST_KAFKA_SASL_PORT=$KAFKA_SASL_PORT
OUTBOX_TEST_KAFKA_SASL_USER=relay
OUTBOX_TEST_KAFKA_SASL_PASSWORD=$KAFKA_SASL_PASSWORD
OUTBOX_TEST_KAFKA_SASL_MECHANISMS=SCRAM-SHA-512,PLAIN,OAUTHBEARER
OUTBOX_TEST_KAFKA_TLS_BROKERS=127.0.0.1:$KAFKA_TLS_PORT
OUTBOX_TEST_KAFKA_TLS_PORT=$KAFKA_TLS_PORT
OUTBOX_TEST_KAFKA_TLS_CA_FILE=$KAFKA_DIR/tls/ca.pem
OUTBOX_TEST_KAFKA_PROXY_PORT=$KAFKA_PROXY_PORT
OUTBOX_TEST_KAFKA_PROXY_TARGET=127.0.0.1:$KAFKA_PROXIED_PORT
OUTBOX_TEST_KAFKA_PID=$KAFKA_PID
OUTBOX_TEST_KAFKA_DIR=$KAFKA_DIR
OUTBOX_TEST_KAFKA_LOG=$KAFKA_LOG
OUTBOX_TEST_KAFKA_LIBS=$KAFKA_LIBS
OUTBOX_TEST_KAFKA_VERSION=$KAFKA_VERSION
EOF
      registry_env_lines
    fi
  } >"$tmp"
  mv -f "$tmp" "$ENV_FILE"
}

# set_env KEY VALUE [FILE]: replace one line of an env file (default ours), under a lock (fault tests may call us
# concurrently)
set_env() {
  local key=$1 val=$2 file=${3:-$ENV_FILE}
  (
    flock -w 30 9 || die "cannot lock $(dirname "$file")/.env.lock"
    [ -f "$file" ] || die "$file vanished"
    local tmp="$file.tmp.$$"
    if grep -q "^$key=" "$file"; then
      sed "s|^$key=.*|$key=$val|" "$file" >"$tmp"
    else
      { cat "$file"; echo "$key=$val"; } >"$tmp"
    fi
    mv -f "$tmp" "$file"
  ) 9>"$(dirname "$file")/.env.lock"
}

# extra_env_files: the env files of the extra PostgreSQL servers (start-pg) of this run dir
extra_env_files() { compgen -G "$RUN_DIR/pg-*/env" || true; }

# set_kafka_pid PID: record the broker's pid in our env file and in every extra PostgreSQL's env file
set_kafka_pid() {
  local f
  set_env OUTBOX_TEST_KAFKA_PID "$1"
  for f in $(extra_env_files); do set_env OUTBOX_TEST_KAFKA_PID "$1" "$f"; done
}

load_env() { # load_env: 0 if the env file exists (variables loaded into our own names), 1 otherwise
  [ -f "$ENV_FILE" ] || return 1
  local k v
  while IFS='=' read -r k v; do
    case "$k" in
      OUTBOX_TEST_PG_PORT) PG_PORT=$v ;;
      OUTBOX_TEST_PG_PASSWORD) PG_PASSWORD=$v ;;
      OUTBOX_TEST_PG_DATA) PG_DATA=$v ;;
      OUTBOX_TEST_PG_BINDIR) PG_BINDIR=$v ;;
      OUTBOX_TEST_PG_LOG) PG_LOG=$v ;;
      OUTBOX_TEST_PG_PID) PG_PID=$v ;;
      OUTBOX_TEST_PG_TMP) PG_TMP=$v ;;
      OUTBOX_TEST_KAFKA_PORT) KAFKA_PORT=$v ;;
      OUTBOX_TEST_KAFKA_CONTROLLER_PORT) KAFKA_CONTROLLER_PORT=$v ;;
      OUTBOX_TEST_KAFKA_SASL_PORT) KAFKA_SASL_PORT=$v ;;
      OUTBOX_TEST_KAFKA_TLS_PORT) KAFKA_TLS_PORT=$v ;;
      OUTBOX_TEST_KAFKA_PROXY_PORT) KAFKA_PROXY_PORT=$v ;;
      OUTBOX_TEST_KAFKA_PROXY_TARGET) KAFKA_PROXIED_PORT=${v##*:} ;;
      OUTBOX_TEST_KAFKA_SASL_PASSWORD) KAFKA_SASL_PASSWORD=$v ;;
      OUTBOX_TEST_KAFKA_PID) KAFKA_PID=$v ;;
      OUTBOX_TEST_KAFKA_DIR) KAFKA_DIR=$v ;;
      OUTBOX_TEST_KAFKA_LIBS) KAFKA_LIBS=$v ;;
      OUTBOX_TEST_KAFKA_VERSION) KAFKA_VERSION=$v ;; # kafka-start restarts the release that was started
      OUTBOX_TEST_KAFKA_RUN_DIR) KAFKA_RUN_DIR=$v ;;
      OUTBOX_TEST_PG_BUILD) PG_BUILD=$v ;;
      OUTBOX_TEST_SCHEMA_REGISTRY_*) registry_load_var "$k" "$v" ;;
    esac
  done <"$ENV_FILE"
  return 0
}

PG_PORT="" PG_PASSWORD="" PG_DATA="" PG_BINDIR="" PG_LOG="" PG_PID="" PG_TMP=""
KAFKA_PORT="" KAFKA_CONTROLLER_PORT="" KAFKA_PID="" KAFKA_DIR=""
KAFKA_SASL_PORT="" KAFKA_SASL_PASSWORD="" KAFKA_TLS_PORT="" KAFKA_PROXIED_PORT="" KAFKA_PROXY_PORT=""
# KAFKA_RUN_DIR: set (OUTBOX_TEST_KAFKA_RUN_DIR) in the env file of an extra PostgreSQL (start-pg): the run dir
# whose services own the broker; kafka-* commands act there
KAFKA_RUN_DIR=""
PG_MAJOR="" PG_VERSION_NUM="" PG_BUILD=""
KEYTOOL="${JAVA_HOME:+$JAVA_HOME/bin/}keytool"

pg_url() { echo "postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"; }

# ----------------------------------------------------------------------------------------------- PostgreSQL

pg_bindir_ok() { [ -n "${1:-}" ] && [ -x "$1/postgres" ] && [ -x "$1/initdb" ] && [ -x "$1/pg_ctl" ]; }

find_pg_bindir() {
  local d=""
  if command -v pg_config >/dev/null 2>&1; then d="$(pg_config --bindir 2>/dev/null || true)"; fi
  if pg_bindir_ok "$d"; then echo "$d"; return 0; fi
  d=/usr/lib/postgresql/15/bin
  if pg_bindir_ok "$d"; then echo "$d"; return 0; fi
  return 1
}

psql_bin() { # the server's psql, else Debian's 15 (the builds of test/pg-fetch.sh have none), else any psql
  if [ -x "$PG_BINDIR/psql" ]; then echo "$PG_BINDIR/psql"
  elif [ -x /usr/lib/postgresql/15/bin/psql ]; then echo /usr/lib/postgresql/15/bin/psql
  else command -v psql; fi
}

# as_pg CMD...: run as the postgres OS user when we are root (postgres refuses to run as root)
as_pg() {
  if [ "$IS_ROOT" = 1 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

ensure_pg_prereqs() {
  PG_MAJOR="${PG_VERSION%%.*}"
  if [ "$PG_VERSION" = 15 ]; then
    if ! PG_BINDIR="$(find_pg_bindir)"; then
      log "PostgreSQL server binaries not found: installing postgresql-15"
      apt_install postgresql-15
      PG_BINDIR="$(find_pg_bindir)" || die "postgresql-15 installed but no postgres/initdb/pg_ctl found"
    fi
    PG_BUILD="debian:$("$PG_BINDIR/postgres" --version | awk "{print \$3}")"
  fi
  if [ "$IS_ROOT" = 1 ]; then
    if ! id -u postgres >/dev/null 2>&1; then
      log "creating system user postgres"
      useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres \
        || die "cannot create the postgres system user"
    fi
    command -v runuser >/dev/null || die "runuser (util-linux) is required when running as root"
  fi
  if [ "$PG_VERSION" != 15 ]; then
    # a server build from Maven Central (test/pg-fetch.sh): no client programs, Debian's 15 client serves
    PG_BINDIR="$(bash "$SCRIPT_DIR/pg-fetch.sh" "$PG_VERSION")" || die "test/pg-fetch.sh $PG_VERSION failed"
    PG_BUILD="zonky:$(cut -d' ' -f1 "$PG_BINDIR/../.complete" | sed 's/.*://')"
  fi
  [ -n "$(psql_bin)" ] || apt_install postgresql-client-15
}

pg_postmaster_pid() { [ -r "$PG_DATA/postmaster.pid" ] && head -n1 "$PG_DATA/postmaster.pid" | tr -d '[:space:]'; }

# pg_wait_ready: the relay role can log in over TCP with its password, for normal AND replication connections
pg_wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT)) psql url err=""
  psql="$(psql_bin)"; url="$(pg_url)"
  while (( SECONDS < deadline )); do
    if PGCONNECT_TIMEOUT=3 "$psql" -X -Atq "$url" -c 'select 1' >/dev/null 2>"$RUN_DIR/.pg_probe.err" &&
       PGCONNECT_TIMEOUT=3 "$psql" -X -Atq "$url&replication=database" -c 'IDENTIFY_SYSTEM' >/dev/null 2>>"$RUN_DIR/.pg_probe.err"; then
      rm -f "$RUN_DIR/.pg_probe.err"
      return 0
    fi
    sleep 0.2
  done
  err="$(cat "$RUN_DIR/.pg_probe.err" 2>/dev/null || true)"
  rm -f "$RUN_DIR/.pg_probe.err"
  log "postgres not ready after ${START_TIMEOUT}s: $err"
  return 1
}

pg_start_server() { # start an initialised data dir; sets PG_PID
  if ! as_pg "$PG_BINDIR/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t "$START_TIMEOUT" start >"$RUN_DIR/.pg_ctl.out" 2>&1; then
    cat "$RUN_DIR/.pg_ctl.out" >&2
    tail_file "$PG_LOG"
    return 1
  fi
  PG_PID="$(pg_postmaster_pid)"
  alive "$PG_PID" || { log "postmaster not running after pg_ctl start"; tail_file "$PG_LOG"; return 1; }
}

# pg_stop_server MODE: pg_ctl stop -m MODE; escalates to immediate, then SIGKILL; waits until every process is gone
pg_stop_server() {
  local mode=$1 pm kids=""
  [ -n "$PG_DATA" ] && [ -d "$PG_DATA" ] || return 0
  pm="$(pg_postmaster_pid || true)"
  [ -n "$pm" ] || pm="$PG_PID"
  if alive "$pm"; then
    kids="$(pgrep -P "$pm" 2>/dev/null | tr '\n' ' ' || true)"
    kill -CONT "$pm" 2>/dev/null || true
    if ! as_pg "$PG_BINDIR/pg_ctl" -D "$PG_DATA" -m "$mode" -w -t 60 stop >&2; then
      log "pg_ctl stop -m $mode failed: trying -m immediate"
      as_pg "$PG_BINDIR/pg_ctl" -D "$PG_DATA" -m immediate -w -t 30 stop >&2 || true
    fi
    if ! wait_gone 30 "$pm"; then
      log "postmaster $pm still alive: SIGKILL"
      kill -KILL "$pm" 2>/dev/null || true
    fi
    # shellcheck disable=SC2086
    wait_gone 30 "$pm" $kids || die "postgres processes still alive: $pm $kids"
  fi
}

pg_setup() { # fresh cluster; sets PG_* and starts it
  local attempt ctl
  PG_TMP="$(mktemp -d "$TMP_PARENT/outbox-pg.XXXXXX")"
  PG_DATA="$PG_TMP/data"
  PG_LOG="$PG_TMP/postgres.log"
  PG_PASSWORD="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
  chmod 0700 "$PG_TMP"
  printf '%s\n' "$PG_PASSWORD" >"$PG_TMP/pwfile"
  : >"$PG_LOG"
  [ "$IS_ROOT" = 1 ] && chown -R postgres: "$PG_TMP"

  if ! as_pg "$PG_BINDIR/initdb" -D "$PG_DATA" -U postgres --pwfile="$PG_TMP/pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync >"$PG_TMP/initdb.log" 2>&1; then
    tail_file "$PG_TMP/initdb.log"
    die "initdb failed"
  fi
  rm -f "$PG_TMP/pwfile"

  # explicit pg_hba: trust only on our private unix socket; scram-sha-256 over TCP for normal + replication
  cat >"$PG_DATA/pg_hba.conf" <<'EOF'
# TYPE  DATABASE     USER  ADDRESS        METHOD
local   all          all                  trust
local   replication  all                  trust
host    all          all   127.0.0.1/32   scram-sha-256
host    replication  all   127.0.0.1/32   scram-sha-256
EOF

  for attempt in 1 2 3; do
    PG_PORT="$(pick_ports 1)"
    ctl="$PG_DATA/conf.d-outbox.conf"
    cat >"$ctl" <<EOF
# throwaway test cluster (test/services.sh)
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_TMP'
password_encryption = 'scram-sha-256'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
max_connections = 200
wal_sender_timeout = 60s
fsync = off
# on: a commit the test saw must survive pg-restart immediate (off loses the last ~200ms of commits)
synchronous_commit = on
full_page_writes = off
shared_buffers = 128MB
log_min_messages = warning
logging_collector = off
EOF
    grep -q "^include_if_exists = 'conf.d-outbox.conf'" "$PG_DATA/postgresql.conf" ||
      echo "include_if_exists = 'conf.d-outbox.conf'" >>"$PG_DATA/postgresql.conf"
    [ "$IS_ROOT" = 1 ] && chown postgres: "$ctl" "$PG_DATA/pg_hba.conf"
    if pg_start_server; then break; fi
    if grep -q 'could not bind\|could not create listen socket\|Address already in use' "$PG_LOG" && (( attempt < 3 )); then
      log "postgres port $PG_PORT was taken; retrying on another port"
      continue
    fi
    die "postgres did not start (data dir $PG_DATA)"
  done

  # role + database over the private unix socket (trust)
  if ! "$(psql_bin)" -X -q -v ON_ERROR_STOP=1 -h "$PG_TMP" -p "$PG_PORT" -U postgres -d postgres \
        -c "CREATE ROLE $PG_USER WITH LOGIN SUPERUSER REPLICATION PASSWORD '$PG_PASSWORD'" \
        -c "CREATE DATABASE $PG_DB OWNER $PG_USER" >&2; then
    tail_file "$PG_LOG"
    die "could not create role/database"
  fi
  # the server's version, and proof that it finds pgoutput (pkglibdir) before any test relies on it
  if ! PG_VERSION_NUM="$("$(psql_bin)" -X -Atq -v ON_ERROR_STOP=1 -h "$PG_TMP" -p "$PG_PORT" -U postgres -d "$PG_DB" \
        -c "SELECT current_setting('server_version_num')" \
        -c "SELECT 'pgoutput ok' FROM pg_create_logical_replication_slot('services_probe', 'pgoutput', true)" 2>&1)"; then
    tail_file "$PG_LOG"
    die "postgres $PG_VERSION ($PG_BINDIR) cannot create a pgoutput slot: $PG_VERSION_NUM"
  fi
  PG_VERSION_NUM="$(head -n1 <<<"$PG_VERSION_NUM")"
  [ "$((PG_VERSION_NUM / 10000))" = "$PG_MAJOR" ] ||
    die "asked for PostgreSQL $PG_VERSION but $PG_BINDIR/postgres is server_version_num $PG_VERSION_NUM"
  pg_wait_ready || { tail_file "$PG_LOG"; die "postgres is not reachable over TCP with the relay password"; }
  log "postgres $PG_VERSION ready ($PG_BUILD, server_version_num $PG_VERSION_NUM): pid $PG_PID, 127.0.0.1:$PG_PORT, data $PG_DATA"
}

# ----------------------------------------------------------------------------------------------- Kafka

ensure_java_mvn() {
  local need=()
  command -v "$JAVA" >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || need+=(maven)
  [ ${#need[@]} = 0 ] || apt_install "${need[@]}"
  local jv
  jv="$("$JAVA" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.specification\.version = //p')"
  case "$jv" in 1.*|9|1[0-6]) die "Kafka $KAFKA_VERSION needs Java 17+, found java.specification.version=$jv" ;; esac
}

# kafka_logging: how the cached release logs, from its jars: reload4j (Kafka 3.x: log4j 1.x API, slf4j-reload4j)
# or log4j2 (Kafka 4.x: log4j-core with log4j-slf4j-impl or log4j-slf4j2-impl); empty if no binding is cached
kafka_logging() {
  if compgen -G "$KAFKA_LIBS/slf4j-reload4j-*.jar" >/dev/null; then echo reload4j
  elif compgen -G "$KAFKA_LIBS/log4j-slf4j*-impl-*.jar" >/dev/null; then echo log4j2
  fi
}

libs_ok() {
  [ -f "$KAFKA_LIBS/.resolved" ] && [ -f "$KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar" ] && [ -n "$(kafka_logging)" ]
}

# jar_version DIR ARTIFACT: the version of DIR/ARTIFACT-<version>.jar (one only), empty if none
jar_version() {
  local f
  f="$(compgen -G "$1/$2-[0-9]*.jar" | head -n1)" || return 0
  f="${f##*/$2-}"
  echo "${f%.jar}"
}

# kafka_mvn LOG ARGS...: mvn on test/pom.xml with kafka.version; on failure shows the log and returns 1
kafka_mvn() {
  local logf=$1; shift
  if ! mvn -B -q -Dstyle.color=never -f "$POM" -Dkafka.version="$KAFKA_VERSION" "$@" \
        dependency:copy-dependencies >"$logf" 2>&1; then
    tail_file "$logf" 80
    return 1
  fi
}

# ensure_kafka_libs: the release's jars and the SLF4J binding that matches them, resolved once into KAFKA_LIBS.
# Pass 1 copies kafka_2.13 and what it pulls (no binding profile); the slf4j-api and log4j-core versions found
# there choose pass 2's profile of test/pom.xml: reload4j when the release has no log4j-core (3.x), else
# log4j2-slf4j1 or log4j2-slf4j2 by slf4j-api's major, pinned to that log4j-core.
ensure_kafka_libs() {
  if libs_ok; then
    log "Kafka $KAFKA_VERSION jars cached in $KAFKA_LIBS ($(kafka_logging) logging)"
    return 0
  fi
  local partial="$KAFKA_LIBS.partial.$$" t0=$SECONDS slf4j log4j2 profile
  log "resolving Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIBS (mvn dependency:copy-dependencies)"
  mkdir -p "$(dirname "$KAFKA_LIBS")"
  rm -rf "$partial"
  kafka_mvn "$RUN_DIR/mvn.log" -P '!log4j2-slf4j1' -Dlibs.dir="$partial" ||
    { rm -rf "$partial"; die "maven could not resolve kafka_2.13 $KAFKA_VERSION (log: $RUN_DIR/mvn.log)"; }
  [ -f "$partial/kafka_2.13-$KAFKA_VERSION.jar" ] || { rm -rf "$partial"; die "maven ran but kafka_2.13-$KAFKA_VERSION.jar is missing"; }
  slf4j="$(jar_version "$partial" slf4j-api)"
  log4j2="$(jar_version "$partial" log4j-core)"
  [ -n "$slf4j" ] || { rm -rf "$partial"; die "kafka_2.13 $KAFKA_VERSION pulls no slf4j-api: cannot choose its logging binding"; }
  if [ -z "$log4j2" ]; then profile=reload4j
  elif [ "${slf4j%%.*}" -ge 2 ]; then profile=log4j2-slf4j2
  else profile=log4j2-slf4j1
  fi
  log "kafka_2.13 $KAFKA_VERSION pulls slf4j-api $slf4j${log4j2:+ and log4j-core $log4j2}: adding profile $profile"
  kafka_mvn "$RUN_DIR/mvn.log" -P "$profile" -Dslf4j.version="$slf4j" ${log4j2:+-Dlog4j2.version="$log4j2"} \
      -Dlibs.dir="$partial" ||
    { rm -rf "$partial"; die "maven could not resolve the $profile logging jars for Kafka $KAFKA_VERSION (log: $RUN_DIR/mvn.log)"; }
  if [ -e "$KAFKA_LIBS" ]; then
    cp -a "$partial/." "$KAFKA_LIBS/"
    rm -rf "$partial"
  else
    mv -T "$partial" "$KAFKA_LIBS" 2>/dev/null || { cp -a "$partial/." "$KAFKA_LIBS/"; rm -rf "$partial"; }
  fi
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) kafka_2.13 $KAFKA_VERSION profile $profile slf4j-api $slf4j${log4j2:+ log4j $log4j2}" \
    >"$KAFKA_LIBS/.resolved"
  libs_ok || die "Kafka jars incomplete in $KAFKA_LIBS"
  log "resolved $(ls "$KAFKA_LIBS"/*.jar | wc -l) jars ($(du -sh "$KAFKA_LIBS" | cut -f1)) in $((SECONDS - t0))s"
}

kafka_write_configs() {
  cat >"$KAFKA_DIR/server.properties" <<EOF
# single-node KRaft (combined broker+controller) for tests; written by test/services.sh
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_TLS_PORT,PROXIED://127.0.0.1:$KAFKA_PROXIED_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_TLS_PORT,PROXIED://127.0.0.1:$KAFKA_PROXY_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,PROXIED:PLAINTEXT
# PROXIED binds KAFKA_PROXIED_PORT but advertises KAFKA_PROXY_PORT, where a test's TCP proxy listens and forwards
# to it: clients bootstrapping through the proxy keep going through it (network fault tests, test/chaos).
# A TLS listener for the relay's TLS tests: a self-signed certificate for 127.0.0.1 made by keytool
# (kafka_make_cert); its PEM export is the CA file the client trusts.
ssl.keystore.location=$KAFKA_DIR/tls/broker.p12
ssl.keystore.type=PKCS12
ssl.keystore.password=$KAFKA_DIR_STOREPASS
ssl.key.password=$KAFKA_DIR_STOREPASS
ssl.client.auth=none
# A second, authenticated listener for the relay's SASL tests: SCRAM-SHA-512 users come from
# StorageTool format --add-scram, PLAIN users from the JAAS line below. OAUTHBEARER uses Kafka's
# default server handler, the unsecured JWT validator (alg none, sub and exp claims): enough for the
# handshake and expiry; its sessions last at most 10 s, so a relay must re-authenticate (KIP-368).
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN,OAUTHBEARER
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_relay="$KAFKA_SASL_PASSWORD";
listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;
listener.name.sasl_plaintext.oauthbearer.connections.max.reauth.ms=10000
log.dirs=$KAFKA_DIR/kraft-combined-logs
auto.create.topics.enable=true
num.partitions=4
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
# After kill -9 the restarted controller keeps the dead incarnation's registration until this session timeout
# expires and rejects the new broker with DUPLICATE_BROKER_REGISTRATION meanwhile, so kafka-start after
# kafka-kill takes ~this long more than a cold start. Shorter values were tried (4 s): on a loaded 2-core machine
# the controller then timed heartbeats out and fenced the live broker. A SIGSTOP pause longer than this gets the
# broker fenced (then unfenced) right after SIGCONT.
broker.session.timeout.ms=$KAFKA_SESSION_TIMEOUT_MS
broker.heartbeat.interval.ms=$(( KAFKA_SESSION_TIMEOUT_MS / 4 < 2000 ? KAFKA_SESSION_TIMEOUT_MS / 4 : 2000 ))
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
EOF
  cat >"$KAFKA_DIR/log4j2-server.properties" <<'EOF'
appender.console.type = Console
appender.console.name = STDOUT
appender.console.target = SYSTEM_OUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
  cat >"$KAFKA_DIR/log4j2-tools.properties" <<'EOF'
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF
  # the same two for Kafka 3.x, which logs through reload4j (log4j 1.x syntax)
  cat >"$KAFKA_DIR/log4j-server.properties" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
EOF
  cat >"$KAFKA_DIR/log4j-tools.properties" <<'EOF'
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
}

# kafka_log_opt server|tools: the JVM option that points the cached release's logging at our config
kafka_log_opt() {
  case "$(kafka_logging)" in
    reload4j) echo "-Dlog4j.configuration=file:$KAFKA_DIR/log4j-$1.properties" ;;
    *) echo "-Dlog4j2.configurationFile=$KAFKA_DIR/log4j2-$1.properties" ;;
  esac
}

KAFKA_DIR_STOREPASS=outbox-test-store
# kafka_make_cert: self-signed certificate for 127.0.0.1 in a PKCS12 keystore, plus its PEM (the CA file)
kafka_make_cert() {
  mkdir -p "$KAFKA_DIR/tls"
  if ! { "$KEYTOOL" -genkeypair -alias broker -keyalg RSA -keysize 2048 -validity 30 -dname CN=127.0.0.1 \
           -ext SAN=ip:127.0.0.1,dns:localhost -storetype PKCS12 -keystore "$KAFKA_DIR/tls/broker.p12" \
           -storepass "$KAFKA_DIR_STOREPASS" -keypass "$KAFKA_DIR_STOREPASS" &&
         "$KEYTOOL" -exportcert -rfc -alias broker -keystore "$KAFKA_DIR/tls/broker.p12" \
           -storepass "$KAFKA_DIR_STOREPASS" -file "$KAFKA_DIR/tls/ca.pem"; } >"$KAFKA_DIR/keytool.log" 2>&1; then
    tail_file "$KAFKA_DIR/keytool.log"
    return 1
  fi
}

kafka_format() {
  if ! "$JAVA" -Xmx256m "$(kafka_log_opt tools)" -cp "$KAFKA_LIBS/*" \
       kafka.tools.StorageTool format --standalone -t "$KAFKA_CLUSTER_ID" -c "$KAFKA_DIR/server.properties" \
       --add-scram "SCRAM-SHA-512=[name=relay,password=$KAFKA_SASL_PASSWORD]" \
       >"$KAFKA_DIR/format.log" 2>&1; then
    tail_file "$KAFKA_DIR/format.log"
    return 1
  fi
}

# kafka_launch: start the JVM in the background of THIS shell (never inside $(...)) and record its real PID
kafka_launch() {
  {
    echo
    echo "===== $(date -u +%Y-%m-%dT%H:%M:%SZ) test/services.sh: starting kafka.Kafka on 127.0.0.1:$KAFKA_PORT ====="
  } >>"$KAFKA_LOG"
  # shellcheck disable=SC2086
  nohup "$JAVA" $KAFKA_HEAP_OPTS $JVM_PERF_OPTS \
    "$(kafka_log_opt server)" -Dkafka.logs.dir="$KAFKA_DIR" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_DIR/server.properties" \
    >>"$KAFKA_LOG" 2>&1 </dev/null &
  KAFKA_PID=$!
}

# kafka_wait_ready: the PLAINTEXT port accepts TCP (it opens only after the broker is unfenced), and the JVM is
# still alive one second later
kafka_wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT))
  while (( SECONDS < deadline )); do
    if ! alive "$KAFKA_PID"; then
      log "kafka (pid $KAFKA_PID) exited during startup"
      return 1
    fi
    if port_open "$KAFKA_PORT"; then
      sleep 1
      if alive "$KAFKA_PID" && port_open "$KAFKA_PORT"; then
        grep -q 'Kafka Server started' "$KAFKA_LOG" ||
          log "WARNING: no 'Kafka Server started' line in $KAFKA_LOG (is the log4j SLF4J binding on the classpath?)"
        return 0
      fi
      log "kafka (pid $KAFKA_PID) died right after opening its port"
      return 1
    fi
    sleep 0.2
  done
  log "kafka not ready after ${START_TIMEOUT}s"
  return 1
}

# kafka_kill_pid PID: SIGKILL and wait until gone (bounded)
kafka_kill_pid() {
  local pid=$1
  alive "$pid" || return 0
  kill -KILL "$pid" 2>/dev/null || true
  wait_gone 30 "$pid" || die "kafka pid $pid survived SIGKILL for 30s"
}

kafka_stop_pid() { # SIGTERM (controlled shutdown), SIGKILL after 30s
  local pid=$1
  alive "$pid" || return 0
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone 30 "$pid"; then
    log "kafka pid $pid ignored SIGTERM for 30s: SIGKILL"
    kafka_kill_pid "$pid"
  fi
}

kafka_setup() { # fresh data dir, format, start, wait; sets KAFKA_*
  local attempt ports
  : >"$KAFKA_LOG"
  for attempt in 1 2 3; do
    KAFKA_DIR="$(mktemp -d "$TMP_PARENT/outbox-kafka.XXXXXX")"
    ports="$(pick_ports 6)"
    KAFKA_PORT="$(sed -n 1p <<<"$ports")"
    KAFKA_CONTROLLER_PORT="$(sed -n 2p <<<"$ports")"
    KAFKA_SASL_PORT="$(sed -n 3p <<<"$ports")"
    KAFKA_TLS_PORT="$(sed -n 4p <<<"$ports")"
    KAFKA_PROXIED_PORT="$(sed -n 5p <<<"$ports")"
    KAFKA_PROXY_PORT="$(sed -n 6p <<<"$ports")"
    KAFKA_SASL_PASSWORD="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
    kafka_write_configs
    kafka_make_cert || { rm -rf "$KAFKA_DIR"; KAFKA_DIR=""; die "keytool could not make the broker's TLS certificate"; }
    kafka_format || { rm -rf "$KAFKA_DIR"; KAFKA_DIR=""; die "kafka StorageTool format failed"; }
    kafka_launch
    if kafka_wait_ready; then
      log "kafka ready: pid $KAFKA_PID, brokers 127.0.0.1:$KAFKA_PORT (controller $KAFKA_CONTROLLER_PORT), data $KAFKA_DIR"
      return 0
    fi
    kafka_kill_pid "$KAFKA_PID"
    KAFKA_PID=""
    if tail -n 200 "$KAFKA_LOG" | grep -q 'Address already in use' && (( attempt < 3 )); then
      log "kafka ports $KAFKA_PORT/$KAFKA_CONTROLLER_PORT were taken; retrying on other ports"
      rm -rf "$KAFKA_DIR"; KAFKA_DIR=""
      continue
    fi
    tail_file "$KAFKA_LOG" 80
    die "kafka did not start (log: $KAFKA_LOG)"
  done
}

# ----------------------------------------------------------------------------------------------- commands

START_OK=0
on_start_exit() {
  local rc=$?
  [ "$START_OK" = 1 ] && return 0
  log "start FAILED (exit $rc): tearing down what was started"
  [ -n "$PG_LOG" ] && tail_file "$PG_LOG" 40
  [ -s "$KAFKA_LOG" ] && tail_file "$KAFKA_LOG" 60
  [ -n "$REGISTRY_PID" ] && [ -s "$REGISTRY_LOG" ] && tail_file "$REGISTRY_LOG" 40
  [ -n "$KAFKA_PID" ] && { kill -KILL "$KAFKA_PID" 2>/dev/null || true; wait_gone 30 "$KAFKA_PID" || true; }
  [ -n "$REGISTRY_PID" ] && { kill -KILL "$REGISTRY_PID" 2>/dev/null || true; wait_gone 30 "$REGISTRY_PID" || true; }
  case "$REGISTRY_DIR" in */outbox-registry.*) rm -rf "$REGISTRY_DIR" ;; esac
  if [ -n "$PG_DATA" ] && [ -d "$PG_DATA" ]; then (pg_stop_server immediate) || true; fi
  [ -n "$PG_LOG" ] && [ -f "$PG_LOG" ] && cp -f "$PG_LOG" "$RUN_DIR/postgres.log" 2>/dev/null || true
  [ -n "$PG_TMP" ] && rm -rf "$PG_TMP"
  [ -n "$KAFKA_DIR" ] && rm -rf "$KAFKA_DIR"
  rm -f "$ENV_FILE"
  [ "$rc" = 0 ] && rc=1
  exit "$rc"
}

cmd_start() {
  mkdir -p "$RUN_DIR"
  if [ -f "$ENV_FILE" ]; then
    if (load_env && { alive "$KAFKA_PID" || alive "$(PG_DATA=$PG_DATA pg_postmaster_pid || true)" || is_our_registry "$REGISTRY_PID"; }); then
      die "services from $ENV_FILE are still running: run '$SELF stop' first"
    fi
    log "stale $ENV_FILE found (services dead): cleaning it up"
    cmd_stop
    PG_PORT="" PG_PASSWORD="" PG_DATA="" PG_BINDIR="" PG_LOG="" PG_PID="" PG_TMP=""
    KAFKA_PORT="" KAFKA_CONTROLLER_PORT="" KAFKA_PID="" KAFKA_DIR=""
    REGISTRY_PORT="" REGISTRY_PID="" REGISTRY_DIR=""
    KAFKA_VERSION="$KAFKA_VERSION_ASKED"
    KAFKA_LIBS="${OUTBOX_KAFKA_LIBS:-$USER_HOME/.cache/outbox-relay/kafka-$KAFKA_VERSION/libs}"
  fi
  local t0=$SECONDS
  trap on_start_exit EXIT
  ensure_pg_prereqs
  ensure_java_mvn
  ensure_kafka_libs
  registry_begin # launched now, waited for after Kafka: its JVM starts while PostgreSQL and Kafka do
  pg_setup
  kafka_setup
  registry_finish
  write_env
  START_OK=1
  trap - EXIT
  log "services ready in $((SECONDS - t0))s; env file: $ENV_FILE"
  cat "$ENV_FILE"
}

cmd_stop() {
  local f
  for f in $(extra_env_files); do
    OUTBOX_TEST_RUN_DIR="$(dirname "$f")" bash "$SELF" stop || log "could not stop the extra PostgreSQL of $f"
  done
  if ! load_env; then
    log "not running (no $ENV_FILE)"
    return 0
  fi
  cmd_cluster_stop
  if [ -n "$KAFKA_RUN_DIR" ] && [ "$KAFKA_RUN_DIR" != "$RUN_DIR" ]; then
    : # an extra PostgreSQL (start-pg): the broker belongs to the services of $KAFKA_RUN_DIR
  elif [ -n "$KAFKA_PID" ] && alive "$KAFKA_PID"; then
    if is_our_kafka "$KAFKA_PID" "$KAFKA_DIR"; then
      log "stopping kafka pid $KAFKA_PID"
      kafka_stop_pid "$KAFKA_PID"
    else
      log "pid $KAFKA_PID is not our kafka any more: not touching it"
    fi
  fi
  if [ -n "$PG_DATA" ] && [ -d "$PG_DATA" ]; then
    log "stopping postgres (pg_ctl stop -m fast)"
    pg_stop_server fast
  fi
  [ -n "$PG_LOG" ] && [ -f "$PG_LOG" ] && cp -f "$PG_LOG" "$RUN_DIR/postgres.log" 2>/dev/null || true
  case "$PG_TMP" in */outbox-pg.*) rm -rf "$PG_TMP" ;; esac
  if [ -z "$KAFKA_RUN_DIR" ] || [ "$KAFKA_RUN_DIR" = "$RUN_DIR" ]; then
    case "$KAFKA_DIR" in */outbox-kafka.*) rm -rf "$KAFKA_DIR" ;; esac
    registry_teardown # the registry, like the broker, belongs to the main run dir
  fi
  rm -f "$ENV_FILE" "$LOCK_FILE"
  log "stopped"
}

require_env() { load_env || die "no $ENV_FILE: run '$SELF start' first"; }

# kafka_elsewhere CMD...: in the run dir of an extra PostgreSQL (start-pg) the broker belongs to the main services:
# run the kafka-* command there (it records the new pid in our env file too) and return 0; 1 in the main run dir
kafka_elsewhere() {
  [ -n "$KAFKA_RUN_DIR" ] && [ "$KAFKA_RUN_DIR" != "$RUN_DIR" ] || return 1
  OUTBOX_TEST_RUN_DIR="$KAFKA_RUN_DIR" bash "$SELF" "$@"
}

# start-pg VERSION: an extra PostgreSQL beside the running services, in the run dir <run dir>/pg-VERSION
cmd_start_pg() {
  local v=${1:-} dir
  [[ "$v" =~ ^[0-9]+(\.[0-9]+\.[0-9]+)?$ ]] || die "start-pg needs a VERSION: a major (17) or a zonky version (17.6.0)"
  require_env
  [ -z "$KAFKA_RUN_DIR" ] || [ "$KAFKA_RUN_DIR" = "$RUN_DIR" ] ||
    die "$RUN_DIR is an extra PostgreSQL's run dir: run start-pg with the main run dir ($KAFKA_RUN_DIR)"
  is_our_kafka "$KAFKA_PID" "$KAFKA_DIR" || die "the services of $ENV_FILE have no running broker: restart them first"
  dir="$RUN_DIR/pg-$v"
  OUTBOX_TEST_RUN_DIR="$dir" OUTBOX_TEST_PG_VERSION="$v" bash "$SELF" _start-extra-pg "$ENV_FILE"
}

# _start-extra-pg MAIN_ENV_FILE (internal, run by start-pg with the extra run dir): start PostgreSQL only and
# write an env file that takes the broker from MAIN_ENV_FILE
cmd_start_extra_pg() {
  local main_env=$1 kafka_lines
  mkdir -p "$RUN_DIR"
  if [ -f "$ENV_FILE" ]; then
    if (load_env && alive "$(PG_DATA=$PG_DATA pg_postmaster_pid || true)"); then
      die "PostgreSQL $PG_VERSION from $ENV_FILE is still running: run '$SELF stop-pg $PG_VERSION' first"
    fi
    cmd_stop
    # the stale file named the shared broker: forget it, so a failed start (on_start_exit) never touches it
    PG_PORT="" PG_PASSWORD="" PG_DATA="" PG_BINDIR="" PG_LOG="" PG_PID="" PG_TMP="" KAFKA_RUN_DIR="" PG_BUILD=""
    KAFKA_PORT="" KAFKA_CONTROLLER_PORT="" KAFKA_PID="" KAFKA_DIR=""
    REGISTRY_PORT="" REGISTRY_PID="" REGISTRY_DIR=""
  fi
  # the broker's lines and the registry's (when it runs): both belong to the main services
  kafka_lines="$(grep -E '^OUTBOX_TEST_(KAFKA|SCHEMA_REGISTRY)_' "$main_env")" || die "no OUTBOX_TEST_KAFKA_* lines in $main_env"
  kafka_lines="$kafka_lines"$'\n'"OUTBOX_TEST_KAFKA_RUN_DIR=$(dirname "$main_env")"
  local t0=$SECONDS
  trap on_start_exit EXIT
  ensure_pg_prereqs
  pg_setup
  write_env "$kafka_lines"
  START_OK=1
  trap - EXIT
  log "extra PostgreSQL $PG_VERSION ready in $((SECONDS - t0))s; env file: $ENV_FILE"
  cat "$ENV_FILE"
}

cmd_stop_pg() {
  local v=${1:-}
  [[ "$v" =~ ^[0-9]+(\.[0-9]+\.[0-9]+)?$ ]] || die "stop-pg needs the VERSION given to start-pg"
  [ -d "$RUN_DIR/pg-$v" ] || { log "no extra PostgreSQL $v (no $RUN_DIR/pg-$v)"; return 0; }
  OUTBOX_TEST_RUN_DIR="$RUN_DIR/pg-$v" bash "$SELF" stop
}

cmd_kafka_kill() {
  require_env
  kafka_elsewhere kafka-kill && return 0
  if is_our_kafka "$KAFKA_PID" "$KAFKA_DIR"; then
    log "kill -9 kafka pid $KAFKA_PID"
    kafka_kill_pid "$KAFKA_PID"
  else
    log "kafka is not running"
  fi
  set_kafka_pid ""
}

cmd_kafka_start() {
  require_env
  kafka_elsewhere kafka-start && return 0
  [ -n "$KAFKA_DIR" ] && [ -f "$KAFKA_DIR/server.properties" ] || die "kafka data dir $KAFKA_DIR is gone"
  if is_our_kafka "$KAFKA_PID" "$KAFKA_DIR" && port_open "$KAFKA_PORT"; then
    log "kafka already running: pid $KAFKA_PID"
    return 0
  fi
  libs_ok || die "Kafka jars missing from $KAFKA_LIBS"
  wait_port_free 60 "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_PORT" "$KAFKA_TLS_PORT" ${KAFKA_PROXIED_PORT:+"$KAFKA_PROXIED_PORT"} ||
    die "kafka ports are still taken"
  kafka_launch
  if ! kafka_wait_ready; then
    kafka_kill_pid "$KAFKA_PID"
    set_kafka_pid ""
    tail_file "$KAFKA_LOG" 80
    die "kafka did not restart (log: $KAFKA_LOG)"
  fi
  set_kafka_pid "$KAFKA_PID"
  log "kafka restarted: pid $KAFKA_PID on 127.0.0.1:$KAFKA_PORT"
}

cmd_kafka_signal() { # SIGSTOP/SIGCONT
  require_env
  if [ "$1" = STOP ]; then kafka_elsewhere kafka-pause && return 0; else kafka_elsewhere kafka-resume && return 0; fi
  if ! is_our_kafka "$KAFKA_PID" "$KAFKA_DIR"; then
    # resuming a broker that is not running is a no-op (e.g. a deferred resume after a kill); pausing one is an error
    [ "$1" = CONT ] && { log "kafka is not running: nothing to resume"; return 0; }
    die "kafka is not running"
  fi
  kill "-$1" "$KAFKA_PID"
  if [ "$1" = STOP ] && ! wait_stopped 10 "$KAFKA_PID"; then
    die "kafka pid $KAFKA_PID: not every thread stopped within 10s of SIGSTOP"
  fi
  log "sent SIG$1 to kafka pid $KAFKA_PID"
}

# wait_stopped SECONDS PID: 0 once every thread of PID is stopped (state T), 1 on timeout. kill -STOP returns
# before the group stop is done: until one of its threads gets a CPU and takes the signal, the others go on
# running (a broker answers produce requests), which on a loaded machine takes tens of milliseconds.
wait_stopped() {
  local deadline=$((SECONDS + $1)) states
  while :; do
    # one sed for every thread; a thread that exits meanwhile has no stat file left (ignored)
    states="$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' /proc/"$2"/task/*/stat 2>/dev/null || true)"
    [ -n "$states" ] || return 1
    grep -qv '^[TtXZ]$' <<<"$states" || return 0
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.01
  done
}

cmd_pg_restart() {
  local mode=${1:-fast} old
  case "$mode" in fast|immediate|smart) ;; *) die "pg-restart mode must be fast or immediate, not '$mode'" ;; esac
  require_env
  [ -d "$PG_DATA" ] || die "postgres data dir $PG_DATA is gone"
  old="$(pg_postmaster_pid || true)"
  log "pg_ctl stop -m $mode (postmaster ${old:-none})"
  pg_stop_server "$mode"
  if ! pg_start_server; then
    set_env OUTBOX_TEST_PG_PID ""
    die "postgres did not restart (log: $PG_LOG)"
  fi
  pg_wait_ready || { tail_file "$PG_LOG"; die "postgres restarted but is not reachable"; }
  set_env OUTBOX_TEST_PG_PID "$PG_PID"
  log "postgres restarted: pid $PG_PID on 127.0.0.1:$PG_PORT"
}

cmd_status() {
  if ! load_env; then
    echo "not started (no $ENV_FILE)"
    return 3
  fi
  local ok=0 pm
  pm="$(pg_postmaster_pid || true)"
  if alive "$pm" && PGCONNECT_TIMEOUT=3 "$(psql_bin)" -X -Atq "$(pg_url)" -c 'select 1' >/dev/null 2>&1; then
    echo "postgres: up   pid=$pm url=$(pg_url) data=$PG_DATA build=$PG_BUILD"
  else
    echo "postgres: DOWN pid=${pm:-none} port=$PG_PORT data=$PG_DATA"; ok=1
  fi
  if is_our_kafka "$KAFKA_PID" "$KAFKA_DIR" && port_open "$KAFKA_PORT"; then
    echo "kafka:    up   pid=$KAFKA_PID brokers=127.0.0.1:$KAFKA_PORT data=$KAFKA_DIR"
  else
    echo "kafka:    DOWN pid=${KAFKA_PID:-none} brokers=127.0.0.1:$KAFKA_PORT data=$KAFKA_DIR"; ok=1
  fi
  registry_status_line || ok=1
  echo "env file: $ENV_FILE"
  return "$ok"
}

# the three-node cluster's commands (cluster-*)
# shellcheck source=services-cluster.sh
. "$SCRIPT_DIR/services-cluster.sh"
# the schema registry (registry-*)
# shellcheck source=services-registry.sh
. "$SCRIPT_DIR/services-registry.sh"

usage() {
  sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  kafka-kill) cmd_kafka_kill ;;
  kafka-start) cmd_kafka_start ;;
  kafka-pause) cmd_kafka_signal STOP ;;
  kafka-resume) cmd_kafka_signal CONT ;;
  pg-restart) cmd_pg_restart "${2:-fast}" ;;
  start-pg) cmd_start_pg "${2:-}" ;;
  stop-pg) cmd_stop_pg "${2:-}" ;;
  _start-extra-pg) cmd_start_extra_pg "${2:?}" ;;
  registry-stop) cmd_registry_stop ;;
  registry-start) cmd_registry_start ;;
  registry-pause) cmd_registry_signal STOP ;;
  registry-resume) cmd_registry_signal CONT ;;
  registry-status) cmd_registry_status ;;
  cluster-*) cluster_cmd "$@" ;;
  -h|--help|help) usage ;;
  *) usage ;;
esac
