"""Ember: a deep learning compiler.

from ember import te
s = te.create_schedule(C)
print(ember.lower(s, [A, B, C]))
f = ember.build(s, [A, B, C], target="c")
"""

from . import te, tir
from .build import build, lower
from .target import Target

__version__ = "0.1.0"
__all__ = ["Target", "build", "lower", "te", "tir"]
