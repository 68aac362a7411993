"""The rotation-aware reader of appended files (nsa/contract/appended.py): positions name the
file's generation, so a rotated or replaced file is never read as if it were the old one."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from nsa.contract.appended import (
    DEFAULT_ROTATE_BYTES,
    AppendedReader,
    RotatingJsonl,
    StreamPos,
    position_at_end,
    rotate_bytes,
    rotated_path,
    tail,
)


def _numbers(lines: list) -> list[int]:
    return [int(ln.text.split(":")[1].rstrip("}")) for ln in lines]


def test_a_reader_follows_rotations_and_reads_every_line_once_in_order(tmp_path: Path) -> None:
    """Reads between any writes, across many rotations (each read at most one behind): every
    line exactly once, in order, whichever file it was in when read."""
    path = tmp_path / "rank-0.jsonl"
    w = RotatingJsonl(path, max_bytes=1024)
    reader = AppendedReader(path)
    got: list[int] = []
    gens: set[str] = set()
    for n in range(3000):
        w.write({"n": n})
        if n % 7 == 0:  # several lines per read, and a rotation now and then between reads
            while lines := reader.read():
                got += _numbers(lines)
                gens.add(reader.pos.gen)
    while lines := reader.read():
        got += _numbers(lines)
    w.close()
    assert got == list(range(3000))
    assert len(gens) > 20 and reader.lost == 0  # many generations, none lost


def test_a_position_in_the_rotated_file_resumes_there_then_goes_on_in_the_fresh_one(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = RotatingJsonl(path, max_bytes=1024)
    for n in range(10):
        w.write({"n": n})
    first = AppendedReader(path)
    assert _numbers(first.read()) == list(range(10))
    pos = first.pos
    n = 10
    while not rotated_path(path).exists() or path.stat().st_size == 0:
        w.write({"n": n})
        n += 1
    later = AppendedReader(path, pos)
    assert later.behind() == rotated_path(path).stat().st_size - pos.offset + path.stat().st_size
    got = []
    while lines := later.read():
        got += _numbers(lines)
    assert got == list(range(10, n))
    assert later.pos.gen != pos.gen and later.pos.gen == position_at_end(path).gen


def test_a_file_rewritten_in_place_is_a_new_generation_not_a_continuation(tmp_path: Path) -> None:
    """Same inode, same or larger size, different content (what inode reuse after a rotation
    looks like): a byte offset alone would continue in the middle of the new file."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"n":{n}}}\n' for n in range(5)))
    reader = AppendedReader(path, rotates=False)
    assert _numbers(reader.read()) == [0, 1, 2, 3, 4]
    ino = path.stat().st_ino
    with open(path, "r+") as f:  # the same inode, new lines, longer than before
        f.truncate(0)
        f.write("".join(f'{{"n":{n}}}\n' for n in range(100, 110)))
    assert path.stat().st_ino == ino
    assert reader.behind() is None  # the position's file is gone
    assert _numbers(reader.read()) == list(range(100, 110))
    assert reader.lost == 1


def _settle(path: Path) -> None:
    """Date the file's last write a minute back, as a file nobody wrote lately."""
    old = time.time_ns() - 60 * 10**9
    os.utime(path, ns=(old, old))


def test_an_unchanged_file_costs_one_stat_and_every_change_after_is_read(tmp_path: Path) -> None:
    """Polling an idle file opens it no more; a write, a same-size rewrite in place, a
    rotation or a replacement is read at the next poll all the same."""
    path = tmp_path / "rank-0.jsonl"
    path.write_text("".join(f'{{"n":{n}}}\n' for n in range(3)))
    _settle(path)
    reader = AppendedReader(path)
    assert _numbers(reader.read()) == [0, 1, 2]
    opens = reader.opens
    for _ in range(5):
        assert reader.read() == []
    assert reader.opens == opens  # answered by a stat
    with open(path, "a") as f:
        f.write('{"n":3}\n')
    assert _numbers(reader.read()) == [3]
    _settle(path)
    assert reader.read() == [] and reader.read() == []
    gen = reader.pos.gen
    with open(path, "r+") as f:  # the same inode and size, new lines: another generation
        f.write('{"n":7}\n{"n":8}\n{"n":9}\n{"n":6}\n')
    assert _numbers(reader.read()) == [7, 8, 9, 6] and reader.pos.gen != gen and reader.lost == 1
    _settle(path)
    assert reader.read() == []
    os.replace(path, rotated_path(path))  # rotated: the rest of the old file, then the fresh one
    with open(rotated_path(path), "a") as f:
        f.write('{"n":10}\n')
    path.write_text('{"n":11}\n')
    got = []
    while lines := reader.read():
        got += _numbers(lines)
    assert got == [10, 11]
    _settle(path)
    assert reader.read() == []
    fresh = tmp_path / "fresh"
    fresh.write_text('{"n":20}\n{"n":21}\n')
    os.replace(fresh, path)  # replaced
    assert _numbers(reader.read()) == [20, 21]


