"""Measurement survives bad candidates: a compile error, a segfault, a hang and a wrong answer are
recorded as errors with their reasons, and the next candidates are measured as usual."""

import numpy as np

from ember import te
from ember.tune import Measurer, Task, TuningLog, tune_task

N = 64


def planted(cfg):
    """A template whose `mode` knob plants a bad candidate (module level: built in worker processes)."""
    mode = cfg.define_knob("mode", ["ok", "crash", "hang", "wrong", "bad_build", "ok2"])
    A = te.placeholder((N,), "float32", name="A")
    if mode == "bad_build":
        raise ValueError("this config cannot be built")
    if mode == "crash":  # reads ~1.6 GB past the end of A: a segfault
        C = te.compute((N,), lambda i: A[(i + 1) * 400_000_000], name="C")
    elif mode == "hang":  # 10^10 dependent float adds: far past the time limit
        r1 = te.reduce_axis((0, 100_000), name="r1")
        r2 = te.reduce_axis((0, 100_000), name="r2")
        C = te.compute((N,), lambda i: te.sum(A[(i + r1 + r2) % N], axis=[r1, r2]), name="C")
    elif mode == "wrong":
        C = te.compute((N,), lambda i: A[i] + 1.0, name="C")
    else:
        C = te.compute((N,), lambda i: A[i] * 2.0, name="C")
    s = te.create_schedule(C)
    if mode == "ok2":
        _, xi = s[C].split(C.op.axis[0], 8)
        s[C].unroll(xi)
    return s, [A, C]


def reference(inputs):
    return [inputs[0] * 2.0]


def test_planted_bad_candidates_are_survived(tmp_path):
    task = Task.from_template("planted", planted, reference_fn=reference)
    space = task.space
    assert len(space) == 6
    configs = [space.entity({"mode": m}) for m in ("ok", "crash", "hang", "wrong", "bad_build", "ok2")]
    with Measurer(n_parallel=2, run_timeout=3.0, repeat=2, min_time=0.001, warmup=0.0) as m:
        results = m.measure(task, configs)
        again = m.measure(task, [configs[0]])  # the runner was restarted after the crash and the hang
    kinds = [r.error for r in results]
    assert kinds == [None, "crash", "timeout", "wrong", "compile", None], [(r.error, r.detail) for r in results]
    assert "SIGSEGV" in results[1].detail or "signal" in results[1].detail
    assert "within 3 s" in results[2].detail
    assert "max abs error" in results[3].detail
    assert "cannot be built" in results[4].detail
    assert results[0].ok and results[0].cost > 0 and results[5].ok
    assert again[0].ok


def test_tuning_goes_on_past_errors(tmp_path):
    task = Task.from_template("planted", planted, reference_fn=reference)
    log = TuningLog(tmp_path / "log.jsonl")
    with Measurer(n_parallel=2, run_timeout=3.0, repeat=1, min_time=0.001, warmup=0.0) as m:
        res = tune_task(task, "grid", 6, m, log=log, batch_size=3)
    assert len(res.trials) == 6 and res.n_errors == 4
    assert res.best_config is not None and res.best_config["mode"] in ("ok", "ok2")
    recs = log.records()
    assert len(recs) == 6
    errs = {r["config"]["knobs"]["mode"]: r["error"] for r in recs}
    assert errs["ok"] is None and errs["crash"]["kind"] == "crash" and errs["hang"]["kind"] == "timeout"
    best = log.best(task.target)[task.workload]
    assert best["mode"] in ("ok", "ok2")


def test_reference_from_fallback_when_no_numpy_reference():
    task = Task.from_template("planted", planted)  # no reference_fn: the fallback config ("ok") is the oracle
    cfgs = [task.space.entity({"mode": "ok2"}), task.space.entity({"mode": "wrong"})]
    with Measurer(n_parallel=1, run_timeout=5.0, repeat=1, min_time=0.001, warmup=0.0) as m:
        ok, wrong = m.measure(task, cfgs)
    assert ok.ok and wrong.error == "wrong"
    assert np.isfinite(ok.cost)


