#!/usr/bin/env bash
# Debian packages loopscope's tests and benchmarks use: a C compiler for the
# C API tests, the peers the benchmarks compare against (cyclictest from
# rt-tests, LTTng-UST), stress-ng for `command` loads, and Chromium with its
# driver for the report's browser test, iproute2 and ethtool for network-namespace
# hosts, OpenSSH (server and client) for the ssh host kind's tests, linux-perf to open runs captured with perf record and for the capture bench's comparison. Installs what is missing when run as
# root; otherwise says what is missing and carries on (the tests that need it
# then skip).
set -euo pipefail

need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in gcc libc6-dev linux-libc-dev rt-tests lttng-tools liblttng-ust-dev stress-ng iperf3 chromium chromium-driver \
         iproute2 ethtool openssh-server openssh-client linux-perf; do
  have "$p" || need+=("$p")
done
command -v cargo >/dev/null || { echo "loopscope: error: cargo (Rust) is not installed; install it with rustup (https://rustup.rs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "loopscope: error: python3 is not installed" >&2; exit 1; }

[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "loopscope: note: not root, so these Debian packages are not installed: ${need[*]} (tests that need them will skip)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "loopscope: installing Debian packages: ${need[*]}"
if ! apt-get install -y -q --no-install-recommends "${need[@]}" >/tmp/loopscope-apt.log 2>&1; then
  apt-get update -q >>/tmp/loopscope-apt.log 2>&1 || true
  apt-get install -y -q --no-install-recommends "${need[@]}" >>/tmp/loopscope-apt.log 2>&1 || {
    echo "loopscope: error: apt-get install ${need[*]} failed; see /tmp/loopscope-apt.log" >&2; exit 1; }
fi
