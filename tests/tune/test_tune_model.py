"""Task extraction matches the compiler's kernels; a log's best configs are applied by ember.compile;
`ember tune` killed mid-run and restarted loses no record and measures nothing twice."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.templates import nn as T
from ember.tune import TuningLog, extract_tasks

LANES = T.lanes_of("float32", T.host_target())
ROOT = Path(__file__).resolve().parents[2]


def small_model() -> onnx.ModelProto:
    """conv A (4 -> LANES) -> relu -> conv B -> relu -> conv C (B's workload again) -> relu."""
    rng = np.random.default_rng(0)
    c = LANES

    def conv(name, x, cin):
        w = numpy_helper.from_array(rng.standard_normal((c, cin, 3, 3)).astype(np.float32) * 0.2, f"{name}_w")
        b = numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), f"{name}_b")
        node = helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_y"], pads=[1, 1, 1, 1])
        relu = helper.make_node("Relu", [f"{name}_y"], [f"{name}_r"])
        return [node, relu], [w, b]

    nodes, inits = [], []
    x = "x"
    for name, cin in (("a", 4), ("b", c), ("c", c)):
        n, i = conv(name, x, cin)
        nodes += n
        inits += i
        x = f"{name}_r"
    g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, 6, 6])], inits)  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("model") / "small.onnx"
    onnx.save(small_model(), str(p))
    return p


def test_extract_tasks_and_apply_best(model_path, tmp_path):
    tasks = extract_tasks(str(model_path), "c")
    assert sorted(t.weight for t in tasks) == [1, 2]
    assert all(t.template == "conv_oc" and len(t.space) > 1 for t in tasks)
    assert len({t.workload for t in tasks}) == 2
    # a log naming a non-default config for each workload: ember.compile applies it, the answer is unchanged
    log = TuningLog(tmp_path / "log.jsonl")
    recs = []
    for t in tasks:
        cfg = t.space.entity({"tile_ow": (-1, 1), "unroll_tile": ("none", "unroll")})
        assert cfg.index != t.space.fallback().index
        recs.append({"workload": t.workload, "template": t.template, "target": t.target, "config": cfg.to_json(),
                     "cost": 1e-6, "error": None})  # fmt: skip
    log.append(recs)
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)
    base = ember.compile(str(model_path), "c")
    tuned = ember.compile(str(model_path), "c", tuning_log=str(log.path))
    assert tuned.summary()["tuned_workloads"] == 2
    assert tuned.source != base.source
    np.testing.assert_allclose(tuned(x), base(x), rtol=1e-5, atol=1e-5)


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_cli_tune_killed_and_resumed(model_path, tmp_path):
    log = tmp_path / "tune.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "ember.cli", "tune", str(model_path), "--trials", "4", "--log", str(log),
           "--tuner", "random", "--batch-size", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 60
    while time.time() < deadline and len(_records(log)) < 2 and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = _records(log)
    assert 2 <= len(first) < 8, "the run was not killed mid-way"
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    final = _records(log)
    assert final[: len(first)] == first  # nothing lost or rewritten
    assert len(final) == 8  # 4 trials x 2 workloads in all: nothing measured twice
    keys = [(r["workload"], json.dumps(r["config"]["knobs"], sort_keys=True)) for r in final]
    assert len(set(keys)) == len(keys)
    assert "measured now" in out.stdout and f"{len(first)} from the log" in out.stdout


