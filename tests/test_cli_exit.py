"""One exit-code table for every ``nsa-tui`` command: the code's (nsa_tui/cli/exitcodes.py) equals the
docs' (docs/cli.md); no command path returns a number outside it (read from the source, and
seen from real CLI subprocesses against the local agent, one per command)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui.cli import exitcodes as cli_exit
from nsa_tui.cli.args import parser

REPO = Path(__file__).resolve().parents[1]
CLI_MODULES = ["cli/main.py", "cli/one.py", "cli/multi.py", "cli/exitcodes.py", "cli/sample.py",
               "cli/evaluate.py"]
NO_RUN = "20990101-000000-none-0000"  # a well-formed run id that no host has


def _md_table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading`` (cells stripped, header and rule dropped)."""
    rest = text[text.index(heading):]
    rows = []
    for line in rest.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            break
    return rows[2:]


def test_the_docs_print_the_code_table() -> None:
    doc = (REPO / "docs" / "cli.md").read_text()
    exits = {int(code): name.strip("`") for code, name, _ in _md_table(doc, "## Exit codes")}
    assert exits == {v: k for k, v in vars(cli_exit).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert set(exits) == set(cli_exit.EXIT_CODES)
    errors = {code.strip("`"): int(ex) for code, ex in _md_table(doc, "### Error codes to exit codes")}
    assert errors == cli_exit.ERROR_EXIT
    assert set(cli_exit.ERROR_EXIT.values()) <= set(cli_exit.EXIT_CODES)
    assert cli_exit.exit_for("some_code_nobody_maps") == cli_exit.EXIT_FAILED


def _int_functions(trees: dict[str, ast.Module]) -> set[str]:
    return {f.name for t in trees.values() for f in ast.walk(t)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(f.returns, ast.Name)
            and f.returns.id == "int"}


def _returns_a_table_code(e: ast.expr | None, known: set[str]) -> bool:
    """An exit code from the table: an ``EXIT_*`` name in it, or what a function of the CLI that
    returns one (``fail``, ``exit_for``, a command) gives; never a bare number."""
    if isinstance(e, ast.IfExp):
        return _returns_a_table_code(e.body, known) and _returns_a_table_code(e.orelse, known)
    if isinstance(e, ast.Await):
        return _returns_a_table_code(e.value, known)
    if isinstance(e, ast.Name):
        return e.id.startswith("EXIT_") and getattr(cli_exit, e.id, None) in cli_exit.EXIT_CODES
    if isinstance(e, ast.Call):
        f = e.func
        if isinstance(f, ast.Attribute) and ast.unparse(f) == "asyncio.run":  # main: the command's code
            return _returns_a_table_code(e.args[0], known)
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        return name in known
    return False


def test_no_command_path_returns_a_code_outside_the_table() -> None:
    """Every ``return`` of every CLI function that returns an exit code, read from the source."""
    trees = {m: ast.parse((REPO / "nsa_tui" / m).read_text()) for m in CLI_MODULES}
    known = _int_functions(trees)
    assert {"fail", "exit_for", "dispatch", "run", "per_host_exit"} <= known
    bad = []
    for mod, tree in trees.items():
        for f in ast.walk(tree):
            if not (isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in known):
                continue
            for node in ast.walk(f):
                if isinstance(node, ast.Return) and not _returns_a_table_code(node.value, known):
                    bad.append(f"{mod}:{node.lineno} {f.name}: {ast.unparse(node)}")
    bad = [b for b in bad if not b.startswith("cli/exitcodes.py")]  # exit_for and fail: the table itself
    assert not bad, "\n".join(bad)


def _nsa_tui(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=120)


def _commands() -> set[str]:
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    return set(sub.choices) - {"connect"}  # type: ignore[arg-type]


@pytest.mark.slow
def test_every_command_exits_with_a_code_from_the_table(tmp_path: Path) -> None:
    """Each command, run for real on the local agent (an empty runs root) or an unreachable host:
    the exit code the table gives its error. A command added without a line here fails."""
    root = ["--runs-root", str(tmp_path / "runs")]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    cases: dict[str, tuple[list[str], int]] = {
        "runs": (["local", *root], cli_exit.EXIT_OK),
        "launch": (["local", "--config", str(bad), *root], cli_exit.EXIT_BAD_CONFIG),
        "status": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "logs": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "alerts": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "ack": (["local", NO_RUN, "stall", *root], cli_exit.EXIT_NO_RUN),
        "kill": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "fallback": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "resume": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "dump": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "export": (["local", NO_RUN, "--csv", str(tmp_path / "m.csv"), *root], cli_exit.EXIT_NO_RUN),
        "archive": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "delete": (["local", NO_RUN, "--yes", *root], cli_exit.EXIT_NO_RUN),
        "setup": (["nobody@127.0.0.1:1"], cli_exit.EXIT_UNREACHABLE),
        "sample": (["local", NO_RUN, *root], cli_exit.EXIT_NO_RUN),
        "eval": (["local", NO_RUN, "--passkey", *root], cli_exit.EXIT_NO_RUN),
    }
    assert set(cases) == _commands()
    seen = {}
    for cmd, (args, _) in cases.items():
        r = _nsa_tui(cmd, *args, "--json")
        seen[cmd] = r.returncode
        assert r.returncode in cli_exit.EXIT_CODES, (cmd, r.returncode, r.stdout, r.stderr)
    assert seen == {cmd: want for cmd, (_, want) in cases.items()}
    for cmd in ("status", "kill", "export", "setup"):  # no host, or several of which none answers
        r = _nsa_tui(cmd, "nobody@127.0.0.1:1,nobody@127.0.0.1:2", *([NO_RUN] if cmd != "setup" else []),
                     *(["--csv", "x.csv"] if cmd == "export" else []), "--json")
        assert r.returncode == cli_exit.EXIT_UNREACHABLE, (cmd, r.stdout, r.stderr)
    assert _nsa_tui("status").returncode == cli_exit.EXIT_USAGE
    assert _nsa_tui("status", ",", NO_RUN, "--json").returncode == cli_exit.EXIT_USAGE
