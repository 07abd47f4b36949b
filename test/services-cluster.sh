# test/services-cluster.sh - sourced by test/services.sh: a three-node KRaft Kafka cluster beside the single broker,
# from the same Maven jars, for the cluster fault tests (test/chaos, scenarios marked cluster; docs/chaos.md).
#
# Each node is broker AND controller (3 static voters, controller.quorum.voters), replication factor 3 for every
# topic the cluster makes (default.replication.factor, offsets and transaction state), min.insync.replicas 2 and
# transaction.state.log.min.isr 2; loopback ports picked free; data under <OUTBOX_TEST_TMP>/outbox-kcluster.XXXXXX;
# logs <run dir>/kafka-node<N>.log. Needs the services of `start` (it adds its lines to their env file):
#   cluster-start              format and start the three nodes, wait until each serves, write the env lines
#   cluster-stop               stop every node (SIGTERM, SIGKILL after 30s), remove the data; `stop` does it too
#   cluster-status             state of each node; exit 0 only if all three serve
#   cluster-kill N             kill -9 node N (1..3) and wait until it is gone
#   cluster-term N             SIGTERM node N (controlled shutdown) and wait until it is gone
#   cluster-node-start N       start node N again on its ports and data dir; wait until it serves (a node killed
#                              with kill -9 is let in only once its old registration expired: broker.session.timeout.ms)
#   cluster-pause N | cluster-resume N   SIGSTOP / SIGCONT node N (pause returns once every thread stopped)
# Env lines (KEY=value, in the services' env file):
#   OUTBOX_TEST_CLUSTER_BROKERS=127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>   node N is broker id N
#   OUTBOX_TEST_CLUSTER_NODE<N>_PORT, OUTBOX_TEST_CLUSTER_NODE<N>_CONTROLLER_PORT, OUTBOX_TEST_CLUSTER_NODE<N>_PID
#   OUTBOX_TEST_CLUSTER_DIR, OUTBOX_TEST_CLUSTER_SESSION_TIMEOUT_MS
# Knobs: OUTBOX_KAFKA_CLUSTER_HEAP_OPTS (default "-Xms128m -Xmx512m"); OUTBOX_KAFKA_SESSION_TIMEOUT_MS as for the
# single broker.

CLUSTER_NODES=3
CLUSTER_HEAP_OPTS="${OUTBOX_KAFKA_CLUSTER_HEAP_OPTS:--Xms128m -Xmx512m}"
CLUSTER_DIR="" CLUSTER_PORTS=() CLUSTER_CPORTS=() CLUSTER_PIDS=()

# cluster_load: 0 if the env file names a cluster (its variables loaded), 1 otherwise
cluster_load() {
  [ -f "$ENV_FILE" ] || return 1
  local k v n
  CLUSTER_DIR=""
  while IFS='=' read -r k v; do
    case "$k" in
      OUTBOX_TEST_CLUSTER_DIR) CLUSTER_DIR=$v ;;
      OUTBOX_TEST_CLUSTER_NODE?_PORT) n=${k#OUTBOX_TEST_CLUSTER_NODE}; CLUSTER_PORTS[${n%%_*}]=$v ;;
      OUTBOX_TEST_CLUSTER_NODE?_CONTROLLER_PORT) n=${k#OUTBOX_TEST_CLUSTER_NODE}; CLUSTER_CPORTS[${n%%_*}]=$v ;;
      OUTBOX_TEST_CLUSTER_NODE?_PID) n=${k#OUTBOX_TEST_CLUSTER_NODE}; CLUSTER_PIDS[${n%%_*}]=$v ;;
    esac
  done <"$ENV_FILE"
  [ -n "$CLUSTER_DIR" ]
}

cluster_node_arg() { # cluster_node_arg N: N is 1..3
  [[ "${1:-}" =~ ^[1-3]$ ]] || die "give a node number 1..$CLUSTER_NODES, not '${1:-}'"
}

cluster_require() {
  cluster_load || die "no cluster in $ENV_FILE: run '$SELF cluster-start' first"
}

