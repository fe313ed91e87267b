"""The module-level functions of TRL and transformers that r1kit replaces while a trainer trains,
one context manager per target, each undone on the way out. Written against TRL 1.16 and
transformers 5.19; `TARGETS` holds the parameters of each target that r1kit relies on, and
r1kit.trainers.trl_overrides.check refuses to start a stage where the installed libraries differ
(transformers from 5.17 on: tests/test_trl_overrides.py checks 5.17's wheel).

- `log_probs_on_cpu()`: TRL's fused LM head (``trl.trainer.utils``: ``_use_triton`` and
  ``_ChunkedLogProbFunction``) scores completion positions only, through
  r1kit.hardware.cpu.WholeVocabLogProbs, on CPU tensors; other devices keep TRL's kernels.
- `short_attention_in_math(*models)`: transformers' SDPA attention of the given models' layers
  runs torch's math kernel on CPU tensors of at most r1kit.hardware.cpu.MATH_ATTENTION_UP_TO key
  positions (its backward is faster there); other models in the process (a reward model, a
  judge) and other devices keep SDPA's choice.

`taken(device)` says which act while training on a device, for the stage's record.

Not here: the trainer methods r1kit overrides (r1kit.trainers.trl_overrides), the kernels themselves
(r1kit.hardware.cpu).
"""

from __future__ import annotations

import contextlib

# "module.name": the target's parameters as written against (r1kit.trainers.trl_overrides.params);
# ``...`` stands for any parameters r1kit does not rely on. SDPA's are passed through by keyword
# whatever they are (5.19 added ``cache``), so only its leading ones and ``**kwargs`` count.
TARGETS = {
    "trl.trainer.utils._use_triton": "device",
    "trl.trainer.utils._ChunkedLogProbFunction.forward": "ctx, hidden, weight, bias, targets, temperature, chunk_size, "
    "final_logit_softcapping=None, logit_scale=1.0, outputs=('entropy', 'log_sum_sq_probs', 'mean_logits', 'is_top1')",
    "transformers.integrations.sdpa_attention.sdpa_attention_forward": "module, query, key, value, attention_mask, ..., **kwargs",
}


def taken(device) -> dict[str, str]:
    """Which of these patches act while training on `device` ("on", or "off:" and why), for the
    stage's record beside its trainer's paths."""
    on = "on" if device.type == "cpu" else "off: not on a CPU"
    return {"whole_vocab_log_probs": on, "short_attention_in_math": on}


@contextlib.contextmanager
def log_probs_on_cpu():
    """Inside: TRL's fused LM head scores completion positions only, with
    r1kit.hardware.cpu.WholeVocabLogProbs, on CPU tensors (other devices keep TRL's kernels). Same
    outputs and gradients as TRL's own CPU path up to rounding (a test compares them)."""
    from unittest import mock

    import trl.trainer.utils as trl_utils

    from r1kit.hardware.cpu import WholeVocabLogProbs

    use_triton, chunked = trl_utils._use_triton, trl_utils._ChunkedLogProbFunction

    class Dispatch:
        @staticmethod
        def apply(hidden, *args):
            return (WholeVocabLogProbs if hidden.device.type == "cpu" else chunked).apply(hidden, *args)

    with (
        mock.patch.object(trl_utils, "_use_triton", lambda device: device.type == "cpu" or use_triton(device)),
        mock.patch.object(trl_utils, "_ChunkedLogProbFunction", Dispatch),
    ):
        yield


@contextlib.contextmanager
def short_attention_in_math(*models):
    """Inside: transformers' SDPA attention in the layers of `models` (None entries skipped), on CPU
    tensors of at most r1kit.hardware.cpu.MATH_ATTENTION_UP_TO key positions, runs torch's math
    kernel (explicit products and softmax) instead of its flash kernel. Same attention up to
    rounding; every other model and device keeps SDPA's choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from r1kit.hardware.cpu import MATH_ATTENTION_UP_TO

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    layers = {id(m) for model in models if model is not None for m in model.modules()}

    def attention(module, query, key, value, attention_mask, **kwargs):
        if id(module) in layers and query.device.type == "cpu" and key.shape[-2] <= MATH_ATTENTION_UP_TO:
            with sdpa_kernel([SDPBackend.MATH]):
                return sdpa(module, query, key, value, attention_mask, **kwargs)
        return sdpa(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("sdpa", attention)
    try:
        yield
    finally:
        AttentionInterface.register("sdpa", sdpa)
