"""Ember against ONNX Runtime and OpenVINO across a zoo of 42 models with random weights.

    python bench/zoo.py [--models resnet18,bert,...] [--threads 1,2] [--rounds 2] [--repeat 10] [--quick] [--json]
                        [--cache DIR] [--list] [--cpu-time]

The models are torchvision classification models and Hugging Face transformers built from their configs with
random weights (the `config` column says where a model is smaller than its full size: input resolution, layers,
width; a 2-core machine cannot time the full sizes of all of them in one sitting), exported once with torch.onnx
(the TorchScript exporter, opset 17) into a cache directory (`--cache`, default $TMPDIR/ember-zoo) beside random
inputs and onnxruntime's outputs for them, so reruns only time.

Each system (Ember, onnxruntime, OpenVINO) runs in a process of its own (`--worker`), which compiles the model at
the given thread count and warms up. Per round, the three processes are started and loaded together, then take
turns (`--repeat` turns, fewer past ~3 s of calls; the order rotates, with a pause between systems for the last
one's threads to stop spinning): per turn an untimed call, which brings the model's weights back into the caches
after the other systems' calls, then two timed ones. A drift of a shared machine then hits all alike: on this
2-vCPU machine the host at times runs both vCPUs at half speed for seconds, which measurements one process after
another blamed on whichever system was running. A system's time is the median of all its calls in all rounds
(`--cpu-time`: each call timed by the process's CPU time, all its threads, instead of the wall clock: on a machine
loaded by other work, wall-clock times of long calls swell by the time the process waits).
The ratio is the faster of onnxruntime and OpenVINO over Ember (> 1: Ember is faster); the
table is sorted by it, and the geometric mean is printed below. `rel err` is the max |ember - ort| / max |ort| over
the outputs, on the inputs stored with the model. Ember's worker also profiles the model once per thread count
(round 1) and reports its worst kernels by roofline fraction (kernels of at least 2% of the model's time); the ten
worst across the sweep are printed last.

A system that is not installed is skipped with a note (torchvision and openvino: `pip install -e ".[zoo]"`;
torchvision's model definitions are used without its C ops, see `torchvision_models`). A model that fails to
export, compile or match is a row saying so, not a missing row.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np

SYSTEMS = ("ember", "onnxruntime", "openvino")
MISMATCH = 1e-3  # max relative error above which a row is marked a mismatch (float32 through different kernels)
WORKER_TIMEOUT = 900  # seconds for one measurement process (a cold Ember compile of a large model included)


# -- the models ----------------------------------------------------------------------------------------------------
def torchvision_models() -> types.ModuleType:
    """torchvision.models without torchvision's compiled ops: the PyPI CPU wheel of torchvision is built against a
    CUDA torch, whose C extension does not load beside the CPU torch, and torchvision/__init__ then fails to register
    fake kernels of the missing ops. The model definitions are pure Python, so the package is entered by its path."""
    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")
        if spec is None:
            raise ImportError("torchvision is not installed (pip install -e '.[zoo]')")
        pkg = types.ModuleType("torchvision")
        pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["torchvision"] = pkg
    import torchvision.models

    return torchvision.models


# name -> (torchvision builder, kwargs, image size, config note); 224 is the models' own size (299 for inception)
VISION = {
    "alexnet": ("alexnet", {}, 224, ""),
    "vgg11": ("vgg11", {}, 224, ""),
    "vgg16": ("vgg16", {}, 224, ""),
    "resnet18": ("resnet18", {}, 224, ""),
    "resnet34": ("resnet34", {}, 224, ""),
    "resnet50": ("resnet50", {}, 160, "160x160"),
    "resnext50_32x4d": ("resnext50_32x4d", {}, 160, "160x160"),
    "wide_resnet50_2": ("wide_resnet50_2", {}, 112, "112x112"),
    "squeezenet1_0": ("squeezenet1_0", {}, 224, ""),
    "squeezenet1_1": ("squeezenet1_1", {}, 224, ""),
    "shufflenet_v2_x1_0": ("shufflenet_v2_x1_0", {}, 224, ""),
    "mobilenet_v2": ("mobilenet_v2", {}, 224, ""),
    "mobilenet_v3_small": ("mobilenet_v3_small", {}, 224, ""),
    "mobilenet_v3_large": ("mobilenet_v3_large", {}, 224, ""),
    "efficientnet_b0": ("efficientnet_b0", {}, 224, ""),
    "efficientnet_b1": ("efficientnet_b1", {}, 224, "224x224 (own: 240)"),
    "efficientnet_b2": ("efficientnet_b2", {}, 224, "224x224 (own: 260)"),
    "mnasnet1_0": ("mnasnet1_0", {}, 224, ""),
    "regnet_x_400mf": ("regnet_x_400mf", {}, 224, ""),
    "regnet_y_400mf": ("regnet_y_400mf", {}, 224, ""),
    "densenet121": ("densenet121", {}, 160, "160x160"),
    "googlenet": ("googlenet", {"aux_logits": False, "init_weights": True}, 224, ""),
    "inception_v3": ("inception_v3", {"aux_logits": False, "init_weights": True}, 160, "160x160 (own: 299)"),
    "convnext_tiny": ("convnext_tiny", {}, 160, "160x160"),
    "vit_b_16": ("vit_b_16", {"image_size": 112}, 112, "112x112 (49 patches)"),
    "swin_t": ("swin_t", {}, 112, "112x112"),
}

BERT_SIZE = {"hidden_size": 768, "num_hidden_layers": 4, "num_attention_heads": 12, "intermediate_size": 3072}
SEQ = 128


def _vision(name: str):
    import torch

    builder, kwargs, image, _ = VISION[name]
    module = getattr(torchvision_models(), builder)(weights=None, **kwargs)
    return module, (torch.randn(1, 3, image, image),), ["pixel_values"]


def _text(config_cls: str, model_cls: str, vocab: int = 30522, seq: int = SEQ, part: Callable | None = None,
          **config):  # fmt: skip
    import torch
    import transformers

    cfg = getattr(transformers, config_cls)(vocab_size=vocab, **config)
    cfg._attn_implementation = "eager"
    module = getattr(transformers, model_cls)(cfg)
    if part is not None:
        module = part(module)
    ids = torch.randint(0, vocab, (1, seq))
    return module, (ids, torch.ones(1, seq, dtype=torch.int64)), ["input_ids", "attention_mask"]


def _image(config_cls: str, model_cls: str, image: int = 224, channels: int = 3, **config):
    import torch
    import transformers

    cfg = getattr(transformers, config_cls)(image_size=image, **config)
    cfg._attn_implementation = "eager"
    return getattr(transformers, model_cls)(cfg), (torch.randn(1, channels, image, image),), ["pixel_values"]


def _whisper_encoder():
    import torch
    import transformers

    cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                                     decoder_layers=1, num_mel_bins=80, max_source_positions=750)  # fmt: skip
    cfg._attn_implementation = "eager"
    return transformers.WhisperModel(cfg).get_encoder(), (torch.randn(1, 80, 1500),), ["input_features"]


# name -> (builder of (module, example args, input names), config note)
TRANSFORMERS: dict[str, tuple[Callable, str]] = {
    "bert": (lambda: _text("BertConfig", "BertModel", **BERT_SIZE), "base width, 4 layers, seq 128"),
    "roberta": (lambda: _text("RobertaConfig", "RobertaModel", 50265, max_position_embeddings=514, **BERT_SIZE),
                "base width, 4 layers, seq 128"),
    "distilbert": (lambda: _text("DistilBertConfig", "DistilBertModel", dim=768, n_layers=4, n_heads=12,
                                 hidden_dim=3072), "base width, 4 layers, seq 128"),
    "albert": (lambda: _text("AlbertConfig", "AlbertModel", 30000, embedding_size=128, **BERT_SIZE),
               "base width, 4 layers, seq 128"),
    "electra": (lambda: _text("ElectraConfig", "ElectraModel", embedding_size=128, hidden_size=256,
                              num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024),
                "electra-small (full), seq 128"),
    "gpt2": (lambda: _text("GPT2Config", "GPT2Model", 50257, n_layer=4, n_embd=768, n_head=12,
                           n_positions=1024, use_cache=False), "base width, 4 layers, seq 128"),
    "llama": (lambda: _text("LlamaConfig", "LlamaModel", 32000, hidden_size=512, intermediate_size=1376,
                            num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, use_cache=False),
              "width 512, GQA 8/4 heads, 4 layers, seq 128"),
    "t5_encoder": (lambda: _text("T5Config", "T5EncoderModel", 32128, d_model=512, d_ff=2048, num_layers=4,
                                 num_heads=8, d_kv=64), "t5-small width, 4 layers, seq 128"),
    "bart_encoder": (lambda: _text("BartConfig", "BartModel", 50265, part=lambda m: m.get_encoder(), d_model=768,
                                   encoder_layers=4, decoder_layers=1, encoder_attention_heads=12,
                                   encoder_ffn_dim=3072), "base width, 4 layers, seq 128"),
    "clip_text": (lambda: _text("CLIPTextConfig", "CLIPTextModel", 49408, seq=77, hidden_size=512,
                                intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8),
                  "width 512, 4 layers, seq 77"),
    "vit": (lambda: _image("ViTConfig", "ViTModel", **BERT_SIZE), "base width, 4 layers, 224x224"),
    "deit": (lambda: _image("DeiTConfig", "DeiTModel", **BERT_SIZE), "base width, 4 layers, 224x224"),
    "clip_vision": (lambda: _image("CLIPVisionConfig", "CLIPVisionModel", patch_size=32, **BERT_SIZE),
                    "base width, 4 layers, patch 32, 224x224"),
    "swin": (lambda: _image("SwinConfig", "SwinModel", depths=[2, 2, 2, 2]), "tiny width, depths 2-2-2-2, 224x224"),
    "convnext": (lambda: _image("ConvNextConfig", "ConvNextModel", depths=[2, 2, 2, 2]),
                 "tiny width, depths 2-2-2-2, 224x224"),
    "whisper_encoder": (_whisper_encoder, "tiny width, 4 layers, 1500 frames (15 s)"),
}  # fmt: skip

MODELS = list(VISION) + list(TRANSFORMERS)
QUICK = ["resnet18", "squeezenet1_1", "mobilenet_v3_small", "bert", "gpt2"]


def config_note(name: str) -> str:
    return VISION[name][3] if name in VISION else TRANSFORMERS[name][1]


def first_output(module, names: list[str] | None):
    """`module` called with its inputs by keyword (`names`; None: in order), returning only its first output
    (last_hidden_state, or the logits): one ONNX output."""
    import torch

    class FirstOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *args):
            out = self.inner(*args) if names is None else self.inner(**dict(zip(names, args)))
            return out if isinstance(out, torch.Tensor) else out[0]

    return FirstOutput()


def export(name: str, cache: Path) -> Path:
    """The model's directory in the cache, with model.onnx, inputs.npz and ort.npz (onnxruntime's outputs)."""
    d = cache / name
    if (d / "ort.npz").exists():
        return d
    import warnings

    import torch

    from ember.runtime.compare import onnxruntime_session

    if importlib.util.find_spec("torchvision") is not None:
        torchvision_models()  # before transformers imports torchvision (and fails on its missing C ops)
    torch.manual_seed(0)
    module, args, names = _vision(name) if name in VISION else TRANSFORMERS[name][0]()
    module = first_output(module.eval(), names if name in TRANSFORMERS else None)
    with torch.no_grad():
        for bn in (b for b in module.modules() if isinstance(b, torch.nn.BatchNorm2d)):  # statistics other than 0/1
            bn.running_mean.copy_(torch.randn(bn.num_features) * 0.1)
            bn.running_var.copy_(torch.rand(bn.num_features) + 0.5)
        for w in module.parameters():  # zero-initialized layers (torchvision's ViT head) would make the output 0
            if w.numel() > 1 and not w.any():
                w.normal_(0.0, 0.02)
    staged = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache))
    try:
        with warnings.catch_warnings():  # grad mode: inference mode takes nn.MultiheadAttention's fused path
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, str(staged / "model.onnx"), input_names=names, output_names=["y"],
                              opset_version=17, dynamo=False)  # fmt: skip
        feeds = {n: a.numpy() for n, a in zip(names, args)}
        np.savez(staged / "inputs.npz", **feeds)
        outs = onnxruntime_session(str(staged / "model.onnx"), 1).run(None, feeds)
        np.savez(staged / "ort.npz", *outs)
        if not d.exists():  # another sweep may have exported it meanwhile
            os.replace(staged, d)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return d


# -- one measurement per process ----------------------------------------------------------------------------------
def load_system(system: str, path: Path, threads: int, feeds: dict) -> tuple[Callable[[], object], dict]:
    """A callable running the model once on `feeds`, and facts about it (compile seconds, Ember's outputs)."""
    t0 = time.perf_counter()
    if system == "ember":
        import ember

        m = ember.compile(str(path / "model.onnx"), target=f"c -threads={threads}")
        facts = {"compile_s": time.perf_counter() - t0, "model": m}
        return (lambda: m.run(feeds)), facts
    if system == "onnxruntime":
        from ember.runtime.compare import onnxruntime_session

        sess = onnxruntime_session(str(path / "model.onnx"), threads)
        return (lambda: sess.run(None, feeds)), {"compile_s": time.perf_counter() - t0}
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "f32"}  # fmt: skip
    request = core.compile_model(str(path / "model.onnx"), "CPU", config).create_infer_request()
    return (lambda: request.infer(feeds)), {"compile_s": time.perf_counter() - t0}


