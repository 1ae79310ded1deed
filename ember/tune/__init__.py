"""Automatic tuning (AutoTVM-style): config spaces of the schedule templates, task extraction,
tuners (random, grid, genetic, XGBoost cost model), safe measurement, JSON-lines logs.

    tasks = ember.tune.extract_tasks("model.onnx", target="c")
    with ember.tune.Measurer() as m:
        for t in tasks:
            ember.tune.tune_task(t, "xgb", n_trial=64, measurer=m, log="tune.jsonl")
    model = ember.compile("model.onnx", tuning_log="tune.jsonl")

or `ember tune model.onnx --trials 64 --log tune.jsonl`. Names load on first use (the CLI imports
this package to parse its arguments).
"""

from importlib import import_module

_NAMES = {
    "ember.te.config": ["CONFIG_ATTR", "ConfigEntity", "ConfigError", "ConfigSpace", "load_best"],
    "ember.tune.driver": ["TuneResult", "plot_history", "summary_table", "tune_model", "tune_task", "tune_tasks"],
    "ember.tune.log": ["TuningLog"],
    "ember.tune.measure": ["MeasureResult", "Measurer"],
    "ember.tune.task": ["Task", "extract_tasks"],
    "ember.tune.tuners": ["TUNERS", "GATuner", "GridTuner", "RandomTuner", "Tuner", "XGBTuner", "make_tuner"],
}
_WHERE = {name: mod for mod, names in _NAMES.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ember.tune' has no attribute {name!r}")