def exits_in_build(cfg):
    """A template whose build worker dies (`os._exit(3)`) for one config: the build half of a crashing template."""
    import os

    tile = cfg.define_knob("tile", [1, 2, 4, 8, 16, 32])
    if tile == 4:
        os._exit(3)
    A = te.placeholder((N,), "float32", name="A")
    C = te.compute((N,), lambda i: A[i] * 2.0, name="C")
    s = te.create_schedule(C)
    s[C].split(C.op.axis[0], tile)
    return s, [A, C]


def test_a_dead_build_worker_costs_only_its_candidate(tmp_path):
    task = Task.from_template("exits_in_build", exits_in_build, reference_fn=reference)
    configs = list(task.space)
    assert len(configs) == 6
    with Measurer(n_parallel=2, run_timeout=5.0, repeat=1, min_time=0.001, warmup=0.0) as m:
        results = m.measure(task, configs)
        again = m.measure(task, [task.space.entity({"tile": 8})])  # the pool was replaced
    bad = [r for r in results if not r.ok]
    assert [r.config["tile"] for r in bad] == [4], [(r.config["tile"], r.error, r.detail) for r in results]
    assert bad[0].error == "crash" and "build worker died" in bad[0].detail and "exit status 3" in bad[0].detail
    assert all(r.ok and r.cost > 0 for r in results if r.config["tile"] != 4)
    assert again[0].ok


def test_resume_retries_dead_workers_and_timeouts_only(tmp_path):
    """A log (as written before this fix) where a dead worker marked its batch as compile errors, plus a time-out, a
    real compile error and a wrong answer: the resumed run measures the first two again, not the other two."""
    from ember.tune.log import make_record
    from ember.tune.measure import MeasureResult

    task = Task.from_template("exits_in_build", exits_in_build, reference_fn=reference)
    space = task.space
    died = "build worker died: A process in the process pool was terminated abruptly"
    logged = {1: ("compile", died), 2: ("timeout", "no result within 3 s (killed)"),
              8: ("compile", "ValueError: cannot split"), 16: ("wrong", "output 0: max abs error 1")}  # fmt: skip
    log = TuningLog(tmp_path / "log.jsonl")
    log.append([make_record(task, MeasureResult(space.entity({"tile": t}), error=k, detail=d))
                for t, (k, d) in logged.items()])  # fmt: skip
    with Measurer(n_parallel=2, run_timeout=5.0, repeat=1, min_time=0.001, warmup=0.0) as m:
        res = tune_task(task, "grid", 6, m, log=log, batch_size=3)
    assert res.resumed == 2 and len(res.trials) == 6
    recs = log.records()[len(logged) :]
    tiles = sorted(r["config"]["knobs"]["tile"] for r in recs)
    assert tiles == [1, 2, 4, 32], tiles  # the two retried, the two never measured
    by_tile = {r["config"]["knobs"]["tile"]: r for r in recs}
    assert by_tile[1]["error"] is None and by_tile[2]["error"] is None and by_tile[32]["error"] is None
    assert by_tile[4]["error"]["kind"] == "crash" and "build worker died" in by_tile[4]["error"]["detail"]


def test_cold_cache_measurement_times_single_calls_after_a_flush():
    """flush_cache: every timed run is one call after the caches were flushed (at least 5 runs); a wrong
    candidate is still caught first."""
    from ember.tune.runner import cache_flush_bytes, cold_runs

    assert cache_flush_bytes() >= 2 << 20
    task = Task.from_template("planted", planted, reference_fn=reference)
    cfgs = [task.space.entity({"mode": "ok"}), task.space.entity({"mode": "wrong"})]
    with Measurer(n_parallel=1, run_timeout=10.0, repeat=2, min_time=0.001, warmup=0.0, flush_cache=True) as m:
        ok, wrong = m.measure(task, cfgs)
    assert m.flush == cache_flush_bytes()
    assert ok.ok and len(ok.costs) == 5 and all(c > 0 for c in ok.costs)
    assert wrong.error == "wrong"
    calls, cache = [], {}

    def call():
        calls.append(float(cache["scratch"][0]))  # the flush wrote the scratch buffer before each call

    runs = cold_runs(call, [], 6, 1 << 20, cache)
    assert len(runs) == 6 and cache["scratch"].nbytes == 1 << 20 and calls == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
