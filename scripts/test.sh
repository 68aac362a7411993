#!/usr/bin/env bash
# Install everything the test suite needs (Python packages and the OpenSSH server used
# by the transport tests), then run the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ ! -x /usr/sbin/sshd ]; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  echo "test: installing openssh-server (the SSH tests run a real sshd on 127.0.0.1)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssh-server >/dev/null
fi
export TRITON_INTERPRET=1 PYTHONUNBUFFERED=1
# pytest's default output: one line per test file with its progress, so a long run is never silent
exec "${PYTHON:-python3}" -m pytest -ra "$@"
