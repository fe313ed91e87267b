"""r1kit.hardware.cpu and the patches that use it (r1kit.trainers.trl_patches): the allocator
setting, TRL's fused LM head through whole-vocabulary products, packed linear layers for decoding,
and short attention of the trained models in SDPA's math kernel."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys

from unittest import mock

import pytest
import torch

from r1kit.hardware import cpu
from r1kit.trainers import trl_patches

MALLINFO = """
import ctypes, torch
from r1kit.hardware import cpu

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
def allocate():
    x = torch.ones(16 << 20)  # 64 MiB
    mapped = libc.mallinfo2().hblkhd
    del x
    return mapped >= 64 << 20, libc.mallinfo2().fordblks >= 64 << 20
print(allocate(), cpu.keep_freed_memory(), allocate())
"""


def test_keep_freed_memory_serves_large_tensors_from_a_heap_that_keeps_them():
    """By default glibc maps a 64 MiB tensor on its own and unmaps it when freed; after
    keep_freed_memory it comes from the heap, and the heap keeps it when it is freed."""
    import ctypes

    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc 2.33 or later")
    out = subprocess.run([sys.executable, "-c", MALLINFO], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["(True,", "False)", "True", "(False,", "True)"], out


def test_fused_head_on_cpu_scores_completion_positions_alone_with_the_same_log_probs(tiny_model, monkeypatch):
    """On a CPU TRL's fused LM head projects every position, prompt included; inside r1kit's
    context only the completion's, through r1kit's whole-vocabulary products, with the same
    log-probabilities, entropies and gradients."""
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    projected = []
    for cls in (trl_utils._ChunkedLogProbFunction, cpu.WholeVocabLogProbs):
        monkeypatch.setattr(cls, "apply", functools.partial(lambda apply, cls, hidden, *a: projected.append((cls, hidden.shape[0])) or apply(hidden, *a), cls.apply, cls))
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 20))
    labels = ids.clone()
    labels[:, :12] = -100  # the prompt
    labels[2, 17:] = -100  # a completion that ended early

    def score():
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}

    full, full_grads = score()
    with trl_patches.log_probs_on_cpu():
        compact, compact_grads = score()
    # every position through TRL's tiles, then the labelled ones through r1kit's function
    assert projected == [(trl_utils._ChunkedLogProbFunction, 3 * 19), (cpu.WholeVocabLogProbs, int((labels[:, 1:] != -100).sum()))]
    torch.testing.assert_close(compact.log_probs, full.log_probs)
    torch.testing.assert_close(compact.entropy[compact.label_mask], full.entropy[full.label_mask])
    for name, grad in full_grads.items():
        torch.testing.assert_close(compact_grads[name], grad, msg=name)


@pytest.mark.parametrize("autocast", [False, True])
def test_whole_vocabulary_log_probs_match_trls_tiles(monkeypatch, autocast):
    """r1kit's CPU log-probabilities against TRL's tiled function, every optional output, a bias,
    logit scale, soft-capping and temperature, over several blocks of tokens: equal in float32,
    within bfloat16 rounding under autocast, gradients included."""
    from trl.kernels import ChunkedLogProbFunction

    monkeypatch.setattr(cpu, "BLOCK_ROWS", 8)
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(29, 16), torch.randn(300, 16) / 2, torch.randn(300)
    targets = torch.randint(0, 300, (29,))
    weights = torch.rand(29), torch.rand(29)  # of the log-probabilities and entropies in the loss
    outputs = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = fn.apply(*leaves, targets, 0.7, 64, 30.0, 0.5, outputs)
        (out[0] * weights[0] + out[1] * weights[1]).sum().backward()
        return out, [t.grad for t in leaves]

    (ours, our_grads), (trls, trl_grads) = run(cpu.WholeVocabLogProbs), run(ChunkedLogProbFunction)
    tol = dict(atol=5e-2, rtol=5e-2) if autocast else {}
    for a, b in zip(ours[:4], trls[:4]):
        torch.testing.assert_close(a, b, **tol)
    if not autocast:  # bfloat16 ties may flip the top token
        assert torch.equal(ours[4], trls[4])
    for a, b in zip(our_grads, trl_grads):
        torch.testing.assert_close(a, b, **tol)


def test_whole_vocabulary_log_probs_of_no_tokens_are_empty_with_zero_gradients_as_trls():
    """A micro-batch with no scored token (``mask_truncated_completions`` and every completion cut
    off): empty outputs, not None, and zero gradients, as TRL's function gives."""
    from trl.kernels import ChunkedLogProbFunction

    outputs = ("log_probs", "entropy", "mean_logits", "is_top1")

    def run(fn):
        leaves = [torch.randn(0, 16, requires_grad=True), torch.randn(300, 16, requires_grad=True), torch.randn(300, requires_grad=True)]
        out = fn.apply(*leaves, torch.zeros(0, dtype=torch.long), 0.7, 64, None, 1.0, outputs)
        (out[0].sum() + out[1].sum()).backward()
        return out, [t.grad for t in leaves]

    (ours, our_grads), (trls, trl_grads) = run(cpu.WholeVocabLogProbs), run(ChunkedLogProbFunction)
    assert [None if t is None else (t.shape, t.dtype) for t in ours] == [None if t is None else (t.shape, t.dtype) for t in trls]
    assert ours[2] is None and ours[0].shape == (0,)
    for a, b in zip(our_grads, trl_grads):
        torch.testing.assert_close(a, b)


