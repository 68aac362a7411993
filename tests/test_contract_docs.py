"""The contract pages say the same as the code: every field table of a record in
docs/run-directory.md and docs/agent-protocol.md lists exactly its Struct's fields, and
every record the contract defines for those files and messages has a table."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from nsa.contract import evals, protocol, records, replies, requests, series, slurm

DOCS = Path(__file__).resolve().parents[1] / "docs"
# "## file — `Struct`", "text — `Struct`:", "`Struct` — text:", "`Struct`:" or "`Struct` (note):"
ANCHOR = re.compile(r"^(?:`(\w+)` — .*|.*— `(\w+)`:?|`(\w+)`(?: \([^)]*\))?:)\s*$")
STRUCTS = {name: obj for mod in (records, series, protocol, requests, replies, evals, slurm)
           for name, obj in vars(mod).items()
           if isinstance(obj, type) and issubclass(obj, msgspec.Struct)}
RUN_DIRECTORY = ["RunInfo", "AttentionOps", "CpuThreads", "CudaGraph", "LaunchInfo", "Lease", "ExitInfo",
                 "StopInfo", "Relaunch", "Archived", "SlurmJob", "SlurmRequest", "SlurmState",
                 "Beat", "DeviceInfo", "TrainMetric", "GateShares", "EvalMetric", "EpochMetric",
                 "MetricsSummary", "SeriesData", "AlertEvent", "Alert", "CheckpointMeta", "PasskeyEval",
                 "LossBucket"]
PROTOCOL = ["Hello", "Request", "Reply", "EventMsg", "LaunchResult", "KillResult", "DumpResult",
            "MissingRank", "ConfigSummary", "ActionPlan", "DeleteResult", "LogChunk", "RunView",
            "RunStatusReport", "WatchArgs", "Gap", "Synced", "HostSample", "Usage", "GpuReading",
            "AlertState", "AlertList", "Evidence", "LaunchArgs", "SampleArgs", "SampleStart",
            "SampleText", "SampleDone", "EvalArgs", "EvalStart", "EvalProgress", "EvalList"]


def documented_tables(text: str) -> dict[str, set[str]]:
    """Struct name -> the field names in the first table after its anchor line."""
    lines = text.splitlines()
    out: dict[str, set[str]] = {}
    for i, line in enumerate(lines):
        m = ANCHOR.match(line.strip())
        if not m:
            continue
        name = next(g for g in m.groups() if g)
        fields: set[str] = set()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("|"):
            if ANCHOR.match(lines[j].strip()):
                break
            j += 1
        rows = []
        while j < len(lines) and lines[j].startswith("|"):
            rows.append(lines[j])
            j += 1
        for row in rows[2:]:  # header and separator first
            first = row.split("|")[1]
            fields |= set(re.findall(r"`(\w+)`", first))
        if fields:
            out[name] = fields
    return out


def struct_fields(cls: type) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(cls)}


@pytest.mark.parametrize("page,required", [("run-directory.md", RUN_DIRECTORY),
                                           ("agent-protocol.md", PROTOCOL)])
def test_field_tables_match_the_structs(page: str, required: list[str]) -> None:
    tables = documented_tables((DOCS / page).read_text())
    missing = [n for n in required if n not in tables]
    assert not missing, f"{page}: no field table for {missing}"
    for name, fields in tables.items():
        assert name in STRUCTS, f"{page}: `{name}` is not a Struct of nsa.contract"
        want = struct_fields(STRUCTS[name])
        assert fields == want, (f"{page}: {name}: documented but not in the code: {sorted(fields - want)}; "
                                f"in the code but not documented: {sorted(want - fields)}")


def test_the_check_catches_a_drift() -> None:
    text = "`Beat` — one line:\n\n| field | type | meaning |\n|---|---|---|\n| `ts` | float | x |\n"
    assert documented_tables(text) == {"Beat": {"ts"}}
    assert documented_tables(text)["Beat"] != struct_fields(records.Beat)


def test_every_status_and_phase_is_documented() -> None:
    from nsa.contract import Phase, RunStatus

    text = (DOCS / "run-directory.md").read_text() + (DOCS / "agent-protocol.md").read_text()
    for value in [s.value for s in RunStatus] + [p.value for p in Phase]:
        assert f"`{value}`" in text, value