# cluster_write_node N: the node's server.properties (and, through kafka_write_configs, its log4j files)
cluster_write_node() {
  local n=$1 dir="$CLUSTER_DIR/node$1" voters="" i
  for i in $(seq 1 $CLUSTER_NODES); do voters+="${voters:+,}$i@127.0.0.1:${CLUSTER_CPORTS[$i]}"; done
  mkdir -p "$dir"
  # the single broker's writer makes the log4j files; its server.properties is replaced below
  (KAFKA_DIR=$dir; kafka_write_configs)
  cat >"$dir/server.properties" <<EOF
# node $n of a three-node KRaft cluster (broker+controller) for tests; written by test/services-cluster.sh
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:${CLUSTER_PORTS[$n]},CONTROLLER://127.0.0.1:${CLUSTER_CPORTS[$n]}
advertised.listeners=PLAINTEXT://127.0.0.1:${CLUSTER_PORTS[$n]}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/kraft-combined-logs
auto.create.topics.enable=false
num.partitions=4
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
# as the single broker (services.sh): a killed node's registration expires after this, a paused one is fenced
broker.session.timeout.ms=$KAFKA_SESSION_TIMEOUT_MS
broker.heartbeat.interval.ms=$(( KAFKA_SESSION_TIMEOUT_MS / 4 < 2000 ? KAFKA_SESSION_TIMEOUT_MS / 4 : 2000 ))
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
num.replica.fetchers=1
log.segment.bytes=1073741824
EOF
}

cluster_format_node() {
  local dir="$CLUSTER_DIR/node$1" KAFKA_DIR="$CLUSTER_DIR/node$1"
  if ! "$JAVA" -Xmx256m "$(kafka_log_opt tools)" -cp "$KAFKA_LIBS/*" \
       kafka.tools.StorageTool format -t "$KAFKA_CLUSTER_ID" -c "$dir/server.properties" >"$dir/format.log" 2>&1; then
    tail_file "$dir/format.log"
    return 1
  fi
}

# cluster_launch N: start node N's JVM in the background of this shell; sets CLUSTER_PIDS[N]
cluster_launch() {
  local n=$1 KAFKA_DIR="$CLUSTER_DIR/node$1" KAFKA_LOG="$RUN_DIR/kafka-node$1.log" KAFKA_PORT=${CLUSTER_PORTS[$1]}
  local KAFKA_HEAP_OPTS=$CLUSTER_HEAP_OPTS KAFKA_PID=""
  kafka_launch
  CLUSTER_PIDS[$n]=$KAFKA_PID
}

# cluster_wait_node N: node N's PLAINTEXT port accepts TCP (it opens once the broker is unfenced)
cluster_wait_node() {
  local KAFKA_LOG="$RUN_DIR/kafka-node$1.log" KAFKA_PORT=${CLUSTER_PORTS[$1]} KAFKA_PID=${CLUSTER_PIDS[$1]}
  kafka_wait_ready
}

cluster_brokers() {
  local i out=""
  for i in $(seq 1 $CLUSTER_NODES); do out+="${out:+,}127.0.0.1:${CLUSTER_PORTS[$i]}"; done
  echo "$out"
}

cluster_is_ours() { is_our_kafka "${CLUSTER_PIDS[$1]:-}" "$CLUSTER_DIR/node$1"; }

cluster_kill_all() {
  local i
  for i in $(seq 1 $CLUSTER_NODES); do
    [ -n "${CLUSTER_PIDS[$i]:-}" ] && { kill -KILL "${CLUSTER_PIDS[$i]}" 2>/dev/null || true; }
  done
  for i in $(seq 1 $CLUSTER_NODES); do
    [ -n "${CLUSTER_PIDS[$i]:-}" ] && { wait_gone 30 "${CLUSTER_PIDS[$i]}" || true; }
  done
}

