"""Only nsa/contract spells a run-directory file name: a name spelled in a second module is
a reader that a rename of the file leaves behind (it then reads nothing, silently)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from nsa.contract import rundir

ROOT = Path(__file__).resolve().parents[1]
NAMES = (rundir.RUN_JSON, rundir.LAUNCH_JSON, rundir.EXIT_JSON, rundir.STOP_JSON, rundir.RELAUNCH_JSON,
         rundir.ARCHIVED_JSON, rundir.ALERTS_JSONL, rundir.CONFIG_YAML, rundir.TRAIN_LOG,
         rundir.METRICS_JSONL, rundir.METRICS_SUMMARY_JSON, rundir.META_JSON, rundir.EVAL_PASSKEY_JSONL)
# a name, or a path inside a run directory (heartbeats/rank-0.jsonl, stacks/..., step-12)
SPELLED = re.compile("|".join([rf"(?<![\w.-]){re.escape(n)}(?![\w-])" for n in NAMES]
                              + [rf"(?<!\w){d}/" for d in (rundir.HEARTBEATS, rundir.CHECKPOINTS,
                                                          rundir.STACKS, rundir.NCCL, rundir.EVAL)]
                              + [r"(?<![\w/-])\.?rank-(?:\d|$)", r"(?<![\w-])step-(?:\d|$)"]))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string literal (docstrings aside) that spells a run-directory
    file name or a path inside a run directory."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and SPELLED.search(node.value)]


def test_no_module_outside_the_contract_spells_a_run_directory_name() -> None:
    found = []
    for pkg in ("nsa", "nsa_tui"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.is_relative_to(ROOT / "nsa" / "contract"):
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {text!r}"
                      for line, text in spelled_names(path.read_text())]
    assert not found, ("run-directory names outside nsa/contract (use nsa.contract.rundir):\n"
                       + "\n".join(found))


def test_the_check_catches_each_spelling() -> None:
    src = '''"""Docstrings may name run.json."""
a = run_dir / "run.json"
b = f"{x}/heartbeats/rank-{r}.jsonl"
c = "checkpoints/step-12"
d = "the end of train.log"
e = ("rank-", "step-")
f = "metrics-summary.json"
ok = ("heartbeats", "my-run.jsonlines", "checkpoints", "ranks", "x.log")
'''
    lines = [line for line, _ in spelled_names(src)]
    assert sorted(set(lines)) == [2, 3, 4, 5, 6, 7], spelled_names(src)
