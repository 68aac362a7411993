"""A wheel of the nsa-tui that is running, however it was installed.

``nsa-tui setup`` ships this wheel to hosts. It is built from the package directories
of ``nsa`` and ``nsa_tui`` (found through their ``__file__``), so the same code works
from a source checkout, an editable install or a wheel in site-packages. The metadata
(dependencies, extras, entry points) comes from the installed distribution.

The wheel is reproducible: its version carries a hash of its content
(``0.1.0+h<hash>``), so the same code always gives the same file name and the same
bytes, and a host that has it already needs no upload. A changed file gives a new
version, which pip installs over the old one.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import nsa
import nsa_tui

DIST = "nsa-tui"
PACKAGES = {"nsa": nsa, "nsa_tui": nsa_tui}
# The non-Python files each package ships: keep equal to pyproject's package-data
# (tests/transport/test_wheel.py compares the file list with a setuptools build).
PACKAGE_DATA = {"nsa_tui": ("*.tcss", "**/*.tcss", "configs/*.yaml")}
TAG = "py3-none-any"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: equal content gives equal bytes


@dataclass(frozen=True)
class Wheel:
    """A built wheel: its PEP 427 file name, bytes and version (``0.1.0+h<hash>``)."""

    filename: str
    data: bytes
    version: str
    content_hash: str


def _package_files(name: str, root: Path) -> dict[str, bytes]:
    """Archive name -> bytes: the modules of every (sub)package and the declared data files."""
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        dirs = [root.joinpath(*rel.parts[:i]) for i in range(len(rel.parts))]
        if "__pycache__" in rel.parts or not all((d / "__init__.py").is_file() for d in dirs):
            continue  # not inside a package: setuptools would not ship it either
        files[f"{name}/{rel.as_posix()}"] = path.read_bytes()
    for pattern in PACKAGE_DATA.get(name, ()):
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"{name}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return files


def _metadata_without_version(text: str) -> tuple[str, str]:
    """(METADATA with its Version line removed, the public version it named)."""
    lines = text.splitlines(keepends=True)
    # The header ends at the first blank line; the description after it may say anything.
    end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    version = next((line.split(":", 1)[1].strip() for line in lines[:end] if line.startswith("Version:")), "")
    if not version:
        raise RuntimeError(f"the installed {DIST} METADATA names no version")
    kept = [line for i, line in enumerate(lines) if i >= end or not line.startswith("Version:")]
    return "".join(kept), version.split("+", 1)[0]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _installed_metadata() -> tuple[str, str]:
    """(METADATA, entry_points.txt) of the installed distribution that runs here.

    A source checkout's ``nsa_tui.egg-info`` (written by ``pip install -e``) also counts:
    it holds the same metadata as PKG-INFO.
    """
    for dist in metadata.distributions(name=DIST):
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
        if text:
            return text, dist.read_text("entry_points.txt") or ""
    raise RuntimeError(f"{DIST} is not installed in this Python (no metadata found): "
                       "install it first (scripts/setup.sh or pip install)")


def extra_requirements(extra: str, leave_out: tuple[str, ...] = ()) -> list[str]:
    """The requirements the installed metadata gives for ``extra`` (``numpy``, ``triton>=3.6;
    sys_platform == "linux"``), without the extra in their markers and without the projects
    named in ``leave_out``: what ``pip install`` needs to add an extra's packages one by one."""
    meta, _ = _installed_metadata()
    clause = re.compile(rf'\s*(?:and\s+)?extra\s*==\s*"{re.escape(extra)}"\s*(?:and\s+)?')
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line.split(":", 1)[1].strip().partition(";")
        if not clause.search(marker):
            continue
        name = re.match(r"[A-Za-z0-9._-]+", req.strip())
        if name is None or name.group(0).lower() in leave_out:
            continue
        rest = clause.sub(" ", marker).strip()
        out.append(f"{req.strip()}; {rest}" if rest else req.strip())
    return out


def build_wheel() -> Wheel:
    """The wheel of the running nsa-tui; RuntimeError when its metadata cannot be found."""
    meta, entry_points = _installed_metadata()
    meta_rest, public = _metadata_without_version(meta)
    if public != nsa_tui.__version__:
        raise RuntimeError(f"the installed {DIST} metadata says {public} but the code is "
                           f"{nsa_tui.__version__}: reinstall it (scripts/setup.sh)")
    files: dict[str, bytes] = {}
    for name, module in PACKAGES.items():
        assert module.__file__ is not None  # regular packages (an __init__.py), not namespace ones
        files.update(_package_files(name, Path(module.__file__).resolve().parent))

    digest = hashlib.sha256()
    parts = [meta_rest.encode(), entry_points.encode()]
    for name, data in sorted(files.items()):
        parts += [name.encode(), data]
    for part in parts:  # each part with its length: no two contents give the same stream
        digest.update(len(part).to_bytes(8, "big") + part)
    content_hash = digest.hexdigest()[:12]
    version = f"{public}+h{content_hash}"

    info = f"nsa_tui-{version}.dist-info"
    head, _, body = meta_rest.partition("\n")  # Metadata-Version first, then our Version
    files[f"{info}/METADATA"] = f"{head}\nVersion: {version}\n{body}".encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: nsa_tui.install.wheel\nRoot-Is-Purelib: true\n"
                              f"Tag: {TAG}\n").encode()
    if entry_points:
        files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = "".join(f"{n},{_record_hash(b)},{len(b)}\n" for n, b in sorted(files.items()))
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            zi = zipfile.ZipInfo(name, ZIP_TIME)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, files[name])
    return Wheel(f"nsa_tui-{version}-{TAG}.whl", buf.getvalue(), version, content_hash)
