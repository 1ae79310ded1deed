#!/usr/bin/env python
"""Greedy decoding with a KV cache: GPT-2 (random weights) compiled once by Ember with symbolic batch, past and
sequence lengths, against onnxruntime running the same ONNX model the same way.

    python bench/decode.py                                   # 2 layers at GPT-2-small width, vocab 50257
    python bench/decode.py --d 256 --heads 4 --vocab 8000 --threads 1

The model is transformers' GPT2LMHeadModel exported by torch's dynamo exporter with its past key/values as inputs
and present key/values as outputs (`ember.zoo_torch.gpt2_with_kv_cache`). Each generation runs the prompt
(past = 0, seq = --prompt) and --steps decoding steps of one token (past = prompt .. prompt + steps - 1), feeding
present -> past. Per thread count: the median prompt time and time per decoded token of Ember and onnxruntime,
their ratio, the largest logit difference over all steps and how many tokens agree. Ember's first generation
also makes the run-time plan of each new size (shown apart: "1st gen"); the medians are over the later ones.
One compile per thread count: a second would fail the run.

On a machine with more runnable processes than cores, OpenMP's barriers dominate Ember's multi-threaded times
(each kernel is a parallel region; libgomp spins, then waits for a descheduled thread): run with
OMP_WAIT_POLICY=passive there, and compare the 1-thread rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ember  # noqa: E402


class Timed:
    """`run(feeds)` that records the seconds of each call."""

    def __init__(self, run):
        self.run, self.seconds = run, []

    def __call__(self, feeds: dict) -> dict:
        t0 = time.perf_counter()
        out = self.run(feeds)
        self.seconds.append(time.perf_counter() - t0)
        return out


def generations(run, model, prompt, steps: int, repeat: int):
    """(tokens and logits of the first generation, per-call seconds of each generation)."""
    from ember import zoo_torch

    first, times = None, []
    for _ in range(repeat):
        timed = Timed(run)
        result = zoo_torch.greedy_decode(timed, model, prompt, steps)
        first = first or result
        times.append(timed.seconds)
    return first, times


def ms_per_token(times: list[list[float]]) -> float:
    return 1e3 * statistics.median(t for gen in times for t in gen[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=3, help="generations timed per engine (after the first)")
    args = p.parse_args()
    import onnxruntime as ort

    from ember import zoo_torch

    positions = 2 * (args.prompt + args.steps)
    t0 = time.perf_counter()
    model = zoo_torch.gpt2_with_kv_cache(layers=args.layers, d=args.d, heads=args.heads, vocab=args.vocab,
                                         positions=positions)  # fmt: skip
    print(f"GPT-2 {args.layers} layers, d={args.d}, heads={args.heads}, vocab={args.vocab}: exported in "
          f"{time.perf_counter() - t0:.1f} s; prompt {args.prompt} tokens, {args.steps} decoding steps")  # fmt: skip
    prompt = np.random.default_rng(0).integers(0, args.vocab, args.prompt)
    bounds = {"batch": (1, 1), "seq": (1, positions), "past": (0, positions)}
    header = (f"{'threads':>7} {'compile s':>9} {'ember prompt ms':>15} {'ember ms/token':>14} {'1st gen':>8} "
              f"{'ort prompt ms':>13} {'ort ms/token':>12} {'ember/ort':>9} {'max logit diff':>14} {'max |logit|':>11} "
              f"{'tokens':>7}")
    print(header)
    for threads in [int(t) for t in args.threads.split(",")]:
        t0 = time.perf_counter()
        compiled = ember.compile(model, target=f"c -threads={threads}", dynamic_bounds=bounds)
        t_compile = time.perf_counter() - t0
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(model.SerializeToString(), opts)
        names = [o.name for o in sess.get_outputs()]
        def ort_run(feeds: dict, sess=sess, names=names) -> dict:
            return dict(zip(names, sess.run(None, feeds)))

        (want_tokens, want_logits), ort_times = generations(ort_run, model, prompt, args.steps, args.repeat + 1)
        (tokens, logits), ember_times = generations(compiled.run, model, prompt, args.steps, args.repeat + 1)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(logits, want_logits))
        scale = max(float(np.abs(b).max()) for b in want_logits)
        agree = sum(a == b for a, b in zip(tokens, want_tokens))
        e_tok, o_tok = ms_per_token(ember_times[1:]), ms_per_token(ort_times[1:])
        e_prompt = 1e3 * statistics.median(g[0] for g in ember_times[1:])
        o_prompt = 1e3 * statistics.median(g[0] for g in ort_times[1:])
        first = ms_per_token(ember_times[:1])
        print(f"{threads:>7} {t_compile:>9.1f} {e_prompt:>15.2f} {e_tok:>14.2f} {first:>8.2f} {o_prompt:>13.2f} "
              f"{o_tok:>12.2f} {e_tok / o_tok:>9.2f} {diff:>14.1e} {scale:>11.1f} {agree:>3}/{len(tokens):<3}")
    print(f"tokens (Ember): {tokens}")


if __name__ == "__main__":
    main()