def worst_kernels(m, model: str, keep: int = 5) -> tuple[list[dict], float | None]:
    """Ember's kernels of at least 2% of the model's time with the lowest roofline fractions, and the model's."""
    rows = [r for r in m.profile(repeat=3) if r.get("roofline") is not None and r["share"] >= 0.02]
    rows.sort(key=lambda r: r["roofline"])
    keys = ("kernel", "seconds", "share", "gflops", "gbs", "bound", "roofline")
    fraction = (m.summary().get("roofline") or {}).get("fraction")
    return [{"model": model, "ops": "+".join(r["ops"])} | {k: r[k] for k in keys} for r in rows[:keep]], fraction


def serve(system: str, path: Path, threads: int, cpu_time: bool = False) -> None:
    """A measurement process held open (`--worker`): loads one system with the model, prints its facts as one JSON
    line, then answers each line of stdin with one: "time N" (an untimed call, then N timed ones: {"times": seconds}),
    "profile" (Ember's worst kernels), "quit"."""
    with np.load(path / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    run, facts = load_system(system, path, threads, feeds)
    out: dict = {"compile_s": facts["compile_s"]}
    if system == "ember":
        m = facts["model"]
        with np.load(path / "ort.npz") as z:
            ref = [z[k] for k in z.files]
        ours = list(m.run(feeds).values())
        out["rel_err"] = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ours, ref))
        out["fallback"] = len(m.summary()["fallback_ops"])
        out["cached"] = m.summary().get("compile_cache") == "hit"
    run()  # one warm-up call (Ember's model has run once already, for the error)
    print(json.dumps(out), flush=True)
    clock = time.process_time if cpu_time else time.perf_counter  # CPU time: all of the process's threads
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "time":  # after an untimed call: the caches hold this model again, not the other systems'
            run()
            times = []
            for _ in range(int(arg[0])):
                t0 = clock()
                run()
                times.append(clock() - t0)
            reply: dict = {"times": times}
        elif cmd == "profile" and system == "ember":
            worst, fraction = worst_kernels(facts["model"], path.name)
            reply = {"worst": worst, "roofline": fraction}
        else:
            return
        print(json.dumps(reply), flush=True)