cmd_cluster_start() {
  require_env
  if cluster_load; then
    local i
    for i in $(seq 1 $CLUSTER_NODES); do
      cluster_is_ours "$i" && die "a cluster from $ENV_FILE is still running: run '$SELF cluster-stop' first"
    done
    cmd_cluster_stop
  fi
  local t0=$SECONDS attempt ports i ok
  ensure_java_mvn
  ensure_kafka_libs
  for attempt in 1 2 3; do
    CLUSTER_DIR="$(mktemp -d "$TMP_PARENT/outbox-kcluster.XXXXXX")"
    ports="$(pick_ports $((2 * CLUSTER_NODES)))"
    for i in $(seq 1 $CLUSTER_NODES); do
      CLUSTER_PORTS[$i]="$(sed -n "$((2 * i - 1))p" <<<"$ports")"
      CLUSTER_CPORTS[$i]="$(sed -n "$((2 * i))p" <<<"$ports")"
    done
    for i in $(seq 1 $CLUSTER_NODES); do
      : >"$RUN_DIR/kafka-node$i.log"
      cluster_write_node "$i"
      cluster_format_node "$i" || { rm -rf "$CLUSTER_DIR"; die "kafka StorageTool format failed for cluster node $i"; }
    done
    # all at once: a node unfences only once a quorum of controllers runs
    for i in $(seq 1 $CLUSTER_NODES); do cluster_launch "$i"; done
    ok=1
    for i in $(seq 1 $CLUSTER_NODES); do cluster_wait_node "$i" || { ok=0; break; }; done
    if [ "$ok" = 1 ]; then break; fi
    cluster_kill_all
    if grep -q 'Address already in use' "$RUN_DIR"/kafka-node*.log && (( attempt < 3 )); then
      log "cluster ports were taken; retrying on other ports"
      rm -rf "$CLUSTER_DIR"
      continue
    fi
    for i in $(seq 1 $CLUSTER_NODES); do tail_file "$RUN_DIR/kafka-node$i.log" 40; done
    rm -rf "$CLUSTER_DIR"
    die "the kafka cluster did not start (logs: $RUN_DIR/kafka-node*.log)"
  done
  set_env OUTBOX_TEST_CLUSTER_DIR "$CLUSTER_DIR"
  set_env OUTBOX_TEST_CLUSTER_BROKERS "$(cluster_brokers)"
  set_env OUTBOX_TEST_CLUSTER_SESSION_TIMEOUT_MS "$KAFKA_SESSION_TIMEOUT_MS"
  for i in $(seq 1 $CLUSTER_NODES); do
    set_env "OUTBOX_TEST_CLUSTER_NODE${i}_PORT" "${CLUSTER_PORTS[$i]}"
    set_env "OUTBOX_TEST_CLUSTER_NODE${i}_CONTROLLER_PORT" "${CLUSTER_CPORTS[$i]}"
    set_env "OUTBOX_TEST_CLUSTER_NODE${i}_PID" "${CLUSTER_PIDS[$i]}"
  done
  log "kafka cluster ready in $((SECONDS - t0))s: brokers $(cluster_brokers), pids ${CLUSTER_PIDS[*]}, data $CLUSTER_DIR"
}

