#!/usr/bin/env bash
# alerts.sh: what `make alerts` runs, and the first step of `make test`.
# promtool check rules deploy/alerts.yaml, then promtool test rules on
# test/alerts/*_test.yaml (each alert fires on a synthetic outage and stays
# silent on healthy series). promtool comes from Debian's `prometheus`
# package: when it is not on PATH, the package is downloaded (apt-get
# download, no daemon installed or started) and promtool extracted into
# $OUTBOX_TEST_RUN_DIR/tools. Fails loudly if it cannot.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR="${OUTBOX_TEST_RUN_DIR:-$PWD/test/.run}"
TOOLS="$RUN_DIR/tools"

die() { echo "alerts.sh: $*" >&2; exit 1; }

install_promtool() {
  command -v apt-get >/dev/null || die "promtool not found and no apt-get: install Debian's 'prometheus' package (or put promtool on PATH)"
  local tmp
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  echo "== promtool not found: fetching Debian's prometheus package for it" >&2
  if ! (cd "$tmp" && apt-get download -q prometheus >&2); then
    [ "$(id -u)" = 0 ] || die "apt-get download prometheus failed and not root (apt-get update needs root): install the 'prometheus' package first"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
    (cd "$tmp" && apt-get download -q prometheus >&2) || die "apt-get download prometheus failed"
  fi
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" || die "dpkg-deb -x failed on the prometheus package"
  [ -x "$tmp/x/usr/bin/promtool" ] || die "the prometheus package holds no usr/bin/promtool"
  mkdir -p "$TOOLS"
  install -m 0755 "$tmp/x/usr/bin/promtool" "$TOOLS/promtool"
}

PROMTOOL="${PROMTOOL:-}"
if [ -z "$PROMTOOL" ]; then
  if command -v promtool >/dev/null; then
    PROMTOOL="$(command -v promtool)"
  else
    [ -x "$TOOLS/promtool" ] || install_promtool
    PROMTOOL="$TOOLS/promtool"
  fi
fi
"$PROMTOOL" --version >/dev/null 2>&1 || die "$PROMTOOL does not run"

echo "== alert rules: promtool check rules, promtool test rules ($("$PROMTOOL" --version 2>&1 | head -1))"
"$PROMTOOL" check rules deploy/alerts.yaml
"$PROMTOOL" test rules test/alerts/*_test.yaml
