"""The wheel ``nsa-tui setup`` ships: a valid, reproducible copy of what setuptools would build."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import nsa_tui
from nsa_tui.install.wheel import build_wheel

REPO = Path(__file__).resolve().parents[1]


def _zip(data: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(data))


def test_wheel_is_valid_and_reproducible() -> None:
    w = build_wheel()
    assert build_wheel().data == w.data  # same code, same bytes: the host cache can trust the name
    assert re.fullmatch(rf"{re.escape(nsa_tui.__version__)}\+h[0-9a-f]{{12}}", w.version)
    assert w.filename == f"nsa_tui-{w.version}-py3-none-any.whl"
    zf = _zip(w.data)
    info = f"nsa_tui-{w.version}.dist-info"
    names = zf.namelist()
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert {"nsa/__init__.py", "nsa_tui/cli/main.py", "nsa_tui/configs/demo-cpu.yaml",
            "nsa_tui/app/panel.tcss",
            f"{info}/METADATA", f"{info}/WHEEL", f"{info}/entry_points.txt", f"{info}/RECORD"} <= set(names)
    meta = Parser().parsestr(zf.read(f"{info}/METADATA").decode())
    assert meta["Name"] == "nsa-tui" and meta.get_all("Version") == [w.version]
    assert "host" in meta.get_all("Provides-Extra")
    assert "nsa-tui = nsa_tui.cli.main:main" in zf.read(f"{info}/entry_points.txt").decode()
    rows = [line.split(",") for line in zf.read(f"{info}/RECORD").decode().splitlines()]
    assert sorted(r[0] for r in rows) == sorted(names)
    for name, digest, size in rows:
        if name == f"{info}/RECORD":
            assert digest == size == ""
            continue
        data = zf.read(name)
        expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expect}" and int(size) == len(data), name


def test_wheel_ships_the_files_setuptools_would(tmp_path: Path) -> None:
    """Same package files and metadata as ``pip wheel`` of this checkout (package-data kept in step)."""
    if not (REPO / "pyproject.toml").is_file() or Path(nsa_tui.__file__).resolve().parent != REPO / "nsa_tui":
        pytest.skip("needs a source checkout")
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("nsa", "nsa_tui"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    out = subprocess.run([*pip, "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    theirs = _zip(next((tmp_path / "dist").glob("*.whl")).read_bytes())
    w = build_wheel()
    ours = _zip(w.data)

    def files(zf: zipfile.ZipFile) -> dict[str, bytes]:
        return {n: zf.read(n) for n in zf.namelist() if ".dist-info/" not in n}

    assert files(ours) == files(theirs)

    def meta(zf: zipfile.ZipFile, info: str) -> tuple[list[str], list[str], str]:
        m = Parser().parsestr(zf.read(f"{info}/METADATA").decode())
        return sorted(m.get_all("Requires-Dist")), sorted(m.get_all("Provides-Extra")), m["Requires-Python"]

    theirs_info = f"nsa_tui-{nsa_tui.__version__}.dist-info"
    assert meta(ours, f"nsa_tui-{w.version}.dist-info") == meta(theirs, theirs_info)


def test_an_extras_requirements_come_one_by_one_without_the_extra() -> None:
    """What ``nsa-tui setup`` installs beside a host torch it keeps: the extra's other packages."""
    from nsa_tui.install.wheel import extra_requirements

    host = extra_requirements("host", leave_out=("torch", "triton"))
    assert host and "numpy" in host and not any(r.startswith(("torch", "triton")) for r in host)
    assert not any("extra" in r for r in host)
    assert any(r.startswith("torch") for r in extra_requirements("host"))
    assert any(re.fullmatch(r'triton>=3\.6; sys_platform == "linux"', r) for r in extra_requirements("test"))
