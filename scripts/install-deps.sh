#!/usr/bin/env bash
# The Debian packages loopscope uses, in two sets:
#   install-deps.sh demo   what `make demo` needs (a C toolchain for the Rust
#                          build and the C API, the tools for network-namespace hosts)
#   install-deps.sh test   that, plus the peers the tests and benchmarks compare
#                          against and the browser the report's tests render in
# Each package it installs is printed with the reason. Installs what is missing
# when run as root; otherwise says what is missing and carries on (the tests
# that need it then skip, and the demo falls back to its one-host lab).
set -euo pipefail

set_name=${1:-test}
case "$set_name" in demo|test) ;; *) echo "usage: $0 demo|test" >&2; exit 2 ;; esac

# package|why (the demo's first; the rest for the tests and benchmarks)
demo_pkgs=(
  "gcc|the linker Rust needs, and the compiler for C programs built against the C API"
  "libc6-dev|the C library headers those builds need"
  "libzstd-dev|zstd for reading trace.dat version 7, linked from the system (without it the build compiles its own copy, a minute longer)"
  "pkg-config|finds that libzstd for the build"
  "iproute2|ip netns / veth: each experiment host is a network namespace"
  "ethtool|turns segmentation offloads off on the hosts' links so packets are stamped as sent"
)
test_pkgs=(
  "linux-libc-dev|kernel headers for the C API tests"
  "rt-tests|cyclictest, the peer bench timer compares against"
  "lttng-tools|LTTng, the peer bench trace compares against"
  "liblttng-ust-dev|LTTng's user-space tracepoints for that comparison"
  "stress-ng|background load in the tests' and benches' experiments"
  "iperf3|the peer bench pacing compares against"
  "chromium|the browser the report tests render pages in"
  "chromium-driver|drives that browser from the tests (selenium)"
  "openssh-server|the ssh host kind's tests log in to this machine"
  "openssh-client|ssh-keygen for those tests' keys"
  "linux-perf|perf, to open runs captured with perf record, for bench kcapture's comparison and the perf.data imports' tests"
  "trace-cmd|writes the trace.dat files the import tests and bench read (trace-cmd extract, convert, report)"
  "prometheus|a real Prometheus server scrapes loopscope monitor's metrics endpoint in its test"
  "slurm-wlm|a real Slurm cluster (slurmctld, one slurmd per namespace) the exec host kind's tests and bench fleet start agents through with srun"
  "munge|the authentication that Slurm cluster uses"
  "ansible-core|ansible-inventory: the inventory hosts' tests read Ansible inventories with Ansible's own parser"
)
pkgs=("${demo_pkgs[@]}")
[ "$set_name" = test ] && pkgs+=("${test_pkgs[@]}")

command -v cargo >/dev/null || { echo "loopscope: error: cargo (Rust) is not installed; install it with rustup (https://rustup.rs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "loopscope: error: python3 is not installed" >&2; exit 1; }

have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
need=() why=()
for entry in "${pkgs[@]}"; do
  p=${entry%%|*}
  have "$p" || { need+=("$p"); why+=("  $p: ${entry#*|}"); }
done
if [ ${#need[@]} -eq 0 ]; then
  names=(); for entry in "${pkgs[@]}"; do names+=("${entry%%|*}"); done
  echo "loopscope: the Debian packages for the $set_name are present (${names[*]})"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "loopscope: note: not root, so these Debian packages are not installed (what needs them will skip or fall back):" >&2
  printf '%s\n' "${why[@]}" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "loopscope: installing ${#need[@]} Debian package(s) for the $set_name:"
printf '%s\n' "${why[@]}"
if ! apt-get install -y -q --no-install-recommends "${need[@]}" >/tmp/loopscope-apt.log 2>&1; then
  apt-get update -q >>/tmp/loopscope-apt.log 2>&1 || true
  apt-get install -y -q --no-install-recommends "${need[@]}" >>/tmp/loopscope-apt.log 2>&1 || {
    echo "loopscope: error: apt-get install ${need[*]} failed; see /tmp/loopscope-apt.log" >&2; exit 1; }
fi