class Server:
    """One system's measurement process (`serve`), started at once and asked line by line."""

    def __init__(self, system: str, path: Path, threads: int, cpu_time: bool):
        cmd = [sys.executable, __file__, "--worker", system, "--path", str(path), "--threads", str(threads)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        # stderr to a file: a pipe nobody reads would block a process that warns a lot
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - read and dropped with the Server
        self.proc = subprocess.Popen(cmd + (["--cpu-time"] if cpu_time else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)  # fmt: skip

    def reply(self, ask: str | None = None, timeout: float = WORKER_TIMEOUT) -> dict:
        """The next line the process prints (after sending `ask`), or {"error": ...} where it died or timed out."""
        try:
            if ask is not None:
                self.proc.stdin.write(ask + "\n")
                self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            line = ""
        if line.startswith("{"):
            return json.loads(line)
        self.close()
        self.stderr.seek(0)
        err = [ln for ln in self.stderr.read().strip().splitlines() if ln.strip()]
        if not ready:
            return {"error": f"no reply in {timeout:.0f} s"}
        return {"error": (err[-1] if err else f"exit status {self.proc.returncode}")[:200]}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def available_systems() -> tuple[list[str], list[str]]:
    systems, notes = [], []
    for s, module in zip(SYSTEMS, ("ember", "onnxruntime", "openvino")):
        if importlib.util.find_spec(module) is None:
            notes.append(f"{s} skipped: the {module} package is not installed (pip install -e '.[zoo]')")
        else:
            systems.append(s)
    return systems, notes


CALLS_PER_TURN = 2  # timed, after an untimed one that brings the model back into the caches
SETTLE_S = 0.05  # between two systems' calls: the last one's threads stop spinning (onnxruntime's, TBB's)
TURN_BUDGET_S = 3.0  # per system and round: fewer calls than --repeat for models past ~0.3 s a call


def sweep_one(name: str, path: Path, systems: list[str], threads: int, rounds: int, repeat: int,
              cpu_time: bool = False) -> dict:  # fmt: skip
    """Per round, every system's process is started and loaded, then they take turns call by call (the order
    rotating), so that a drift of the machine (another tenant, a host that packs both vCPUs onto one core for a
    few seconds) hits all of them alike."""
    times: dict[str, list[float]] = {s: [] for s in systems}
    row: dict = {"model": name, "config": config_note(name), "errors": {}}
    for r in range(rounds):
        servers = {s: Server(s, path, threads, cpu_time) for s in systems if s not in row["errors"]}
        try:
            for s, srv in list(servers.items()):
                facts = srv.reply()
                if "error" in facts:
                    row["errors"][s] = facts["error"]
                    del servers[s]
                elif s == "ember":
                    row.update({k: facts[k] for k in ("rel_err", "fallback", "cached") if k in facts})
                    row["compile_s" if r == 0 else "recompile_s"] = facts["compile_s"]
            spent = dict.fromkeys(servers, 0.0)
            for turn in range(repeat):
                order = list(servers)[turn % max(len(servers), 1):] + list(servers)[:turn % max(len(servers), 1)]
                for s in order:
                    if s not in servers or (turn >= 3 and spent[s] > TURN_BUDGET_S):
                        continue
                    res = servers[s].reply(f"time {CALLS_PER_TURN}")
                    if "error" in res:
                        row["errors"][s] = res["error"]
                        del servers[s]
                        continue
                    times[s] += res["times"]
                    spent[s] += sum(res["times"])
                    time.sleep(SETTLE_S)
            if r == 0 and "ember" in servers:
                prof = servers["ember"].reply("profile")
                row.update(prof) if "error" not in prof else row["errors"].setdefault("ember profile", prof["error"])
        finally:
            for srv in servers.values():
                srv.close()
    row["ms"] = {s: statistics.median(t) * 1e3 for s, t in times.items() if t}
    others = [row["ms"][s] for s in ("onnxruntime", "openvino") if s in row["ms"]]
    if "ember" in row["ms"] and others:
        row["ratio"] = min(others) / row["ms"]["ember"]
    return row


def fmt_ms(row: dict, s: str) -> str:
    return f"{row['ms'][s]:.2f}" if s in row["ms"] else ("fail" if s in row["errors"] else "-")


def print_table(rows: list[dict], threads: int) -> float | None:
    print(f"\n{threads} thread(s): ratio = min(ort, openvino) / ember (> 1: Ember faster); medians of all calls")
    print(f"{'model':<20} {'ember ms':>9} {'ort ms':>9} {'ov ms':>9} {'ratio':>6} {'rel err':>8} {'roof':>5} "
          f"{'compile s':>9}  config / notes")  # fmt: skip
    for row in sorted(rows, key=lambda r: r.get("ratio", -1.0)):
        ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
        err = f"{row['rel_err']:.1e}" if "rel_err" in row else "-"
        roof = f"{row['roofline']:.0%}" if row.get("roofline") else "-"
        comp = f"{row['compile_s']:.1f}{'*' if row.get('cached') else ''}" if row.get("compile_s") is not None else "-"
        notes = [row["config"]] if row["config"] else []
        if row.get("rel_err", 0.0) > MISMATCH:
            notes.append("MISMATCH vs onnxruntime")
        if row.get("fallback"):
            notes.append(f"{row['fallback']} ops on the numpy reference")
        notes += [f"{s} failed: {e}" for s, e in row["errors"].items()]
        print(f"{row['model']:<20} {fmt_ms(row, 'ember'):>9} {fmt_ms(row, 'onnxruntime'):>9} "
              f"{fmt_ms(row, 'openvino'):>9} {ratio:>6} {err:>8} {roof:>5} {comp:>9}  {'; '.join(notes)}")  # fmt: skip
    print("compile s: Ember's compile in the first measurement process (*: loaded from the whole-model compile cache)")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if not ratios:
        return None
    gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    below = sum(1 for x in ratios if x < 0.9)
    print(f"geometric mean over {len(ratios)} models: {gm:.2f}x  (min {min(ratios):.2f}, max {max(ratios):.2f}; "
          f"{below} below 0.9x)")  # fmt: skip
    return gm


def print_worst(rows: list[dict], threads: int, top: int = 10) -> list[dict]:
    worst = sorted((k for r in rows for k in r.get("worst", [])), key=lambda k: k["roofline"])[:top]
    print(f"\nten worst kernels by roofline fraction, {threads} thread(s) (kernels of >= 2% of their model's time)")
    print(f"{'model':<20} {'kernel':<28} {'ms':>7} {'share':>6} {'GFLOP/s':>8} {'GB/s':>6} {'bound':>7} {'roof':>5}"
          "  ops")  # fmt: skip
    for k in worst:
        print(f"{k['model']:<20} {k['kernel'][:28]:<28} {k['seconds'] * 1e3:>7.3f} {k['share']:>6.1%} "
              f"{k['gflops']:>8.1f} {k['gbs']:>6.1f} {k['bound']:>7} {k['roofline']:>5.1%}  "
              f"{k['ops'][:60]}")  # fmt: skip
    return worst


def report(files: list[str]) -> None:
    """The tables of saved sweeps ({threads: rows}), rows of the same model and thread count from later files win."""
    merged: dict[str, dict[str, dict]] = {}
    for f in files:
        for threads, rows in json.loads(Path(f).read_text()).items():
            merged.setdefault(threads, {}).update({r["model"]: r for r in rows})
    for threads in sorted(merged, key=int):
        print_table(list(merged[threads].values()), int(threads))
        print_worst(list(merged[threads].values()), int(threads))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="comma-separated names (default: all; --list prints them)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=2,
                   help="process sets per model and thread count (each: the systems' calls in turns)")
    p.add_argument("--repeat", type=int, default=10,
                   help="turns per round: two timed calls per system each (fewer past ~3 s)")
    p.add_argument("--quick", action="store_true", help=f"one round of 5 calls on {','.join(QUICK)} (unless "
                   "--models is given), 1 thread (unless --threads is given)")  # fmt: skip
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "ember-zoo"))
    p.add_argument("--json", action="store_true")
    p.add_argument("--cpu-time", action="store_true", help="time calls by the process's CPU time, not the wall "
                   "clock: the steadier measure on a loaded machine at 1 thread")  # fmt: skip
    p.add_argument("--list", action="store_true")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="print the tables of earlier sweeps' results (their sweep-<pid>.json files) merged")
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        serve(args.worker, Path(args.path), int(args.threads), args.cpu_time)
        return
    if args.list:
        print("\n".join(f"{n:<20} {config_note(n)}" for n in MODELS))
        return
    if args.report:
        report(args.report)
        return
    threads_default = p.get_default("threads")
    if args.quick:
        args.rounds, args.repeat = 1, 5
        args.models = args.models or ",".join(QUICK)
        args.threads = args.threads if args.threads != threads_default else "1"
    names = args.models.split(",") if args.models else MODELS
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    systems, notes = available_systems()
    for n in notes:
        print(n)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    paths, failed = {}, {}
    for name in names:
        try:
            paths[name] = export(name, cache)
        except Exception as e:  # noqa: BLE001 - a model that does not export is a row, not the end of the sweep
            failed[name] = f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
    print(f"{len(paths)} models exported to {cache} (torch.onnx, opset 17); systems: {', '.join(systems)}; "
          f"{args.rounds} round(s) of up to {args.repeat} turns of 2 calls per system")  # fmt: skip
    results: dict = {"systems": systems, "notes": notes}
    thread_counts = [int(t) for t in args.threads.split(",")]
    rows: dict[int, list[dict]] = {t: [] for t in thread_counts}
    for name in names:  # every thread count of a model before the next model: a cut-short sweep covers both
        for threads in thread_counts:
            if name in failed:
                rows[threads].append({"model": name, "config": config_note(name), "errors": {"export": failed[name]},
                                      "ms": {}})  # fmt: skip
                continue
            r = sweep_one(name, paths[name], systems, threads, args.rounds, args.repeat, args.cpu_time)
            rows[threads].append(r)
            print(f"  {name}, {threads} thread(s): " + ", ".join(f"{s} {v:.2f} ms" for s, v in r["ms"].items())
                  + (f", rel err {r['rel_err']:.1e}" if "rel_err" in r else "")
                  + (f", errors: {r['errors']}" if r["errors"] else ""), flush=True)  # fmt: skip
        (cache / f"sweep-{os.getpid()}.json").write_text(  # what a cut-short sweep measured
            json.dumps({str(t): v for t, v in rows.items()}, default=str))
    for threads in thread_counts:
        gm = print_table(rows[threads], threads)
        worst = print_worst(rows[threads], threads)
        results[str(threads)] = {"rows": rows[threads], "geomean": gm, "worst": worst}
    if args.json:
        print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
