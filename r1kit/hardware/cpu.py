"""What r1kit changes to train and sample fast on a CPU, where TRL and torch are tuned for GPUs.

- `share_cores`: the processes of a launched run on one node (``--accelerate-config``) divide
  its cores among them, as one process alone uses them all.
- `keep_freed_memory`: the C allocator keeps memory it has been handed back, instead of returning
  it to the system. glibc serves every allocation above 32 MiB with a fresh `mmap` and unmaps it
  on free, so each large temporary tensor (a [tokens, vocabulary] tile of logits is 50-200 MiB)
  page-faults its way in again: on 2 cores an elementwise product over such a tensor took 21 ms
  that way and 4.5 ms in reused memory, and a GRPO step of SmolLM2-135M spent a third of its
  forward and backward there.
- `WholeVocabLogProbs`: TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``) computes each
  completion token's log-probability and entropy without building the logits, in vocabulary tiles
  folded by a Triton kernel. Without Triton it folds them with a dozen float32 passes over each
  tile, casts the tiles back to float32 for its gradient products, and projects every position,
  prompt included. r1kit.trainers.trl_patches.log_probs_on_cpu has it project completion
  positions only, through this function: one bfloat16 (or float32) product over the whole
  vocabulary for a block of tokens, a log-softmax, and the gradient from the same.

- `packed_linears`: while decoding, linear layers multiply by weights packed once in oneDNN's
  blocked layout. In float32 torch's products go through MKL, which on AMD CPUs runs at well
  under half of oneDNN's rate (2048-cube products: 180 against 430 GFLOP/s on 2 Zen 5 cores), and
  every call packs its weight again. Where oneDNN cannot pack a dtype on the CPU at hand
  (bfloat16 without AVX512-BF16, AMX or AVX-512 BW/VL/DQ), the layers keep torch's own products:
  `packing_available` asks the library once and logs the path taken.
- `MATH_ATTENTION_UP_TO`: the key length up to which training attention runs SDPA's math kernel
  on a CPU (r1kit.trainers.trl_patches.short_attention_in_math): its backward is faster there than
  the flash kernel's. Forward and backward over 16 x 9 heads with a padding mask took 20 ms at 57
  positions (a GRPO batch of short answers) against 11 ms in math, and 45 against 27 at 128; the
  flash kernel wins from about 160 on (2 cores, bfloat16).

Not here: the patches that put these into TRL's and transformers' code (r1kit.trainers.trl_patches),
what is chosen in bfloat16 (r1kit.hardware.precision), r1kit's decoding loop
(r1kit.sampling.decode), anything on a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ctypes.util
import logging
import os

import torch

from r1kit.hardware import World, cores, has_gpu

log = logging.getLogger(__name__)

MATH_ATTENTION_UP_TO = 128  # key positions up to which SDPA's math kernel trains faster than its flash kernel on a CPU

# mallopt(3) parameters
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
INT_MAX = 2**31 - 1  # mallopt takes a C int
# Tokens per block of logits: [512, 49152] in float32 is 96 MiB, and a block holds three such.
BLOCK_ROWS = 512
_kept = False


def share_cores(world: World) -> int | None:
    """In a run of several processes on this node without a CUDA GPU, give each its share of the
    cores this process may use: torch's threads, and ``OMP_NUM_THREADS`` for the processes it
    starts (a stage's own process, a generator). Returns the share, or None where nothing changes:
    one process already computes on every core, and GPUs compute elsewhere. Without it a launcher
    decides (torchrun: one thread a process, which leaves the other cores of a large machine idle)."""
    if world.local_world <= 1 or has_gpu():
        return None
    threads = max(1, cores() // world.local_world)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    log.info("%d processes on this node: %d threads each", world.local_world, threads)
    return threads


def keep_freed_memory() -> bool:
    """On a machine without a CUDA GPU, have glibc's allocator serve large allocations from its
    heap and keep freed memory there, so that tensors allocated again and again reuse pages
    already mapped. Process-wide; says whether it took effect (not with a GPU, not on a C library
    other than glibc). The resident size stays near the run's peak instead of falling between
    steps."""
    global _kept
    if _kept:
        return True
    if has_gpu():
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    # No mmap for large blocks (they come from the heap and are reused), and no trimming of the heap's top.
    _kept = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, INT_MAX))
    if _kept:
        log.info("CPU run: the allocator keeps freed memory for reuse (no mmap per large tensor)")
    return _kept


def packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN packs and multiplies linear weights of `dtype` on this CPU (the kernels
    torch.compile uses). Asked of the library once per dtype, by packing and multiplying a small
    weight, and remembered; the answer is logged once. oneDNN packs float32 on every x86 and Arm
    CPU torch supports, bfloat16 only where the CPU computes it (AVX512-BF16, AMX, AVX-NE-CONVERT,
    or AVX-512 BW/VL/DQ): elsewhere the reorder refuses it."""
    return _packs(dtype)


@functools.cache
def _packs(dtype: torch.dtype) -> bool:
    name = str(dtype).removeprefix("torch.")
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        log.info("CPU products: this torch has no oneDNN packed linear kernels; %s layers use torch's own", name)
        return False
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8, dtype=dtype), 4)
        torch.ops.mkldnn._linear_pointwise(torch.ones(4, 8, dtype=dtype), weight, None, "none", [], "")
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[0]
        log.info("CPU products: oneDNN cannot pack %s weights on this CPU (%s); %s layers use torch's own", name, reason, name)
        return False
    log.info("CPU products: %s linear layers multiply by weights packed once by oneDNN while decoding", name)
    return True


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, rows: int, dtype: torch.dtype | None = None):
    """Inside, without autograd: `model`'s CPU linear layers multiply by copies of their weights
    packed once in oneDNN's blocked layout (in `dtype` if given, else their own; inputs are cast
    to it), for batches of about `rows` rows.

    ``torch.nn.functional.linear`` packs its weight again at every call, and in float32 it goes
    through MKL, which on AMD CPUs runs at well under half of what oneDNN computes: a decoding
    step's products of a few hundred rows by each weight ran 2-3x as fast packed in float32 and
    1.1-1.5x in bfloat16 (2 AVX-512 cores). Layers left as they are: subclasses of ``nn.Linear``
    (quantized or adapter layers; an adapter's plain base layer is packed), dtypes oneDNN cannot
    pack on this CPU (`packing_available`: bfloat16 without hardware support), other devices, and
    any call with autograd on. Costs a copy of the packed weights while inside: for frozen weights
    only (they are not re-packed when changed). Layers already packed by an enclosing call stay
    as that call packed them."""
    packed = []
    for module in model.modules():
        weight = module.weight if type(module) is torch.nn.Linear else None
        if weight is None or "forward" in vars(module) or weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
            continue
        if not packing_available(dtype or weight.dtype):
            continue
        w = weight.detach().to(dtype or weight.dtype)
        b = None if module.bias is None else module.bias.detach().to(w.dtype)
        module.forward = _packed_forward(module.forward, torch.ops.mkldnn._reorder_linear_weight(w, rows), b)
        packed.append(module)
    try:
        yield len(packed)
    finally:
        for module in packed:
            del module.forward


