"""Tuning logs: JSON lines, one record per measurement, appended atomically, read to resume.

A record: {"workload", "template", "task", "target", "config": {"index", "knobs"}, "cost" (median
seconds or null), "costs", "gflops", "error": null or {"kind", "detail"}, "build_s", "timestamp",
"version", "schedule"}: "schedule" (version 2 on) is the candidate's schedule as data
(`Schedule.record()`: stages and steps), which `ember.compile` replays. Appends take an exclusive
lock on the file, write whole lines (one write per batch), flush and fsync, so a killed tuner
leaves every finished record and at most one torn line at the end, which readers skip and the next
append starts after. Readers (`read_records`) take the file as bytes and each line alone: a line that
is not a record (invalid UTF-8 or JSON, fields of the wrong types) is skipped, with one warning naming
the file and the lines; records of version 1 (no "schedule") are read as before.
`ember.te.config.load_tuned` picks the best record per workload;
`TuningLog.measured` gives what a resumed run must not measure again.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from ember.te.config import ConfigEntity, load_best, read_records
from ember.tune.measure import MeasureResult

VERSION = 2  # 2: records carry the schedule

__all__ = ["TuningLog", "load_best", "make_record", "read_records"]


def make_record(task: Any, result: MeasureResult) -> dict:
    ok = result.ok
    return {
        "workload": task.workload,
        "template": task.template,
        "task": task.name,
        "target": task.target,
        "config": result.config.to_json(),
        "cost": result.cost if ok else None,
        "costs": list(result.costs),
        "gflops": round(result.gflops(task.flops), 4) if ok else 0.0,
        "error": None if ok else {"kind": result.error or "runtime", "detail": result.detail},
        "build_s": round(result.build_s, 4),
        "timestamp": result.timestamp or time.time(),
        "version": VERSION,
        "schedule": result.schedule,
    }


def result_of(rec: dict) -> MeasureResult:
    """A log record back as a MeasureResult."""
    cfg = ConfigEntity.from_json(rec["config"], rec.get("template", ""))
    err = rec.get("error")
    if err:
        return MeasureResult(cfg, error=err.get("kind", "runtime"), detail=err.get("detail", ""),
                             timestamp=rec.get("timestamp", 0.0), schedule=rec.get("schedule"))  # fmt: skip
    return MeasureResult(cfg, costs=tuple(rec.get("costs") or [rec["cost"]]), build_s=rec.get("build_s", 0.0),
                         timestamp=rec.get("timestamp", 0.0), schedule=rec.get("schedule"))  # fmt: skip


class TuningLog:
    """An append-only JSON-lines file of measurement records."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def append(self, records: list[dict]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # a torn line from a killed writer stays alone on its line
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def records(self, workload: str | None = None, target: str | None = None) -> list[dict]:
        def keep(r: dict) -> bool:
            return (workload is None or r["workload"] == workload) and (target is None or r.get("target") == target)

        return [r for r in read_records(self.path) if keep(r)]

    def measured(self, workload: str, target: str) -> dict[str, dict]:
        """Records of a workload on a target by config key (the last record of a config wins)."""
        out = {}
        for r in self.records(workload, target):
            cfg = ConfigEntity.from_json(r["config"])
            out[cfg.key()] = r
        return out

    def best(self, target: str) -> dict[str, ConfigEntity]:
        return load_best(self.path, target)