def test_grpo_loss_with_every_completion_masked_is_zero_on_cpu(grpo_trainer):
    """TRL's loss through r1kit's CPU head when ``mask_truncated_completions`` masks every
    completion of the batch: zero, and its backward runs (it used to fail on a None)."""
    trainer = grpo_trainer(4, 2, 6, beta=0.0, mask_truncated_completions=True)
    ids = torch.randint(5, 100, (4, 11))
    mask = torch.ones_like(ids)
    mask[:, 5:] = 0  # TRL zeroes the completion mask of a truncated completion
    with trl_patches.log_probs_on_cpu():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 6, compute_entropy=True)
    assert logps.shape == entropies.shape == (4, 6) and not logps.any()
    logps.sum().backward()
    assert all(not p.grad.any() for p in trainer.model.parameters() if p.grad is not None)


class Scaled(torch.nn.Linear):
    """A subclass of nn.Linear (as quantized and adapter layers are): left as it is."""

    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("probe", ["this CPU", "forced off"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_packed_linears_compute_the_same_products_and_restore_the_layers(dtype, probe, monkeypatch):
    """Where oneDNN packs the dtype on this CPU, the plain layers multiply by packed weights;
    where it cannot (bfloat16 without hardware support, or the probe forced off, as on such a
    CPU), every layer keeps torch's own product and the outputs are the same bit for bit."""
    if probe == "forced off":
        monkeypatch.setattr(cpu, "packing_available", lambda dtype=torch.float32: False)
    packs = cpu.packing_available(dtype or torch.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 32, bias=False), Scaled(32, 8))
    x = torch.randn(5, 3, 64)
    region = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()  # as GRPO rollouts pack
    with torch.no_grad(), region:
        expected = model(x)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    with cpu.packed_linears(model, rows=15, dtype=dtype) as packed, torch.no_grad(), region:
        assert packed == (2 if packs else 0)  # the subclass is never packed
        with mock.patch.object(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a) or real(*a)):
            got = model(x)
        with torch.enable_grad():  # with autograd on, the layers' own products
            trained = model(x)
    assert len(calls) == (2 if packs else 0) and got.dtype == expected.dtype
    if packs:
        tol = {} if dtype is None else {"atol": 2e-2, "rtol": 2e-2}
        torch.testing.assert_close(got, expected, **tol)
    else:
        assert torch.equal(got, expected)
    assert trained.requires_grad
    assert all("forward" not in vars(m) for m in model)  # restored
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


