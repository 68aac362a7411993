"""The committed compile-gate records of the older Tritons (bench/results/compile-triton-*.json).

CI compiles the kernels with the newest Triton on every run (test_compile_gate.py); the
older Tritons of the declared range are checked by records of
``python -m bench.compile_check --triton VERSION --record``. A record says something
only about the kernel sources it was made from: once a kernel file changes, these tests
fail until the command is run again and its record committed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compile_records import KERNEL_DIR, RECORDED_TRITONS, kernels_hash, record_path
from nsa.ops.self_check import triton_too_old

ROOT = Path(__file__).resolve().parents[2]


def test_the_kernels_hash_follows_every_kernel_source(tmp_path: Path) -> None:
    for path in KERNEL_DIR.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    before = kernels_hash(tmp_path)
    assert before == kernels_hash(KERNEL_DIR)
    (tmp_path / "notes.txt").write_text("not a kernel source")
    assert kernels_hash(tmp_path) == before
    band = tmp_path / "band.py"
    band.write_text(band.read_text() + "\n")  # even a blank line: line numbers are in the compiled code
    assert kernels_hash(tmp_path) != before
    band.unlink()
    assert kernels_hash(tmp_path) != before
    (tmp_path / "new_kernels.py").write_text("")
    assert kernels_hash(tmp_path) != before


@pytest.mark.parametrize("version", RECORDED_TRITONS)
def test_each_older_triton_has_a_complete_record_of_these_kernels(version: str) -> None:
    rerun = f"run `python -m bench.compile_check --triton {version} --record` and commit its record"
    path = record_path(version)
    assert path.exists(), f"no record of the gate under Triton {version}: {rerun}"
    record = json.loads(path.read_text())
    assert record["triton"] == version
    changed = f"the kernels changed since {path.name} was made: {rerun}"
    assert record["kernels_sha256"] == kernels_hash(), changed
    assert record["archs"] == [80, 90]
    assert record["complete"], (f"{path.name} is partial ({record['compiled']} of {record['compiles']} "
                                f"compiles): {rerun}")
    assert record["compiled"] == record["compiles"] > 0
    assert record["uncovered"] == []
    # the declared range is what these records prove: a Triton at or above the self-check's
    # floor (MIN_TRITON) compiles every kernel with no error, spill or shared-memory
    # overflow; one below it fails somewhere (else the floor is higher than needed)
    bad = [line for line in record["lines"] if line.startswith("FAIL")]
    assert bool(bad) == bool(record["errors"] or record["spills"] or record["smem_over"])
    if triton_too_old(version) is None:
        shown = "\n".join(bad[:10])
        assert record["passed"] and not bad, f"Triton {version} is at or above MIN_TRITON but:\n{shown}"
    else:
        lower = "no spill: lower MIN_TRITON in nsa/ops/self_check.py (and docs/install.md)"
        assert not record["passed"] and bad, f"Triton {version} now compiles every kernel with {lower}"


def test_a_record_is_reused_only_for_the_same_compiles_of_the_same_kernels_passed(tmp_path: Path) -> None:
    """``--reuse-record``: the installed Triton's record stands for the gate only when it holds
    exactly the compiles the gate would run now, of these kernels, complete and passed."""
    triton = pytest.importorskip("triton")
    from bench.compile_records import reusable_record, work_hash

    keys = ["('nsa.ops.triton.band', '_band_fwd', 90, ...)['nsa-125m fwd']", "('...', '_sel_fwd', 80, ...)[]"]
    fingerprint = work_hash(keys)
    assert work_hash(list(reversed(keys))) == fingerprint  # the gate's order of work is not the point
    assert work_hash(keys[:1]) != fingerprint and work_hash([*keys, "another compile"]) != fingerprint
    good = {"triton": triton.__version__, "kernels_sha256": kernels_hash(), "work_sha256": fingerprint,
            "complete": True, "passed": True, "compiles": 2, "started": "2026-11-27T00:00:00Z"}
    path = record_path(triton.__version__, tmp_path)
    assert reusable_record(fingerprint, tmp_path) is None  # no record
    for change, reused in [({}, True), ({"passed": False}, False), ({"complete": False}, False),
                           ({"kernels_sha256": "0" * 64}, False), ({"triton": "3.1.0"}, False),
                           ({"work_sha256": work_hash(keys[:1])}, False)]:
        path.write_text(json.dumps({**good, **change}))
        assert (reusable_record(fingerprint, tmp_path) is not None) == reused, change
    path.write_text("{not json")
    assert reusable_record(fingerprint, tmp_path) is None


def test_a_kernel_source_reaches_what_it_imports_of_the_package(tmp_path: Path) -> None:
    """A compile depends on its kernel's file and on every kernel source that file imports,
    directly or through another (jit helpers and constants): a change elsewhere leaves its
    recorded verdict standing."""
    from bench.compile_records import file_hashes, reachable_sources, sources_hash

    assert reachable_sources("glue.py") == ["glue.py"]
    topn = reachable_sources("topn.py")
    assert {"topn.py", "bitonic.py", "band.py", "tuning.py"} <= set(topn)
    assert "selected.py" not in topn and "decode.py" not in topn
    assert "topn.py" in reachable_sources("decode.py")  # through ``from .topn import ...``
    assert set(reachable_sources("__init__.py")) == set(file_hashes())  # the package imports them all

    for path in KERNEL_DIR.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    before = file_hashes(tmp_path)
    assert before == file_hashes()
    (tmp_path / "bitonic.py").write_text((tmp_path / "bitonic.py").read_text() + "\n")
    after = file_hashes(tmp_path)
    changed = {name for name in before
               if sources_hash(name, before, tmp_path) != sources_hash(name, after, tmp_path)}
    assert changed == {"bitonic.py", "topn.py", "selected.py", "decode.py", "decode_fused.py",
                       "decode_roles.py", "__init__.py"}


def test_a_verdict_is_taken_only_from_a_record_of_this_gate_and_this_triton(tmp_path: Path) -> None:
    triton = pytest.importorskip("triton")
    from bench.compile_check import Result
    from bench.compile_records import Verdict, flags_of, gate_hash, recorded_verdicts

    assert flags_of(Result(registers=80)) == "-"
    assert flags_of(Result(error="compiler process killed by SIGABRT")) == "e"
    assert flags_of(Result(spill_stores=12, problems=["spills 12 B stores"])) == "s"
    assert flags_of(Result(problems=["shared memory 240000 B over sm_90's 232448 B"])) == "m"
    assert flags_of(Result(problems=["something else"])) == "f"

    line = "OK   sm_90 _band_fwd        regs 179 ..."
    ok = Verdict(Verdict.id_of("key" + repr(["case"])), "a" * 20, "-", line)
    record = {"triton": triton.__version__, "gate_sha256": gate_hash(), "started": "2026-12-07T07:00:00Z",
              "lines": [line, "compile_check: passed: ..."], "entries": [ok.entry()]}
    path = record_path(triton.__version__, tmp_path)
    assert recorded_verdicts(triton.__version__, tmp_path) == ({}, "")  # no record
    path.write_text(json.dumps(record))
    assert recorded_verdicts(triton.__version__, tmp_path) == ({ok.compile_id: ok}, "2026-12-07T07:00:00Z")
    for change in [{"gate_sha256": "0" * 64}, {"triton": "3.1.0"}]:  # other gate code, another Triton's
        path.write_text(json.dumps({**record, **change}))
        assert recorded_verdicts(triton.__version__, tmp_path) == ({}, "")
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "entries"}))  # made before verdicts
    assert recorded_verdicts(triton.__version__, tmp_path)[0] == {}


# Runs the gate on glue.py's, step_write.py's and step_compress.py's kernels at the tiny
# config's shapes (a few compiles), with the kernels' sources hashed from a copy that the
# test edits and the record written to a directory of its own.
SMALL_GATE = '''
import sys
from pathlib import Path

import bench.compile_check as cc
import bench.compile_records as cr

cr.KERNEL_DIR, cr.RESULTS_DIR = Path(sys.argv[1]), Path(sys.argv[2])
MODULES = ["nsa.ops.triton.glue", "nsa.ops.triton.step_write", "nsa.ops.triton.step_compress"]
config_shapes, drive_ops = cc.config_shapes, cc.drive_ops
cc.package_modules = lambda: list(MODULES)
cc.config_shapes = lambda: ([s for s in config_shapes()[0] if s.label == "tiny-cpu"], [])
cc.layout_shapes = lambda: []
cc.drive_ops = lambda s, sms, cap: [x for x in drive_ops(s, sms, cap) if x.kernel.fn.__module__ in MODULES]
sys.exit(cc.main(sys.argv[3:]))
'''


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_record_compiles_again_only_what_a_change_reaches(tmp_path: Path) -> None:
    """``--record`` after a kernel source changed compiles the compiles of the kernels that
    reach it and takes the others' verdicts from the record; a stopped record goes on where
    it stopped; ``--reuse-record`` (CI) does the same without writing; ``--fresh`` compiles
    everything."""
    pytest.importorskip("triton")
    from tests.compiled import compiled_env

    kernels, results = tmp_path / "kernels", tmp_path / "results"
    kernels.mkdir()
    for path in KERNEL_DIR.glob("*.py"):
        shutil.copy(path, kernels / path.name)
    script = tmp_path / "small_gate.py"
    script.write_text(SMALL_GATE)

    def gate(*args: str) -> tuple[str, dict]:
        out = subprocess.run([sys.executable, str(script), str(kernels), str(results), "--arch", "90", *args],
                             cwd=ROOT, env=compiled_env(), capture_output=True, text=True, timeout=560)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        files = list(results.glob("compile-triton-*.json"))
        return out.stdout, json.loads(files[0].read_text()) if files else {}

    def kernel(line: str) -> str:
        return line.split()[2]

    _, first = gate("--record")
    n = first["compiles"]
    names = [kernel(line) for line in first["lines"][:n]]
    assert first["complete"] and first["passed"] and first["reused"] == 0 and len(first["entries"]) == n
    assert {"_step_write", "_compress_finish", "_rope_kernel"} <= set(names), names
    assert first["kernels_sha256"] == kernels_hash(kernels)

    def edit(name: str) -> None:
        (kernels / name).write_text((kernels / name).read_text() + "\n")

    edit("step_write.py")  # reaches itself and glue.py: only _step_write compiles again
    out, second = gate("--record")
    kept = sum(name != "_step_write" for name in names)
    assert f"compile_check: {kept} of {n} compiles have a verdict" in out
    assert second["reused"] == kept and second["reused_from"] == [first["started"]]
    assert second["complete"] and second["passed"] and second["kernels_sha256"] == kernels_hash(kernels)
    assert sorted(second["lines"][:n]) == sorted(first["lines"][:n])  # compiling is deterministic

    stopped = dict(second, complete=False, passed=False, compiled=3, lines=second["lines"][:3],
                   entries=second["entries"][:3])
    record_path_in(results).write_text(json.dumps(stopped))
    out, resumed = gate("--record")  # a record stopped after three compiles goes on from there
    assert f"compile_check: 3 of {n} compiles have a verdict" in out
    assert resumed["reused"] == 3 and resumed["complete"] and resumed["passed"]
    assert sorted(resumed["lines"][:n]) == sorted(first["lines"][:n])

    edit("glue.py")  # every kernel here but step_compress.py's reaches it
    kept = sum(name.startswith("_compress") for name in names)
    assert 0 < kept < n
    out, _ = gate("--reuse-record")
    assert f"compile_check: {kept} of {n} compiles have a verdict" in out and "compile_check: passed" in out
    assert json.loads(record_path_in(results).read_text())["started"] == resumed["started"]  # not rewritten

    out, fresh = gate("--record", "--fresh")
    assert "have a verdict" not in out and fresh["reused"] == 0 and fresh["complete"] and fresh["passed"]


def record_path_in(results: Path) -> Path:
    (path,) = results.glob("compile-triton-*.json")
    return path
