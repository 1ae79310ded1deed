"""torch.compile(backend="ember") against torch.compile (inductor) and eager PyTorch, side by side in one run.

    python bench/torch_compile.py [--models resnet18,bert] [--threads 1,2] [--repeat 20] [--image 224]
                                  [--bert-layers 12] [--seq 128]

ResNet-18 (torchvision's architecture, ember.zoo_torch, batch 1 at 224x224) and Hugging Face BERT-base
(transformers' BertModel from a config with random weights: 12 layers, hidden 768, 12 heads, sequence 128,
batch 1), under torch.inference_mode. Per model and thread count (torch.set_num_threads for torch; the Ember
target "c -threads=N"): each system's compile time (its first call), the median latency of a call (the systems
take turns in blocks, ember.runtime.compare.interleaved_medians), the ratios to Ember, and the max relative
difference of each compiled output from eager. Ember freezes the weights as constants (as inductor does only
with torch._inductor.config.freezing, off by default here: what a torch.compile user gets).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import numpy as np
import torch

from ember import zoo_torch
from ember.dynamo import ember_backend
from ember.runtime.compare import interleaved_medians


def build(name: str, args: argparse.Namespace) -> tuple[torch.nn.Module, tuple]:
    g = torch.Generator().manual_seed(0)
    if name == "resnet18":
        module, inputs, _ = zoo_torch.example("resnet18", image=args.image)
        return module, inputs
    if name == "bert":
        import transformers

        cfg = transformers.BertConfig(num_hidden_layers=args.bert_layers)
        module = transformers.BertModel(cfg).eval()
        ids = torch.randint(0, cfg.vocab_size, (1, args.seq), generator=g)
        return _LastHidden(module).eval(), (ids, torch.ones(1, args.seq, dtype=torch.int64))
    raise KeyError(f"unknown model {name!r} (have: resnet18, bert)")


class _LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def bench(name: str, threads: int, args: argparse.Namespace) -> dict:
    module, inputs = build(name, args)
    torch.set_num_threads(threads)
    systems: dict[str, Callable[[], torch.Tensor]] = {}
    compile_s, diffs = {}, {}
    with torch.inference_mode():
        ref = module(*inputs)
        for system, backend in [("ember", functools.partial(ember_backend, target=f"c -threads={threads}")),
                                ("inductor", "inductor"), ("eager", None)]:  # fmt: skip
            torch._dynamo.reset()
            fn = module if backend is None else torch.compile(module, backend=backend)
            t0 = time.perf_counter()
            out = fn(*inputs)
            compile_s[system] = time.perf_counter() - t0
            diffs[system] = float((out - ref).abs().max() / ref.abs().max())
            systems[system] = functools.partial(fn, *inputs)
        med = {k: v * 1e3 for k, v in interleaved_medians(systems, args.repeat).items()}
    return {"ms": med, "ratio": {k: med[k] / med["ember"] for k in med}, "compile_s": compile_s, "diff": diffs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,bert")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--bert-layers", type=int, default=12)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    head = ("model", "threads", "ember ms", "inductor ms", "eager ms", "inductor/ember", "eager/ember",
            "compile s (ember/inductor)", "rel diff (ember/inductor)")  # fmt: skip
    print("{:<9} {:>7} {:>9} {:>12} {:>9} {:>15} {:>12} {:>27} {:>26}".format(*head))
    ratios: dict[str, list[float]] = {"inductor": [], "eager": []}
    for threads in [int(t) for t in args.threads.split(",")]:
        for name in args.models.split(","):
            r = bench(name, threads, args)
            ms, c, d = r["ms"], r["compile_s"], r["diff"]
            print(f"{name:<9} {threads:>7} {ms['ember']:>9.2f} {ms['inductor']:>12.2f} {ms['eager']:>9.2f} "
                  f"{r['ratio']['inductor']:>15.2f} {r['ratio']['eager']:>12.2f} "
                  f"{c['ember']:>12.1f} / {c['inductor']:<12.1f} {d['ember']:>12.1e} / {d['inductor']:<11.1e}",
                  flush=True)  # fmt: skip
            for k in ratios:
                ratios[k].append(r["ratio"][k])
    for k, v in ratios.items():
        gm = float(np.exp(np.mean(np.log(v))))
        print(f"geometric mean {k}/ember: {gm:.2f}  (> 1: Ember faster; Ember = {1 / gm:.2f} x {k})")


if __name__ == "__main__":
    main()
