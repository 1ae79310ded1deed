"""The standalone C library export: a C program links it and computes what the Python executor does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import zoo
from ember.codegen.toolchain import find_cc
from ember.runtime.export import npy_descr
from ember.runtime.standalone import StandaloneError, run_exported

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
    assert {p.name for p in lib.iterdir()} == {"ember_model.c", "ember_model.h", "weights.bin", "model.json"}
    assert "ember_model_run" in (lib / "ember_model.h").read_text()
    meta = json.loads((lib / "model.json").read_text())
    assert meta["target"] == m.plan.target and meta["name"] == m.plan.name
    assert [t["name"] for t in meta["inputs"]] == m.input_names
    assert [t["name"] for t in meta["outputs"]] == m.output_names
    for t, x in zip(meta["inputs"], m.random_inputs()):
        assert (t["shape"], np.dtype(t["descr"])) == (list(x.shape), x.dtype)
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


# -- the standalone export: ember_model.c + ember_run, built with the target's compiler -----------------------------
#
# Outputs are compared bit for bit: ember_run runs the same C source as the in-process model, built by the same
# compiler with the same flags (less -shared/-fPIC), without -ffast-math, so every element is computed by the same
# operations in the same order; parallel loops split output elements, never a reduction, so the thread count (and
# a build without OpenMP) does not change a bit either.

needs_cc = pytest.mark.skipif(find_cc() is None, reason="needs a C compiler")

SMALL_MODELS = {
    "elementwise": elementwise_model,
    "mlp": lambda: zoo.mlp(batch=2, features=16, hidden=(32, 16), classes=8),
    "resnet_basic_block": lambda: zoo.resnet_basic_block(channels=8, size=6),
    "mobilenet_v2_inverted_residual": lambda: zoo.mobilenet_v2_inverted_residual(channels=8, expand=2, size=6),
    "conv_bn_relu_stack": lambda: zoo.conv_bn_relu_stack(layers=2, channels=8, size=8),
    "transformer_encoder_layer": lambda: zoo.transformer_encoder_layer(seq=4, d=16, heads=2, ff=32, batch=1),
    "bert_encoder": lambda: zoo.bert_encoder(layers=1, seq=8, d=16, heads=2, ff=32, vocab=50),
}


def feeds_for(model, seed=1):
    feeds = zoo.random_feeds(model, seed)
    if "input_ids" in feeds:
        feeds["input_ids"] = feeds["input_ids"] % 50  # the small vocabulary
    return feeds


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (onnx model, compiled model, export directory); each exported (with -Werror) on first use."""
    cache = {}

    def get(name):
        if name not in cache:
            model = SMALL_MODELS[name]()
            m = ember.compile(model, target="c")
            assert m.summary()["fallback_ops"] == []
            out = m.export(tmp_path_factory.mktemp(name), extra_cflags=["-Werror"])
            cache[name] = (model, m, out)
        return cache[name]

    return get


@needs_cc
@pytest.mark.parametrize("name", list(SMALL_MODELS))
def test_export_compiles_without_warnings_and_ember_run_matches_the_model(exported, name):
    model, m, out = exported(name)
    assert {p.name for p in out.iterdir()} == {
        "ember_model.c", "ember_model.h", "weights.bin", "model.json", "ember_run.c", "Makefile", "ember_run"
    }  # fmt: skip
    assert "-Wall -Wno-psabi -Werror" in (out / "Makefile").read_text()
    source = (out / "ember_model.c").read_text()
    assert source.count("#include <math.h>") == 1  # the prelude and each helper once, then every kernel
    feeds = feeds_for(model)
    outputs, timings = run_exported(out, feeds)
    expected = m.run(feeds)
    assert list(outputs) == list(expected) == list(timings["outputs"])
    for k, y in expected.items():
        assert outputs[k].dtype == y.dtype and outputs[k].shape == y.shape
        np.testing.assert_array_equal(outputs[k], y, err_msg=f"{name}: output {k}")


