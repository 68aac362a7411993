"""Child processes that import the same code as this one (agent, supervisor, ranks)."""

from __future__ import annotations

import os
import site
from pathlib import Path


def env_with_package_path(env: dict[str, str], package_file: str) -> dict[str, str]:
    """``env`` whose PYTHONPATH finds the package that ``package_file`` belongs to.

    Why: a source checkout that is not pip-installed must still give the agent and the
    ranks the same code as this process. A package inside site-packages needs nothing
    (and site-packages on PYTHONPATH would shadow the standard library).
    """
    root = str(Path(package_file).resolve().parent.parent)
    sites = {str(Path(p).resolve()) for p in site.getsitepackages() + [site.getusersitepackages()]}
    if root in sites:
        return env
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env = dict(env, PYTHONPATH=os.pathsep.join([root, *parts]))
    return env