def test_tuning_log_replays_its_stored_schedule(model_path, tmp_path):
    """Records store the measured schedule (stages and steps); ember.compile replays them, and the kernels are
    those the template builds from the same configs (a log without schedules, as written before, still loads)."""
    from ember.tune import Measurer, tune_tasks

    log = tmp_path / "tune.jsonl"
    tasks = extract_tasks(str(model_path), "c")
    with Measurer(n_parallel=2, repeat=1, min_time=0.0) as m:
        tune_tasks(tasks, "random", 3, str(log), measurer=m, progress=False)
    records = _records(log)
    assert len(records) == 6 and all(r["version"] == 2 for r in records)
    assert all(r["schedule"]["steps"] and r["schedule"]["stages"] for r in records)
    x = np.random.default_rng(2).standard_normal((1, 4, 6, 6)).astype(np.float32)
    replayed = ember.compile(str(model_path), "c", tuning_log=str(log))
    assert replayed.summary()["tuned_workloads"] == 2 and replayed.summary()["replayed_workloads"] == 2
    old = tmp_path / "old.jsonl"  # the same records without their schedules: the configs go through the templates
    old.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "schedule"}) + "\n" for r in records))
    templated = ember.compile(str(model_path), "c", tuning_log=str(old))
    assert templated.summary()["tuned_workloads"] == 2 and templated.summary()["replayed_workloads"] == 0
    assert replayed.source == templated.source
    np.testing.assert_allclose(replayed(x), ember.compile(str(model_path), "c")(x), rtol=1e-5, atol=1e-5)


def test_a_schedule_for_another_compute_is_not_replayed(model_path, tmp_path):
    """A record whose stages are not the kernel's (its steps were made for another compute) gives way to the
    template with the record's config."""
    tasks = extract_tasks(str(model_path), "c")
    recs = []
    for t in tasks:
        cfg = t.space.entity({"tile_ow": (-1, 1), "unroll_tile": ("none", "unroll")})
        sch = t.instantiate(cfg)[0].record()
        sch["stages"] = sch["stages"] + ["T_elsewhere"]
        recs.append({"workload": t.workload, "template": t.template, "target": t.target, "config": cfg.to_json(),
                     "cost": 1e-6, "error": None, "schedule": sch})  # fmt: skip
    TuningLog(tmp_path / "log.jsonl").append(recs)
    m = ember.compile(str(model_path), "c", tuning_log=str(tmp_path / "log.jsonl"))
    assert m.summary()["tuned_workloads"] == 2 and m.summary()["replayed_workloads"] == 0


def _proc_stat(pid: int) -> tuple[int, int, str, str] | None:
    """(ppid, session id, state, start time) of a live process, None when it is gone (zombies are gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[1]), int(fields[3]), fields[0], fields[19]) if fields[0] not in "ZX" else None


def _all_procs() -> dict[int, tuple[int, int, str, str]]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _proc_stat(int(d.name))
            if st is not None:
                out[int(d.name)] = st
    return out


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of root."""
    procs = _all_procs()
    out, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _, start) in procs.items():
            if ppid == parent and pid not in out:
                out[pid] = start
                frontier.append(pid)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cli_tune_killed_leaves_no_orphans(model_path, tmp_path):
    """kill -9 of `ember tune` while it has build workers (and a runner): within seconds no process it started
    is left, neither in its session nor elsewhere (the runner has its own session)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "ember.cli", "tune", str(model_path), "--trials", "64", "--log",
           str(tmp_path / "tune.jsonl"), "--tuner", "random", "--batch-size", "4"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    children: dict[int, str] = {}
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            children = _descendants(proc.pid)
            workers = [p for p in children if _proc_stat(p) and _proc_stat(p)[0] == proc.pid]
            if len(workers) >= 2 and (tmp_path / "tune.jsonl").exists():  # build workers and the runner
                break
            time.sleep(0.05)
        assert proc.poll() is None and len(children) >= 2, "ember tune ended or started no workers"
        children = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the tuner only: what it started must follow on its own
        proc.wait()
        deadline = time.time() + 10
        while time.time() < deadline:
            left = {p for p, st in _all_procs().items() if st[1] == proc.pid}
            left |= {p for p, start in children.items() if (_proc_stat(p) or (0, 0, "", ""))[3] == start}
            if not left:
                break
            time.sleep(0.1)
        assert not left, f"orphans of the killed tuner: {sorted(left)}"
    finally:  # a failed run leaves nothing either
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p, start in children.items():
            if (_proc_stat(p) or (0, 0, "", ""))[3] == start:
                os.kill(p, signal.SIGKILL)
        proc.wait()