def test_a_written_file_is_not_trusted_on_its_stamps_until_they_settle(tmp_path: Path) -> None:
    """Time stamps are coarse: a file written a moment ago may change again within the same
    tick, to the same size. It is opened at every poll until its stamps are old enough."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"n":1}\n')
    reader = AppendedReader(path, rotates=False)
    assert _numbers(reader.read()) == [1]
    with open(path, "r+") as f:  # at once: the same inode and size, maybe the same stamps
        f.write('{"n":2}\n')
    assert _numbers(reader.read()) == [2] and reader.lost == 1


def test_a_read_cut_at_its_byte_limit_says_more_is_waiting(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {n}\n" for n in range(100)))
    reader = AppendedReader(path, rotates=False)
    first = reader.read(max_bytes=100)
    assert first and reader.more
    rest = []
    while lines := reader.read(max_bytes=100):
        rest += lines
    assert not reader.more and len(first) + len(rest) == 100


def test_a_position_whose_file_rotated_twice_is_lost_and_the_current_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = RotatingJsonl(path, max_bytes=1024)
    w.write({"n": 0})
    reader = AppendedReader(path)
    reader.read()
    old = reader.pos
    for n in range(1, 400):  # over 3 KiB: rotated at least twice
        w.write({"n": n})
    assert AppendedReader(path, old).behind() is None
    got = _numbers(reader.read())
    assert reader.lost == 1 and got[0] > 1 and got[-1] == 399 and got == list(range(got[0], 400))


def test_an_incomplete_line_is_held_back_and_an_empty_file_has_no_generation_yet(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"half a li")
    reader = AppendedReader(path, rotates=False)
    assert reader.read() == [] and reader.pos == StreamPos() and position_at_end(path) == StreamPos()
    with open(path, "ab") as f:
        f.write(b"ne\nnext")
    lines = reader.read()
    assert [ln.text for ln in lines] == ["half a line"] and reader.pos.offset == 12 and reader.pos.gen


def test_tail_positions_name_the_file_they_came_from(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {n}\n" for n in range(1000)))
    lines, pos = tail(path, 5, 200)
    assert [ln.text for ln in lines] == [f"line {n}" for n in range(995, 1000)]
    assert pos == position_at_end(path) and pos.offset == path.stat().st_size
    with open(path, "a") as f:
        f.write("line 1000\n")
    assert [ln.text for ln in AppendedReader(path, pos, rotates=False).read()] == ["line 1000"]


def test_the_skip_to_the_tail_lands_on_a_line_start(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {n}\n" for n in range(1000)))
    reader = AppendedReader(path, rotates=False)
    skipped = reader.skip_to_tail(100)
    lines = reader.read()
    assert lines[-1].text == "line 999" and all(ln.text.startswith("line ") for ln in lines)
    assert skipped + sum(len(ln.text) + 1 for ln in lines) == path.stat().st_size


@pytest.mark.parametrize("value,expected", [("", DEFAULT_ROTATE_BYTES), ("4096", 4096), ("16k", 16 << 10),
                                            ("32M", 32 << 20)])
def test_rotate_bytes_reads_its_environment_variable(value: str, expected: int) -> None:
    assert rotate_bytes({"NSA_ROTATE_BYTES": value}) == expected


@pytest.mark.parametrize("value", ["12", "lots", "-5k"])
def test_a_bad_rotate_bytes_is_refused_with_its_name(value: str) -> None:
    with pytest.raises(ValueError, match="NSA_ROTATE_BYTES"):
        rotate_bytes({"NSA_ROTATE_BYTES": value})


def test_the_trainers_heartbeats_rotate_at_the_size_of_the_environment(tmp_path: Path, monkeypatch) -> None:
    from nsa.contract import DeviceInfo
    from nsa.train.telemetry import Heartbeat, ensure_run_dir

    monkeypatch.setenv("NSA_ROTATE_BYTES", "2k")
    rd = ensure_run_dir(tmp_path / "run")
    hb = Heartbeat(rd, "rid", 0, 0, 1, DeviceInfo(), interval_s=100)
    assert hb.writer.max_bytes == 2048
    for step in range(1, 40):
        hb.step_beat(step)
    hb.writer.close()
    path = rd / "heartbeats" / "rank-0.jsonl"
    assert rotated_path(path).stat().st_size >= 2048 and os.path.getsize(path) < 2048
