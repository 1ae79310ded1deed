"""Modules imported on first use, for the TensorFlow and TFLite tests: TensorFlow must not load in a process that
only collects them (it breaks PoCL's OpenCL compiler there), so nothing imports it before a test runs."""

from __future__ import annotations

import importlib


class Lazy:
    """A module imported on first use of one of its attributes."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr: str):
        if attr.startswith(("_", "pytest")):  # what pytest asks of module attributes while collecting
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.name), attr)
