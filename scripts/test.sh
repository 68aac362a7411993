#!/usr/bin/env bash
# Install everything the test suite needs (Python packages, the OpenSSH server and the
# Slurm daemons the tests run for real), then run the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# System packages the suite runs for real: an OpenSSH server (the transport tests run sshd on
# 127.0.0.1), Slurm (munge, slurmctld, slurmd and the client commands: a one-node cluster, and a
# two-node one whose nodes are network namespaces joined by veth pairs, hence iproute2).
need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
[ -x /usr/bin/sbatch ] || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  echo "test: installing ${need[*]} (the SSH and Slurm tests run the real daemons)"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null; }; then
    echo "test: could not install ${need[*]}: the tests that need them are skipped, each saying why" >&2
  fi
fi
export TRITON_INTERPRET=1 PYTHONUNBUFFERED=1
# Two workers (pytest-xdist), a test file each at a time: much of the suite waits on real
# daemons and processes (sshd, Slurm, torchrun ranks starting), so the second worker uses the
# core the first leaves idle. NSA_TEST_WORKERS=1 runs everything in this one process.
workers="${NSA_TEST_WORKERS:-2}"
args=(-ra)  # one process: a line per test file with its progress, so a long run is never silent
if [ "$workers" != "1" ]; then args+=(-n "$workers" --dist loadfile -v); fi  # a line per test, as it ends
exec "${PYTHON:-python3}" -m pytest "${args[@]}" "$@"
