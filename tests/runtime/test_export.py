"""The standalone C library export: a C program links it and computes what the Python executor does."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import ember
from ember import zoo
from ember.codegen.toolchain import find_cc

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ember_model.h"

int main(int argc, char** argv) {
  (void)argc;
  ember_model* m = ember_model_create(argv[1]);
  if (m == NULL) { fprintf(stderr, "cannot load weights\n"); return 2; }
  static float x[IN_SIZE], y[OUT_SIZE];
  FILE* f = fopen(argv[2], "rb");
  if (f == NULL || fread(x, sizeof(float), IN_SIZE, f) != IN_SIZE) return 3;
  fclose(f);
  const void* inputs[] = {x};
  void* outputs[] = {y};
  int status = ember_model_run(m, inputs, outputs);
  f = fopen(argv[3], "wb");
  fwrite(y, sizeof(float), OUT_SIZE, f);
  fclose(f);
  ember_model_destroy(m);
  return status;
}
"""


def elementwise_model():
    b = zoo.Builder(3)
    y = b.op("Relu", [b.op("Add", ["x", b.weight((6,))])])
    y = b.op("Mul", [b.op("Reshape", [y, b.const(np.array([4, 6], np.int64))]), b.weight((4, 1))])
    return b.model({"x": (2, 2, 6)}, y)


@pytest.mark.skipif(find_cc() is None, reason="needs a C compiler")
def test_exported_library_runs_from_c(tmp_path):
    model = elementwise_model()
    m = ember.compile(model)
    assert m.summary()["fallback_ops"] == []
    lib = m.export_c(tmp_path / "lib")
    assert {p.name for p in lib.iterdir()} == {"ember_model.c", "ember_model.h", "weights.bin"}
    assert "ember_model_run" in (lib / "ember_model.h").read_text()
    x = np.random.default_rng(0).standard_normal((2, 2, 6)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    (tmp_path / "main.c").write_text(MAIN.replace("IN_SIZE", "24").replace("OUT_SIZE", "24"))
    exe = tmp_path / "app"
    cmd = [
        find_cc(),
        "-O2",
        "-fopenmp",
        f"-I{lib}",
        str(tmp_path / "main.c"),
        str(lib / "ember_model.c"),
        "-o",
        str(exe),
        "-lm",
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    subprocess.run([str(exe), str(lib / "weights.bin"), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")], check=True)
    y = np.fromfile(tmp_path / "y.bin", dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(y, m(x))


def test_export_refuses_models_with_reference_steps(tmp_path):
    b = zoo.Builder(1)
    model = b.model({"x": (2, 3, 3)}, b.op("Det", ["x"]))
    m = ember.compile(model)
    if not m.summary()["fallback_ops"]:
        pytest.skip("Det got a native kernel")
    with pytest.raises(ValueError, match="reference"):
        m.export_c(tmp_path)
