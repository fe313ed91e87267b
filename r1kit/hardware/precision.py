"""bfloat16 on a CPU: when r1kit chooses it by itself.

On a machine without a GPU, r1kit trains with bfloat16 autocast (TRL's ``bf16: true``) and samples
with bfloat16 weights when both hold:

- the CPU computes bfloat16 in hardware: x86's AVX512-BF16 or AMX-BF16, Arm's BF16 (the ``flags``
  or ``Features`` of ``/proc/cpuinfo``); without them bfloat16 is emulated and slower;
- the model's matrices are large enough to pay for the casts: ``hidden_size`` of at least
  `MIN_HIDDEN`. Measured on 2 cores with AMX: a GRPO step of SmolLM2-135M (hidden 576) took 0.79x
  the float32 step's time, sampling it 0.4-0.6x; r1kit's tiny model (hidden 128) was slower in
  bfloat16 (a GRPO step 1.35x float32's time).

A recipe's own choice always wins: ``trainer: {bf16: false}`` for training, ``backend_options:
{dtype: float32}`` for sampling; where bfloat16 is not chosen, the trainer runs in float32 and a
sampler keeps its backend's default. Weights are kept and saved in float32 either way: autocast
computes matrix products in bfloat16 from float32 master weights. The choice is the same for SFT
and GRPO stages (their forward and backward passes are alike: in the GRPO step above that part
took 0.80x float32's time), and for a LoRA stage, whose rollouts gain less: autocast keeps cast
copies of trainable weights only, so a frozen base is cast again at every decoding step (not
measured).

A recipe that asks for bfloat16 itself (``trainer: {bf16: true}``, ``model_init_kwargs: {dtype:
bfloat16}``, ``backend_options: {dtype: bfloat16}``, as GPU recipes do) on a machine with neither
a GPU nor a CPU that computes bfloat16 is refused before the first stage (`emulated_bf16`, through
r1kit.pipeline's machine check; ``r1kit validate`` notes it): there every bfloat16 product is
emulated, at about 1/70 of float32's rate (2.2 against 155 GFLOP/s on 2 cores with torch's AVX2
kernels), so a run would take hours where float32 takes minutes. The fix is in the message: set
the field to float32 / false, or leave it out and let r1kit choose.

Not here: anything on GPUs, where TRL's and vLLM's own defaults apply.
"""

from __future__ import annotations

import logging
from pathlib import Path

MIN_HIDDEN = 512
NATIVE_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def _cpu_fields(cpuinfo: str | None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (or of `cpuinfo`, its text); empty where unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def native_bf16(cpuinfo: str | None = None) -> bool:
    """True when this CPU computes bfloat16 in hardware (`cpuinfo`: the text of /proc/cpuinfo)."""
    fields = _cpu_fields(cpuinfo)
    flags = set(fields.get("flags", fields.get("Features", "")).split())
    return bool(flags & NATIVE_FLAGS)


VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "avx_ne_convert", "asimd", "sve", "bf16")


def describe_cpu(cpuinfo: str | None = None) -> str:
    """One line naming this CPU for a benchmark's figures: model, family/model numbers, cores,
    the vector and bfloat16 flags it has, whether r1kit counts it as computing bfloat16, and the
    vector kernels torch runs (``ATEN_CPU_CAPABILITY`` can hold them below what the CPU has)."""
    import os

    import torch

    fields = _cpu_fields(cpuinfo)
    name = fields.get("model name") or fields.get("CPU part") or "unknown CPU"
    family = f", family {fields['cpu family']} model {fields.get('model', '?')}" if "cpu family" in fields else ""
    flags = set(fields.get("flags", fields.get("Features", "")).split())
    vector = " ".join(f for f in VECTOR_FLAGS if f in flags) or "none listed"
    bf16 = "bfloat16 in hardware" if flags & NATIVE_FLAGS else "no bfloat16 arithmetic"
    return f"CPU: {name}{family}, {os.cpu_count()} cores; flags: {vector}; {bf16}; torch kernels: {torch.backends.cpu.get_cpu_capability()}"


def emulated_bf16(asks: dict[str, dict[str, bool]], gpu: bool) -> list[str]:
    """The settings that ask for bfloat16 where it would be emulated (no `gpu`, and a CPU without
    bfloat16 arithmetic), one line each: ``stage.key.path: why; the fix``. `asks` maps each stage's
    name to its settings that may ask (key: asked; each stage kind says which, r1kit.stages.hooks).
    Empty elsewhere."""
    if gpu or native_bf16():
        return []
    cost = "this machine has no GPU and its CPU no bfloat16 arithmetic, where bfloat16 products run about 70x slower than float32"
    problems = []
    for name, settings in asks.items():
        for key in (k for k, on in settings.items() if on):
            fix = "false" if key.endswith("bf16") else "float32"
            problems.append(f"{name}.{key}: {cost}; set {name}.{key}={fix}, or leave it out and r1kit chooses")
    return problems




def hidden_size(model: str) -> int | None:
    """The hidden size of `model` (a folder, or a hub id as transformers finds it: TRL loads the
    same config next), read through transformers' config classes so that other names for it
    (GPT-2's ``n_embd``, ...) count; None when no config can be read or it has none."""
    from transformers import AutoConfig

    folder = Path(model).expanduser()
    try:
        config = AutoConfig.from_pretrained(str(folder) if folder.is_dir() else model)
    except (OSError, ValueError):
        return None
    size = getattr(config.get_text_config(), "hidden_size", None)
    return size if isinstance(size, int) else None


def cpu_bf16(model: str, cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether bfloat16 pays for `model` on this CPU, and why, in words for the log."""
    if not native_bf16(cpuinfo):
        return False, "the CPU has no bfloat16 arithmetic (AVX512-BF16, AMX-BF16 or Arm BF16)"
    size = hidden_size(model)
    if size is None:
        return False, f"no config with a hidden size could be read for {model}"
    if size < MIN_HIDDEN:
        return False, f"the model's hidden size {size} is below {MIN_HIDDEN}: casts cost more than they save"
    return True, f"the CPU computes bfloat16 and the model's hidden size is {size} (>= {MIN_HIDDEN})"


def sampling_dtype(model: str) -> str | None:
    """``"bfloat16"`` when a sampler on this machine should load `model` in it (no GPU, and
    `cpu_bf16` says it pays), logged; else None, and the backend keeps its own default."""
    from r1kit.hardware import has_gpu

    if has_gpu():
        return None
    bf16, why = cpu_bf16(model)
    if not bf16:
        return None
    logging.getLogger("r1kit").info("sampling in bfloat16: %s (backend_options.dtype overrides)", why)
    return "bfloat16"