@needs_cc
def test_header_lists_inputs_and_outputs_in_a_table(exported):
    _, m, out = exported("bert_encoder")
    header = (out / "ember_model.h").read_text()
    assert "extern const ember_model_tensor ember_model_inputs[];" in header
    assert "#define EMBER_MODEL_NUM_INPUTS 2" in header and '#define EMBER_MODEL_NAME "' in header
    source = (out / "ember_model.c").read_text()
    assert '{"input_ids", "<i8", 2, ember_model_inputs_0_dims, 64},' in source


@needs_cc
def test_timing_line_is_one_json_line(exported):
    model, _, out = exported("mlp")
    _, timings = run_exported(out, feeds_for(model), repeat=5, warmup=2)
    assert timings["repeat"] == 5 and timings["warmup"] == 2 and timings["unit"] == "s"
    assert 0 < timings["min"] <= timings["median"] and timings["mean"] >= timings["min"]
    np.save(out.parent / "x.npy", feeds_for(model)["x"])
    cmd = [str(out / "ember_run"), "--input", f"x={out.parent / 'x.npy'}", "--output-dir", str(out.parent / "y")]
    proc = subprocess.run([*cmd, "--repeat", "3"], capture_output=True, text=True, check=True)
    assert len(proc.stdout.splitlines()) == 1 and json.loads(proc.stdout)["repeat"] == 3


@needs_cc
def test_bad_inputs_exit_2_naming_the_input(exported, tmp_path):
    model, _, out = exported("bert_encoder")
    feeds = feeds_for(model)
    files = {}
    for name, x in feeds.items():
        np.save(tmp_path / f"{name}.npy", x)
        files[name] = f"{name}={tmp_path / name}.npy"
    np.save(tmp_path / "short.npy", feeds["input_ids"][:, :4])
    np.save(tmp_path / "int32.npy", feeds["input_ids"].astype(np.int32))
    np.save(tmp_path / "fortran.npy", np.asfortranarray(np.ones((2, 8), np.int64)))

    def run(*inputs):
        args = [a for i in inputs for a in ("--input", i)]
        return subprocess.run([str(out / "ember_run"), *args, "--output-dir", str(tmp_path / "out")],
                              capture_output=True, text=True)  # fmt: skip

    assert run(*files.values()).returncode == 0
    cases = [
        ((f"input_ids={tmp_path / 'short.npy'}", files["attention_mask"]), "input 'input_ids'", "shape (1, 4)"),
        ((f"input_ids={tmp_path / 'int32.npy'}", files["attention_mask"]), "input 'input_ids'", "dtype <i4"),
        ((files["input_ids"], f"attention_mask={tmp_path / 'fortran.npy'}"), "input 'attention_mask'", "Fortran"),
        ((files["input_ids"],), "missing input 'attention_mask'", "<i8 (1, 8)"),
        ((*files.values(), f"tokens={tmp_path / 'short.npy'}"), "unknown input 'tokens'", "'input_ids'"),
    ]
    for inputs, who, what in cases:
        proc = run(*inputs)
        assert proc.returncode == 2, (inputs, proc.stderr)
        assert who in proc.stderr and what in proc.stderr, proc.stderr
    with pytest.raises(StandaloneError, match="input 'input_ids'"):
        run_exported(out, {**feeds, "input_ids": feeds["input_ids"].astype(np.float32)})


@needs_cc
def test_weights_beside_the_program_or_given(exported, tmp_path):
    model, m, out = exported("resnet_basic_block")
    feeds = feeds_for(model)
    elsewhere = tmp_path / "bin"
    elsewhere.mkdir()
    shutil.copy(out / "ember_run", elsewhere / "ember_run")
    np.save(tmp_path / "x.npy", feeds["x"])
    cmd = [str(elsewhere / "ember_run"), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "y")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1 and str(elsewhere / "weights.bin") in proc.stderr
    subprocess.run([*cmd, "--weights", str(out / "weights.bin")], check=True, capture_output=True)
    (name,) = m.output_names
    np.testing.assert_array_equal(np.load(tmp_path / "y" / f"{name}.npy"), m.run(feeds)[name])