def _packed_forward(forward, weight: torch.Tensor, bias: torch.Tensor | None):
    def packed(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return forward(x)
        return torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), weight, bias, "none", [], "")

    return packed


def _logits(hidden, weight, bias, scale: float, softcap: float | None, inv_t: float):
    """float32 logits of a block of tokens after TRL's transforms, and tanh(y / softcap) for the gradient."""
    z = torch.nn.functional.linear(hidden, weight, bias).float()
    if scale != 1.0:
        z.mul_(scale)
    t = None
    if softcap is not None:
        t = torch.tanh(z / softcap)
        z = t * softcap
    return z.mul_(inv_t), t


class WholeVocabLogProbs(torch.autograd.Function):
    """`trl.kernels.ChunkedLogProbFunction`'s signature and outputs, computed a block of tokens
    at a time with one product over the whole vocabulary.

    Products run in the autocast dtype (else the inputs'), with float32 accumulation inside the
    matrix product and one rounding of each result; softmax statistics are float32. The backward
    recomputes each block's logits. Outputs: log-probabilities, and entropy, log(sum p^2), the mean
    logit and whether the target is the (first) argmax when `outputs` names them."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0, outputs=()):
        ctx.set_materialize_grads(False)
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden.dtype
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        args = (logit_scale, softcap, 1 / temperature)
        n = hidden.shape[0]
        names = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
        parts: dict[str, list] = {k: [] for k in (*names, "log_z")}
        for start in range(0, n, BLOCK_ROWS):  # forward runs without autograd
            z, _ = _logits(hidden[start : start + BLOCK_ROWS].to(dtype), w, b, *args)
            target = targets[start : start + BLOCK_ROWS].unsqueeze(-1)
            top = z.amax(-1, keepdim=True)
            if "is_top1" in outputs:
                parts["is_top1"].append(z.argmax(-1) == target[:, 0])
            if "mean_logits" in outputs:
                parts["mean_logits"].append(z.mean(-1))
            z.sub_(top)
            e = torch.exp(z)
            sum_e = e.sum(-1)
            log_sum = sum_e.log()
            parts["log_z"].append(top[:, 0] + log_sum)
            parts["log_probs"].append(z.gather(-1, target)[:, 0] - log_sum)
            if "log_sum_sq_probs" in outputs:
                parts["log_sum_sq_probs"].append(torch.linalg.vector_norm(e, dim=-1).square().log() - 2 * log_sum)
            if "entropy" in outputs:
                parts["entropy"].append(log_sum - e.mul_(z).sum(-1) / sum_e)
        wanted = {"log_probs", "log_z", *outputs}  # empty, not None, when no token is scored (TRL's too)
        empty = {k: hidden.new_empty(0, dtype=torch.bool if k == "is_top1" else torch.float32) for k in wanted}
        result = {k: torch.cat(v) if v else empty.get(k) for k, v in parts.items()}
        log_z, entropy = result["log_z"], result["entropy"]
        ctx.save_for_backward(hidden, w, b, targets, log_z, log_z if entropy is None else entropy)
        ctx.dtypes, ctx.args = (dtype, hidden.dtype, weight.dtype, None if bias is None else bias.dtype), args
        ctx.mark_non_differentiable(*(result[k] for k in ("log_sum_sq_probs", "mean_logits", "is_top1") if result[k] is not None))
        return tuple(result[k] for k in names)

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, *_):
        hidden, w, b, targets, log_z, entropy = ctx.saved_tensors
        dtype, hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        scale, softcap, inv_t = ctx.args
        grad_hidden = torch.empty(hidden.shape, dtype=dtype) if needs_hidden else None
        grad_weight = grad_bias = None
        for start in range(0, hidden.shape[0], BLOCK_ROWS):
            end = start + BLOCK_ROWS
            h = hidden[start:end].to(dtype)
            z, t = _logits(h, w, b, *ctx.args)
            log_p = z.sub_(log_z[start:end, None])
            p = torch.exp(log_p)
            if grad_log_probs is not None:  # d log p_target / dz_j = 1[j = target] - p_j
                g = grad_log_probs[start:end, None].float()
                grad = (p * -g).scatter_add_(-1, targets[start:end, None], g)
            else:
                grad = torch.zeros_like(p)
            if grad_entropy is not None:  # d entropy / dz_j = -p_j (log p_j + entropy)
                grad.sub_(p.mul_(log_p.add_(entropy[start:end, None])).mul_(grad_entropy[start:end, None].float()))
            grad.mul_(inv_t)
            if t is not None:
                grad.mul_(1 - t * t)
            if scale != 1.0:
                grad.mul_(scale)
            grad_z = grad.to(dtype)
            if grad_hidden is not None:
                torch.mm(grad_z, w, out=grad_hidden[start:end])
            if needs_weight:  # float32 sums over blocks of tokens
                part = grad_z.t() @ h
                grad_weight = part.float() if grad_weight is None else grad_weight.add_(part)
            if needs_bias:
                grad_bias = grad.sum(0) if grad_bias is None else grad_bias.add_(grad.sum(0))
        if needs_weight and grad_weight is None:  # no token scored: a zero gradient, as TRL's function gives
            grad_weight = torch.zeros(w.shape, dtype=weight_dtype)
        if needs_bias and grad_bias is None:
            grad_bias = torch.zeros(b.shape, dtype=bias_dtype)
        return (
            None if grad_hidden is None else grad_hidden.to(hidden_dtype),
            None if grad_weight is None else grad_weight.to(weight_dtype),
            None if grad_bias is None else grad_bias.to(bias_dtype),
            *([None] * 6),
        )
