#!/usr/bin/env bash
# Install nsa-tui into the current Python environment.
#   scripts/setup.sh          the product
#   scripts/setup.sh --test   the product and its test tools
# A machine that already has torch keeps it (GPU hosts); a machine without torch gets
# the CPU build 2.13.0, never the multi-GB CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch found; installing the CPU build torch==2.13.0"
  "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0" numpy
else
  echo "setup: keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
fi
extra=""
if [ "${1:-}" = "--test" ]; then extra="[test]"; fi
"$PY" -m pip install --quiet --disable-pip-version-check -e ".${extra}"
