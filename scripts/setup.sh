#!/usr/bin/env bash
# Install nsa-tui with its training side (extra `host`) into the current Python
# environment (make a venv first: Debian's system python refuses pip install).
#   scripts/setup.sh          the panel, the CLI, the agent and the trainer
#   scripts/setup.sh --test   the same and the test tools
# A machine that already has torch keeps it (GPU hosts); a machine without torch gets
# the CPU build 2.13.0, never the multi-GB CUDA wheels. A laptop that only watches
# needs none of this: `pip install .` (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch found; installing the CPU build torch==2.13.0"
  "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0" numpy
else
  echo "setup: keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
fi
extras="host"
if [ "${1:-}" = "--test" ]; then extras="host,test"; fi
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[${extras}]"
echo "done: run \`nsa-tui\`"
