"""Host specs with a runs root of their own: ``gpu1:/scratch/runs``, never a port taken for one."""

from nsa_tui.hosts.spec import runs_root_for, split_runs_root


def test_a_runs_root_follows_a_colon_and_a_slash_or_tilde() -> None:
    assert split_runs_root("gpu1:/scratch/runs") == ("gpu1", "/scratch/runs")
    assert split_runs_root("me@gpu1:~/runs") == ("me@gpu1", "~/runs")
    assert split_runs_root("me@127.0.0.1:2222:/data/runs") == ("me@127.0.0.1:2222", "/data/runs")


def test_a_port_or_a_plain_host_has_no_runs_root() -> None:
    assert split_runs_root("me@127.0.0.1:2222") == ("me@127.0.0.1:2222", None)
    assert split_runs_root("gpu2") == ("gpu2", None)


def test_the_specs_root_wins_then_the_settings_then_the_default() -> None:
    per_host = {"gpu2": "/scratch/b", "gpu1": "/scratch/ignored"}
    assert runs_root_for("gpu1:/scratch/a", "/d", per_host) == "/scratch/a"
    assert runs_root_for("gpu2", "/d", per_host) == "/scratch/b"
    assert runs_root_for("gpu3", "/d", per_host) == "/d"
    assert runs_root_for("gpu3", None, None) is None
