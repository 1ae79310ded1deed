#!/usr/bin/env python
"""Run the ONNX node test suite (the tests shipped inside the onnx package) on Ember.

    python tools/onnx_node_tests.py                    # whole suite, compiled engine
    python tools/onnx_node_tests.py -k conv -k pool    # only tests whose name contains conv or pool
    python tools/onnx_node_tests.py --list-failures -j 4

Each node test is a one-node model (or its function-expanded form) with input and
expected output arrays. A test passes when every data set's outputs match with onnx's
own comparison (`onnx.backend.test.runner.Runner.assert_similar_outputs`: same shapes
and dtypes, allclose with the test's rtol/atol). Exclusions come from
ember/backend_exclusions.toml, each with a reason; the pass rate counts them as failures.
"""

from __future__ import annotations

import argparse
import fnmatch
import multiprocessing
import os
import signal
import sys
import time
import tomllib
import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXCLUSIONS = ROOT / "ember" / "backend_exclusions.toml"

_TESTS: list = []


def load_tests() -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return sorted(load_model_tests(kind="node"), key=lambda t: t.name)


def load_exclusions(path: Path = EXCLUSIONS) -> list[tuple[str, str]]:
    """(fnmatch pattern, reason) rows."""
    data = tomllib.loads(path.read_text())
    return [(pattern, row["reason"]) for row in data.get("exclude", []) for pattern in row["tests"]]


def excluded_reason(name: str, exclusions: list[tuple[str, str]]) -> str | None:
    return next((reason for pattern, reason in exclusions if fnmatch.fnmatchcase(name, pattern)), None)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_one(index: int, engine: str, timeout: int, specialize: bool = True) -> tuple[str, str, str, str]:
    """(name, status, message, how) with status 'pass' or 'fail'; how says how the graph ran:
    'static' (imported as is), 'specialized' (inputs bound as constants), 'folded' (no nodes left)."""
    from onnx.backend.test.runner import Runner

    from ember.backend import EmberBackend

    case = _TESTS[index]
    how = "static"
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = EmberBackend.prepare(case.model, "CPU", engine=engine, specialize=specialize)
            for inputs, expected in case.data_sets:
                inputs = [_to_array(x) for x in inputs]
                expected = [_to_array(x) for x in expected]
                outputs = rep.run(inputs)
                Runner.assert_similar_outputs(expected, outputs, rtol=case.rtol, atol=case.atol)
        how = "specialized" if rep.specialized else "static"
        if all(not g.nodes for g, _ in rep.cache.values()):
            how = "folded"
        models = [getattr(r, "__self__", None) for _, r in rep.cache.values()]
        if any(m is not None and m.summary()["fallback_ops"] for m in models):
            how += "+fallback"
        status, message = "pass", ""
    except _Timeout:
        status, message = "fail", f"timed out after {timeout}s"
    except Exception as e:
        status = "fail"
        text = str(e).strip().splitlines()
        message = f"{type(e).__name__}: {' '.join(text[:3])[:300]}" if text else type(e).__name__
        if os.environ.get("EMBER_TRACE"):
            message += "\n" + traceback.format_exc()
    finally:
        signal.alarm(0)
    return case.name, status, message, how


def _to_array(x):
    import onnx
    from onnx import numpy_helper

    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="compiled", help="compiled (default), native or reference")
    parser.add_argument("-k", action="append", default=[], help="run tests whose name contains this (repeatable)")
    parser.add_argument("--list-failures", action="store_true", help="print each failing test and its error")
    parser.add_argument("--list-excluded", action="store_true", help="print each excluded test and the reason")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per test (default 60)")
    parser.add_argument("--no-exclusions", action="store_true", help="also run the excluded tests")
    parser.add_argument("--no-specialize", action="store_true",
                        help="fail tests whose static operands are graph inputs, instead of binding them")  # fmt: skip
    args = parser.parse_args(argv)

    global _TESTS
    _TESTS = load_tests()
    exclusions = [] if args.no_exclusions else load_exclusions()
    selected = [i for i, t in enumerate(_TESTS) if not args.k or any(k in t.name for k in args.k)]
    excluded = {i: r for i in selected if (r := excluded_reason(_TESTS[i].name, exclusions))}
    to_run = [i for i in selected if i not in excluded]

    start = time.perf_counter()
    jobs = [(i, args.engine, args.timeout, not args.no_specialize) for i in to_run]
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs, initializer=_init_worker) as pool:
            results = pool.starmap(run_one, jobs, chunksize=4)
    else:
        results = [run_one(*job) for job in jobs]
    elapsed = time.perf_counter() - start

    failures = [(n, m) for n, s, m, _ in results if s != "pass"]
    passed = len(results) - len(failures)
    total = len(selected)
    if args.list_failures:
        for name, message in failures:
            print(f"FAIL {name}: {message}")
    if args.list_excluded:
        for i, reason in sorted(excluded.items(), key=lambda kv: _TESTS[kv[0]].name):
            print(f"EXCLUDED {_TESTS[i].name}: {reason}")
    reasons = Counter(excluded.values())
    print(f"onnx node tests (onnx {_onnx_version()}, engine {args.engine}), {elapsed:.0f}s")
    print(f"  total:    {total}")
    print(f"  run:      {len(results)}")
    hows = Counter(h.removesuffix("+fallback") for _, s, _, h in results if s == "pass")
    fell_back = sum(1 for _, s, _, h in results if s == "pass" and h.endswith("+fallback"))
    print(f"  passed:   {passed}  (graph kept as imported: {hows['static']}; inputs bound as constants: "
          f"{hows['specialized']}; evaluated entirely at import: {hows['folded']})")
    if args.engine == "compiled":
        print(f"            of which {passed - fell_back} ran on native kernels only, {fell_back} used the numpy "
              "reference for some node")
    print(f"  failed:   {len(failures)}")
    print(f"  excluded: {len(excluded)}")
    for reason, count in reasons.most_common():
        print(f"    {count:4d}  {reason}")
    rate = 100.0 * passed / total if total else 0.0
    run_rate = 100.0 * passed / len(results) if results else 0.0
    print(f"  pass rate: {rate:.1f}% of all selected tests (excluded count as failures); {run_rate:.1f}% of those run")
    return 0 if not failures else 1


def _onnx_version() -> str:
    import onnx

    return onnx.__version__


if __name__ == "__main__":
    sys.exit(main())
