#!/usr/bin/env bash
# Lint and type-check: ruff, then mypy (both configured in pyproject.toml: mypy is strict on
# the contract and the public APIs). Installs the test tools first, as scripts/test.sh does.
# .ci/run runs this before the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
PY=${PYTHON:-python3}
echo "lint: ruff check ."
"$PY" -m ruff check .
echo "lint: mypy (nsa, nsa_tui)"
"$PY" -m mypy
