"""Saved models are verified before any of their native code is loaded: every file against the manifest's SHA-256,
the weights against the plan's shapes and dtypes, the plan against itself (a kernel's arguments have the sizes it
was compiled for). Each tampering below was a wrong answer, a segfault or a SIGBUS in dlopen before manifests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import ember
from ember import zoo
from ember.runtime.model import MANIFEST, ArtifactError, sha256_of


def mlp():
    b = zoo.Builder(5)
    h = b.op("Relu", [b.op("MatMul", ["x", b.weight((16, 32))])])
    return b.model({"x": (4, 16)}, b.op("MatMul", [h, b.weight((32, 8))]))


@pytest.fixture(scope="module", params=["c", "llvm"])
def saved(request, tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    if request.param == "llvm":
        pytest.importorskip("llvmlite")
    m = ember.compile(mlp(), request.param)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    return m.save(tmp_path_factory.mktemp(request.param) / "model"), x, m(x)


def copy_of(saved, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved[0], tmp_path / "copy"))


def remanifest(d: Path) -> None:
    """Tamper consistently: the manifest re-hashed after an edit (its weight types too), as an attacker would."""
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["files"] = {n: sha256_of(d / n) for n in manifest["files"]}
    with np.load(d / "weights.npz") as z:
        manifest["weights"] = {k: [z[k].dtype.name, list(z[k].shape)] for k in z.files}
    (d / MANIFEST).write_text(json.dumps(manifest))


def rewrite_weights(d: Path, change) -> None:
    with np.load(d / "weights.npz") as z:
        weights = {k: z[k] for k in z.files}
    k = sorted(weights)[0]
    weights[k] = change(weights[k])
    np.savez(d / "weights.npz", **weights)


def test_a_saved_model_loads_and_matches(saved):
    path, x, y = saved
    assert (path / MANIFEST).exists()
    np.testing.assert_array_equal(ember.load(path)(x), y)


@pytest.mark.parametrize("change,consistent,culprit", [
    (lambda w: w.reshape(-1)[:1], False, "weights.npz"),  # truncated to one element
    (lambda w: w.reshape(-1)[:1], True, "plan.json"),  # ... with the manifest re-hashed: the plan disagrees
    (lambda w: w.astype(np.float64), False, "weights.npz"),  # float64 where float32 is expected
    (lambda w: w.astype(np.float64), True, "plan.json"),
])  # fmt: skip
def test_tampered_weights_are_refused(saved, tmp_path, change, consistent, culprit):
    d = copy_of(saved, tmp_path)
    rewrite_weights(d, change)
    if consistent:
        remanifest(d)
    with pytest.raises(ArtifactError, match=culprit):
        ember.load(d)


def test_an_edited_output_shape_is_refused(saved, tmp_path):
    d = copy_of(saved, tmp_path)
    plan = json.loads((d / "plan.json").read_text())
    out = plan["outputs"][0]
    plan["values"][out]["shape"] = [1, 8]  # the kernel writes 4 x 8 floats
    (d / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(ArtifactError, match="plan.json: changed since"):
        ember.load(d)
    remanifest(d)
    with pytest.raises(ArtifactError, match=r"(?s)plan.json.*compiled for"):
        ember.load(d)


@pytest.mark.parametrize("name", ["model.so", "model.o", "model.ll", "summary.json"])
def test_truncated_or_swapped_code_is_refused_before_it_is_loaded(saved, tmp_path, name):
    d = copy_of(saved, tmp_path)
    if not (d / name).exists():
        pytest.skip(f"this backend saves no {name}")
    data = (d / name).read_bytes()
    (d / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=name):
        ember.load(d)
    (d / name).write_bytes(np.random.default_rng(1).bytes(len(data)))
    with pytest.raises(ArtifactError, match=name):
        ember.load(d)


def test_missing_files_and_manifest_are_refused(saved, tmp_path):
    d = copy_of(saved, tmp_path)
    (d / "weights.npz").unlink()
    with pytest.raises(ArtifactError, match="weights.npz: missing"):
        ember.load(d)
    (d / MANIFEST).unlink()
    with pytest.raises(ArtifactError, match="no manifest.json"):
        ember.load(d)


def test_save_replaces_an_earlier_model_whole_and_leaves_other_directories_alone(tmp_path):
    pytest.importorskip("llvmlite")
    path = tmp_path / "m"
    ember.compile(mlp(), "c").save(path)
    assert (path / "model.so").exists()
    ember.compile(mlp(), "llvm").save(path)  # no model.so of the C save stays behind
    assert not (path / "model.so").exists() and (path / "model.ll").exists()
    assert type(ember.load(path)).__name__ == "LLVMCompiledModel"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a saved Ember model"):
        ember.compile(mlp(), "c").save(other)
    assert (other / "todo.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left


def relu_and_neg():
    models = []
    for op in ("Relu", "Neg"):
        b = zoo.Builder(0)
        models.append(b.model({"x": (4, 8)}, b.op(op, ["x"])))
    return models


def test_a_saved_model_cannot_poison_the_jit_cache(tmp_path, monkeypatch):
    """Another model's machine code planted in a saved model (manifest re-hashed) is that model's business: it never
    enters the shared cache, so a later compile of the same IR computes what it should (it computed Neg before)."""
    pytest.importorskip("llvmlite")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    relu, neg = relu_and_neg()
    a = ember.compile(relu, "llvm").save(tmp_path / "relu")
    b = ember.compile(neg, "llvm").save(tmp_path / "neg")
    (a / "model.o").write_bytes((b / "model.o").read_bytes())
    remanifest(a)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "fresh"))
    ember.load(a)  # runs the planted code: loading runs a model's code (README); the cache must not keep it
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(ember.compile(relu, "llvm")(x), np.maximum(x, 0))


def test_a_corrupt_jit_cache_entry_is_discarded_and_rebuilt(tmp_path, monkeypatch):
    """A torn or overwritten cache entry never reaches LLVM (random bytes used to abort the process)."""
    pytest.importorskip("llvmlite")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    relu, _ = relu_and_neg()
    first = ember.compile(relu, "llvm")
    entry = first._lib.object_path
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    for bad in (np.random.default_rng(4).bytes(4096), entry.read_bytes()[:100], b""):
        entry.write_bytes(bad)
        again = ember.compile(relu, "llvm")
        assert not again._lib.from_cache
        np.testing.assert_array_equal(again(x), np.maximum(x, 0))
    assert ember.compile(relu, "llvm")._lib.from_cache  # the rebuilt entry is good


def test_a_corrupt_library_in_the_compile_cache_is_rebuilt(tmp_path, monkeypatch):
    """A C library entry of the content-hash cache truncated (a full disk, a killed copy) is built again, not
    loaded (dlopen of a truncated library died with SIGBUS). The entry is made by another process: this one must not
    have the library mapped when it is truncated."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    relu, _ = relu_and_neg()
    onnx.save(relu, str(tmp_path / "relu.onnx"))
    code = f"import ember; print(ember.compile({str(tmp_path / 'relu.onnx')!r}, 'c').lib_path)"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    lib = Path(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                              cwd=root).stdout.strip())  # fmt: skip
    lib.write_bytes(lib.read_bytes()[:1000])
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    again = ember.compile(relu, "c")
    assert again.lib_path == lib and len(lib.read_bytes()) > 1000
    np.testing.assert_array_equal(again(x), np.maximum(x, 0))