def test_packing_probe_asks_onednn_once_and_says_why_it_cannot(monkeypatch, caplog):
    """The probe packs and multiplies a small weight: where oneDNN refuses the dtype (its error on
    a CPU without bfloat16 support), the answer is no, with oneDNN's reason in one log line."""
    import logging

    def refuse(weight, rows):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq")

    probe = cpu._packs.__wrapped__  # uncached: the process's own answer stays as it is
    with caplog.at_level(logging.INFO, logger="r1kit.hardware.cpu"):
        monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
        assert probe(torch.bfloat16) is False
        assert "oneDNN cannot pack bfloat16 weights on this CPU (mkldnn_reorder_linear_weight: bf16 path needs" in caplog.text
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
        assert probe(torch.float32) is False
        assert "no oneDNN packed linear kernels" in caplog.text
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    monkeypatch.setattr(cpu, "_packs", lambda dtype: False)
    with cpu.packed_linears(model, rows=4) as packed:
        assert packed == 0 and "forward" not in vars(model[0])


def test_short_attention_of_the_given_models_runs_in_math_kernel_and_the_rest_in_sdpas_choice(monkeypatch):
    """Inside the context, transformers' SDPA entry point computes attention over at most
    MATH_ATTENTION_UP_TO positions with torch's math kernel alone (same values) in the layers of the
    models it was given; longer attention, and every layer of another model (a reward model, a
    judge), keep SDPA's own choice of kernels."""
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def layer():
        module = torch.nn.Module()
        module.num_key_value_groups, module.is_causal = 3, True
        return module

    policy, other = torch.nn.Sequential(layer()), torch.nn.Sequential(layer())
    backends = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        backends.append(set(_cur_sdpa_kernel_backends()))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    everything = set(_cur_sdpa_kernel_backends())
    assert everything > {SDPBackend.MATH}
    for length in (cpu.MATH_ATTENTION_UP_TO, cpu.MATH_ATTENTION_UP_TO + 1):
        q, k, v = torch.randn(2, 6, length, 16), torch.randn(2, 2, length, 16), torch.randn(2, 2, length, 16)
        before, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](policy[0], q, k, v, None)
        with trl_patches.short_attention_in_math(policy, None):
            inside = ALL_ATTENTION_FUNCTIONS["sdpa"](policy[0], q, k, v, None)[0]
            ALL_ATTENTION_FUNCTIONS["sdpa"](other[0], q, k, v, None)
        torch.testing.assert_close(inside, before)
    # per length: before, the policy's layer inside, the other model's layer inside
    assert backends == [everything, {SDPBackend.MATH}, everything, everything, everything, everything]
    assert set(_cur_sdpa_kernel_backends()) == everything


@pytest.mark.skipif(not cpu.packing_available(), reason="torch without oneDNN's packed linear kernels")
def test_packed_linears_nest_without_packing_again():
    """A call inside another (the sampler packs once, each decoding call again) leaves the layers
    as the outer call packed them, and they stay packed until the outer call ends."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with cpu.packed_linears(model, rows=4) as outer:
        forward = model[0].forward
        with cpu.packed_linears(model, rows=4, dtype=torch.bfloat16) as inner:
            assert (outer, inner) == (1, 0) and model[0].forward is forward
        assert model[0].forward is forward
    assert "forward" not in vars(model[0])


def test_launched_processes_of_a_node_divide_its_cores():
    """Under --accelerate-config each process kept the launcher's thread count (torchrun: one), so
    on a machine of many cores two processes left most of them idle. Checked in a fresh process
    started as torchrun starts one (OMP_NUM_THREADS=1): a process that has run other tests may
    hold its thread count where torch cannot change it."""
    code = """
import torch
from r1kit.hardware import World, cpu
cpu.has_gpu = lambda: False
cpu.os.sched_getaffinity = lambda pid: set(range(16))
assert cpu.share_cores(World(rank=1, world=4, local_rank=1, local_world=2)) == 8
assert torch.get_num_threads() == 8 and cpu.os.environ["OMP_NUM_THREADS"] == "8"  # the stage processes it starts too
assert cpu.share_cores(World()) is None  # one process: every core, as torch takes them
assert cpu.share_cores(World(world=2, local_world=40)) == 1
"""
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
