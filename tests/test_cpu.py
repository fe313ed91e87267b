"""r1kit.cpu: the allocator setting, and TRL's fused LM head through whole-vocabulary products."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch

MALLINFO = """
import ctypes, torch
from r1kit import cpu

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

    from r1kit import cpu

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
    with cpu.log_probs_on_cpu():
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

    from r1kit import cpu

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