def test_code_for_a_cpu_this_one_lacks_is_refused_not_run(tmp_path, monkeypatch):
    """A model compiled here for a CPU with instructions this one lacks (AVX-512 on an AVX2 machine, emulated by
    hiding avx512f from this CPU's flags) would stop the process at its first such instruction: the c target keeps
    it as a foreign model (saved, never run: ForeignTargetError naming the features), the llvm target refuses to
    JIT it, and a model saved where the CPU had them refuses to load."""
    from ember import target as target_mod
    from ember.runtime.cross import ForeignTargetError
    from ember.target import Target, TargetError

    real = target_mod.host_cpu_flags()
    lacking = frozenset(f for f in real if not f.startswith("avx512"))
    monkeypatch.setattr(target_mod, "host_cpu_flags", lambda: lacking)
    assert Target.parse("c -mcpu=skylake-avx512").missing_features == {"avx512f"}
    m = ember.compile(mlp(), target="c -mcpu=skylake-avx512 -threads=1")
    with pytest.raises(ForeignTargetError, match="avx512f"):
        m(np.zeros((4, 16), np.float32))
    m.save(tmp_path / "foreign")
    with pytest.raises(ForeignTargetError, match="avx512f"):
        ember.load(tmp_path / "foreign").run({"x": np.zeros((4, 16), np.float32)})
    pytest.importorskip("llvmlite")
    with pytest.raises(TargetError, match="avx512f"):
        ember.compile(mlp(), target="llvm -mcpu=skylake-avx512")
    monkeypatch.undo()
    native = ember.compile(mlp(), target="c -threads=1")
    native.save(tmp_path / "native")
    monkeypatch.setattr(target_mod, "host_cpu_flags", lambda: frozenset({"fpu"}))  # (a CPU without SIMD extensions)
    if native.summary()["simd"]:
        with pytest.raises(ArtifactError, match="compiled for a CPU with"):
            ember.load(tmp_path / "native")
