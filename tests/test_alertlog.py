"""alerts.jsonl: the ledger's transitions, the book's fold, acknowledgements (real files)."""

from __future__ import annotations

from pathlib import Path

from nsa.contract import Alert, AlertEvent, decode_lines
from nsa_tui.health.ledger import ALERTS_FILE, AlertBook, AlertLedger, acknowledge


def stall(rank: int = 1, age: float = 70.0, severity: str = "critical", step: int = 20) -> Alert:
    return Alert(kind="stall", severity=severity, host="h", run="r", rank=rank, last_step=step,  # type: ignore[arg-type]
                 heartbeat_age_s=1.0, message=f"rank {rank}: step {step} has not advanced for {age:.0f} s")


def lines(d: Path) -> list[AlertEvent]:
    return decode_lines((d / ALERTS_FILE).read_text().splitlines(), AlertEvent)


def test_raise_update_resolve_and_a_new_id_when_it_comes_back(tmp_path: Path) -> None:
    led = AlertLedger(tmp_path / ALERTS_FILE, "r", resolve_after_s=5, update_every_s=60)
    [ev] = led.step([stall(age=70)], now=100)
    assert (ev.action, ev.id, ev.alert.run) == ("raised", "1-stall", "r")
    assert led.step([stall(age=71)], now=101) == []  # only the age changed: nothing written
    assert led.step([stall(age=72, step=21)], now=102) == []  # a number: at most once a minute
    [up] = led.step([stall(age=73, severity="warning")], now=103)  # severity: at once
    assert up.action == "updated" and up.alert.severity == "warning"
    [up] = led.step([stall(age=200, step=22, severity="warning")], now=170)
    assert up.action == "updated" and up.alert.last_step == 22
    assert led.step([], now=171) == []  # gone for less than resolve_after_s: still open
    assert led.step([stall(severity="warning", step=22)], now=172) == []  # back: the same alert
    assert led.step([], now=173) == []
    [res] = led.step([], now=178.5)
    assert (res.action, res.id) == ("resolved", "1-stall")
    [again] = led.step([stall()], now=200)
    assert (again.action, again.id) == ("raised", "2-stall")
    assert [e.action for e in lines(tmp_path)] == ["raised", "updated", "updated", "resolved", "raised"]


def test_evidence_is_attached_once_and_kept(tmp_path: Path) -> None:
    led = AlertLedger(tmp_path / ALERTS_FILE, "r")
    led.step([stall()], now=1)
    ev = led.attach(stall().key, ["stacks/rank-1-5.txt", "stacks/watchdog-5.txt"], note="stacks of 2 ranks")
    assert ev is not None and ev.alert.evidence == ["stacks/rank-1-5.txt", "stacks/watchdog-5.txt"]
    assert led.step([stall()], now=2) == []  # the detector's alert has no evidence: it is kept, not lost
    book = AlertBook(tmp_path / ALERTS_FILE)
    book.refresh()
    assert book.states["1-stall"].alert.evidence == ev.alert.evidence


def test_book_folds_incrementally_counts_bad_lines_and_acknowledges(tmp_path: Path) -> None:
    path = tmp_path / ALERTS_FILE
    led = AlertLedger(path, "r", resolve_after_s=0)
    led.step([stall(1), Alert(kind="disk", severity="warning", host="h", message="disk")], now=1)
    book = AlertBook(path)
    assert {s.id for s in book.refresh()} == {"1-stall", "2-disk"}
    with open(path, "a") as fh:
        fh.write('{"ts": "x"}\nnot json\n')
    led.step([stall(1)], now=2)  # the disk alert resolved
    changed = book.refresh()
    assert [(s.id, s.state) for s in changed] == [("2-disk", "resolved")] and book.stats.bad == 2
    st = acknowledge(tmp_path, "stall", by="me@laptop", now=3)  # by kind: one unresolved stall
    assert (st.id, st.state, st.acked_by) == ("1-stall", "acknowledged", "me@laptop")
    book.refresh()
    assert book.states["1-stall"].state == "acknowledged"
    assert [s.id for s in book.listing(history=0)] == ["1-stall"]
    assert [s.id for s in book.listing(history=5)] == ["1-stall", "2-disk"]
    # a watchdog started again on the same file continues the ids and keeps the open alert
    led2 = AlertLedger(path, "r", resolve_after_s=0)
    assert led2.step([stall(1)], now=4) == [] and led2.seq == 2
    try:
        acknowledge(tmp_path, "9-nope", by="me")
        raise AssertionError("acknowledged an alert that does not exist")
    except KeyError:
        pass


def test_a_full_disk_keeps_events_until_they_can_be_written(tmp_path: Path) -> None:
    path = tmp_path / "gone" / ALERTS_FILE
    led = AlertLedger(path, "r")
    (tmp_path / "gone").write_text("a file where the directory should be: every write fails")
    led.step([stall()], now=1)
    assert [e.action for e in led.pending] == ["raised"]
    (tmp_path / "gone").unlink()
    led.step([stall(), Alert(kind="disk", severity="warning", host="h", message="d")], now=2)
    assert led.pending == [] and [e.id for e in lines(tmp_path / "gone")] == ["1-stall", "2-disk"]