@needs_cc
def test_build_without_openmp_gives_the_same_outputs(tmp_path):
    """Parallel loops run on the library's own thread pool (pthreads): a build without OpenMP still has threads."""
    model = zoo.conv_bn_relu_stack(layers=2, channels=16, size=16)  # large enough for parallel loops
    m = ember.compile(model, target="c -threads=2")
    assert "ember_parallel_for(" in m.source
    out = m.export(tmp_path / "serial", openmp=False)
    assert "-fopenmp" not in (out / "Makefile").read_text()
    feeds = feeds_for(model)
    outputs, timings = run_exported(out, feeds)
    assert timings["threads"] == 2
    for k, y in m.run(feeds).items():
        np.testing.assert_array_equal(outputs[k], y)
    # warning-free with -Werror too (the pragmas are ignored on purpose: -Wno-unknown-pragmas)
    m.export(tmp_path / "serial_werror", openmp=False, extra_cflags=["-Werror"])


@needs_cc
def test_ember_export_command_end_to_end(tmp_path):
    import onnx

    model = SMALL_MODELS["mobilenet_v2_inverted_residual"]()
    onnx.save(model, tmp_path / "block.onnx")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ember.__file__).parents[1]), *sys.path])}
    cmd = [sys.executable, "-m", "ember.cli", "export", str(tmp_path / "block.onnx"), "--target", "c", "-o",
           str(tmp_path / "out")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ember_run --input x=FILE.npy" in proc.stdout
    feeds = feeds_for(model)
    outputs, _ = run_exported(tmp_path / "out", feeds)
    expected = ember.compile(model, target="c").run(feeds)
    for k, y in expected.items():
        np.testing.assert_array_equal(outputs[k], y)
    proc = subprocess.run([*cmd[:4], str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x")],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == 1 and "ember export" in proc.stderr


def test_export_needs_c_source():
    m = ember.compile(elementwise_model(), target="llvm")
    with pytest.raises(ValueError, match="target='c'"):
        m.export("unused")


def test_npy_descr_is_numpys_little_endian_form():
    assert [npy_descr(t) for t in ("float32", "float64", "float16", "int8", "int64", "uint8", "uint16", "bool")] == [
        "<f4", "<f8", "<f2", "|i1", "<i8", "|u1", "<u2", "|b1"
    ]  # fmt: skip


@needs_cc
def test_ember_run_reads_npy_version_2(exported, tmp_path):
    model, m, out = exported("elementwise")
    x = feeds_for(model)["x"]
    with open(tmp_path / "x.npy", "wb") as f:
        np.lib.format.write_array(f, x, version=(2, 0))
    cmd = [str(out / "ember_run"), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "new" / "y")]
    subprocess.run(cmd, check=True, capture_output=True)  # (the output directory is created)
    (name,) = m.output_names
    np.testing.assert_array_equal(np.load(tmp_path / "new" / "y" / f"{name}.npy"), m(x))


@pytest.mark.skipif(
    find_cc() is None or shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64",
)
def test_exported_c_cross_compiles_and_runs_under_an_emulator(tmp_path):
    """A model exported for aarch64 (its cross compiler builds ember_run, with -Werror) runs under qemu-user and
    gives the host model's outputs within float32 rounding (each machine's kernels are vectorized for its own
    registers, which orders some sums differently)."""
    model = SMALL_MODELS["resnet_basic_block"]()
    arm = ember.compile(model, target="c -mtriple=aarch64-linux-gnu")
    out = arm.export(tmp_path / "arm", extra_cflags=["-Werror"])
    feeds = feeds_for(model)
    outputs, _ = run_exported(out, feeds, launcher=["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])
    for k, y in ember.compile(model, target="c").run(feeds).items():
        np.testing.assert_allclose(outputs[k], y, rtol=1e-5, atol=1e-5 * float(np.abs(y).max()))
