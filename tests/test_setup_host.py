"""The decisions of ``nsa-tui setup`` that need no host (the SSH runs: tests/transport/test_setup.py)."""

from __future__ import annotations

from nsa_tui.install.setup_host import _absolute, needs_new_venv, torch_plan


def test_prefix_is_under_the_remote_home_unless_absolute() -> None:
    assert _absolute("~/.nsa-tui", "/home/u") == "/home/u/.nsa-tui"
    assert _absolute("~", "/home/u") == "/home/u"
    assert _absolute("opt/nsa", "/home/u") == "/home/u/opt/nsa"
    assert _absolute("/srv/nsa tui", "/home/u") == "/srv/nsa tui"


def test_venv_is_made_again_only_for_another_interpreter() -> None:
    base = {"python": "3.12", "base_prefix": "/opt/conda"}
    assert needs_new_venv(None, base)
    assert not needs_new_venv({"python": "3.12", "base_prefix": "/opt/conda", "prefix": "/x/venv"}, base)
    assert needs_new_venv({"python": "3.11", "base_prefix": "/opt/conda"}, base)
    assert needs_new_venv({"python": "3.12", "base_prefix": "/usr"}, base)


def test_the_torch_sentence_says_what_will_happen() -> None:
    probe = {"torch": {"version": "2.11.0+cu130", "location": "/opt/conda/lib/python3.12/site-packages"}}
    assert torch_plan(probe, "python3", False) == (
        True, "host torch 2.11.0+cu130 from /opt/conda/lib/python3.12/site-packages (kept)")
    kept, text = torch_plan({"torch": None}, "python3", False)
    assert not kept and text == "no torch found with python3: pip will install one (several GB)"
    kept, text = torch_plan({"torch": None}, "python3", True)
    assert not kept and "--no-deps installs none" in text
