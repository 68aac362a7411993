#!/usr/bin/env bash
# Install nsa-tui with its training side (extra `host`) into the current Python
# environment (make a venv first: Debian's system python refuses pip install).
#   scripts/setup.sh          the panel, the CLI, the agent and the trainer
#   scripts/setup.sh --test   the same and the test tools
# A machine that already has torch keeps it (GPU hosts). A machine without torch gets
# torch 2.13.0: without an NVIDIA GPU the CPU build from PyTorch's CPU wheel index (190 MB
# to download, 750 MB installed); where that index cannot be reached, whatever the configured
# index gives (on PyPI a CUDA build: several GB, which also runs on a CPU), said before it
# starts. NSA_SETUP_PLAN=1 says which and stops before installing anything.
# A laptop that only watches needs none of this: `pip install .` (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)
CPU_INDEX=${NSA_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
has_gpu() { [ -e /dev/nvidia0 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; }
reachable() { "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" \
  "$1" >/dev/null 2>&1; }
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if has_gpu; then
    echo "setup: no torch found, an NVIDIA GPU is: installing torch==2.13.0 (a CUDA build, several GB)"
  elif reachable "$CPU_INDEX"; then
    echo "setup: no torch found, no GPU: installing the CPU build torch==2.13.0 from $CPU_INDEX"
    [ "${NSA_SETUP_PLAN:-}" = 1 ] && exit 0
    "${PIP[@]}" --no-deps --index-url "$CPU_INDEX" "torch==2.13.0"
  else
    echo "setup: no torch found, no GPU, and $CPU_INDEX cannot be reached: installing torch==2.13.0" \
      "from the configured index (on PyPI a CUDA build, several GB; it runs on the CPU)"
  fi
  [ "${NSA_SETUP_PLAN:-}" = 1 ] && exit 0
  "${PIP[@]}" "torch==2.13.0" numpy  # torch's own dependencies (or torch itself, above)
else
  echo "setup: keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
  [ "${NSA_SETUP_PLAN:-}" = 1 ] && exit 0
fi
extras="host"
# the tests also run the Triton kernels in Triton's interpreter (a GPU host's torch brings Triton)
if [ "${1:-}" = "--test" ]; then extras="host,test"; fi
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[${extras}]"
echo "done: run \`nsa-tui\`"