# cluster-stop: every node at once (one by one, the last ones would wait on a lost controller quorum)
cmd_cluster_stop() {
  cluster_load || { log "no cluster running"; return 0; }
  local i pids=()
  for i in $(seq 1 $CLUSTER_NODES); do
    if cluster_is_ours "$i"; then
      kill -CONT "${CLUSTER_PIDS[$i]}" 2>/dev/null || true
      kill -TERM "${CLUSTER_PIDS[$i]}" 2>/dev/null || true
      pids+=("${CLUSTER_PIDS[$i]}")
    fi
  done
  if [ ${#pids[@]} -gt 0 ] && ! wait_gone 30 "${pids[@]}"; then
    log "cluster nodes ignored SIGTERM for 30s: SIGKILL"
    cluster_kill_all
  fi
  case "$CLUSTER_DIR" in */outbox-kcluster.*) rm -rf "$CLUSTER_DIR" ;; esac
  (
    flock -w 30 9 || die "cannot lock $LOCK_FILE"
    [ -f "$ENV_FILE" ] || exit 0
    grep -v '^OUTBOX_TEST_CLUSTER_' "$ENV_FILE" >"$ENV_FILE.tmp.$$" || true
    mv -f "$ENV_FILE.tmp.$$" "$ENV_FILE"
  ) 9>"$LOCK_FILE"
  log "kafka cluster stopped"
}

cmd_cluster_status() {
  cluster_require
  local i rc=0
  for i in $(seq 1 $CLUSTER_NODES); do
    if cluster_is_ours "$i" && port_open "${CLUSTER_PORTS[$i]}"; then
      echo "node $i: up   pid=${CLUSTER_PIDS[$i]} 127.0.0.1:${CLUSTER_PORTS[$i]}"
    else
      echo "node $i: DOWN pid=${CLUSTER_PIDS[$i]:-none} 127.0.0.1:${CLUSTER_PORTS[$i]}"; rc=1
    fi
  done
  return "$rc"
}

# cluster_stop_node N SIG: KILL or TERM node N and wait until it is gone
cluster_stop_node() {
  local n=$1 sig=$2 pid
  cluster_node_arg "$n"
  cluster_require
  pid=${CLUSTER_PIDS[$n]:-}
  if cluster_is_ours "$n"; then
    log "SIG$sig cluster node $n (pid $pid)"
    if [ "$sig" = KILL ]; then
      kafka_kill_pid "$pid"
    else
      kafka_stop_pid "$pid"
    fi
  else
    log "cluster node $n is not running"
  fi
  set_env "OUTBOX_TEST_CLUSTER_NODE${n}_PID" ""
}

cmd_cluster_node_start() {
  local n=${1:-}
  cluster_node_arg "$n"
  cluster_require
  if cluster_is_ours "$n" && port_open "${CLUSTER_PORTS[$n]}"; then
    log "cluster node $n already running: pid ${CLUSTER_PIDS[$n]}"
    return 0
  fi
  [ -f "$CLUSTER_DIR/node$n/server.properties" ] || die "cluster node $n's data dir $CLUSTER_DIR/node$n is gone"
  libs_ok || die "Kafka jars missing from $KAFKA_LIBS"
  wait_port_free 60 "${CLUSTER_PORTS[$n]}" "${CLUSTER_CPORTS[$n]}" || die "cluster node $n's ports are still taken"
  cluster_launch "$n"
  if ! cluster_wait_node "$n"; then
    kafka_kill_pid "${CLUSTER_PIDS[$n]}"
    set_env "OUTBOX_TEST_CLUSTER_NODE${n}_PID" ""
    tail_file "$RUN_DIR/kafka-node$n.log" 80
    die "cluster node $n did not restart (log: $RUN_DIR/kafka-node$n.log)"
  fi
  set_env "OUTBOX_TEST_CLUSTER_NODE${n}_PID" "${CLUSTER_PIDS[$n]}"
  log "cluster node $n restarted: pid ${CLUSTER_PIDS[$n]} on 127.0.0.1:${CLUSTER_PORTS[$n]}"
}

cmd_cluster_signal() { # cmd_cluster_signal STOP|CONT N
  local sig=$1 n=${2:-}
  cluster_node_arg "$n"
  cluster_require
  if ! cluster_is_ours "$n"; then
    [ "$sig" = CONT ] && { log "cluster node $n is not running: nothing to resume"; return 0; }
    die "cluster node $n is not running"
  fi
  kill "-$sig" "${CLUSTER_PIDS[$n]}"
  if [ "$sig" = STOP ] && ! wait_stopped 10 "${CLUSTER_PIDS[$n]}"; then
    die "cluster node $n (pid ${CLUSTER_PIDS[$n]}): not every thread stopped within 10s of SIGSTOP"
  fi
  log "sent SIG$sig to cluster node $n (pid ${CLUSTER_PIDS[$n]})"
}

# cluster_cmd CMD [N]: the dispatcher services.sh calls for cluster-* commands
cluster_cmd() {
  case "$1" in
    cluster-start) cmd_cluster_start ;;
    cluster-stop) cmd_cluster_stop ;;
    cluster-status) cmd_cluster_status ;;
    cluster-kill) cluster_stop_node "${2:-}" KILL ;;
    cluster-term) cluster_stop_node "${2:-}" TERM ;;
    cluster-node-start) cmd_cluster_node_start "${2:-}" ;;
    cluster-pause) cmd_cluster_signal STOP "${2:-}" ;;
    cluster-resume) cmd_cluster_signal CONT "${2:-}" ;;
    *) usage ;;
  esac
}
