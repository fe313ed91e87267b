"""How r1kit's decoding loop (r1kit.sampling.decode) picks each row's next token from its logits:
`greedy`, and `Nucleus` for temperature and top-p sampling, which draws through `categorical`.
Not here: the loop itself, or sampling settings beyond temperature and top-p.
"""

from __future__ import annotations

import torch


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


class Nucleus:
    """Temperature and top-p (nucleus) sampling: `draw` picks each row's next token.

    The distribution is that of transformers' temperature and top-p warpers followed by
    multinomial sampling: the smallest set of most likely tokens whose probability reaches
    `top_p`, renormalised (no top-k, as in vLLM). transformers sorts the whole vocabulary and
    draws from all of it at every step, which on a CPU costs more than the model's own matmuls
    for a 135M-parameter model; here the k most likely tokens hold the nucleus as soon as their
    probability reaches `top_p` (k starts at 64 and doubles until it does, up to a sixteenth of
    the vocabulary, past which it is ranked whole, as a vocabulary of up to 4,096 tokens always
    is), and only they are drawn from; with top_p 1 each row is drawn from the whole vocabulary
    by `categorical`. The same up to rounding at the nucleus's edge and the order of tied tokens.
    Draws come from torch's global generator. Other sampling settings of the
    model's generation_config.json (min_p, typical_p, ...) are not applied, as in vLLM.
    """

    WHOLE = 4096  # a vocabulary up to this size is ranked whole: cheaper than a second topk

    def log_prob(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Each row's log-probability of `tokens` under the temperature-scaled distribution over the
        whole vocabulary, as TRL's trainer scores a completion (top-p is not applied, as there)."""
        return torch.log_softmax(logits.float() / self.temperature, dim=-1).gather(-1, tokens[:, None]).squeeze(1)

    def __init__(self, temperature: float, top_p: float, k: int = 64):
        if not temperature > 0 or not 0 < top_p <= 1:
            raise ValueError(f"sampling needs temperature > 0 and 0 < top_p <= 1; got {temperature}, {top_p}")
        self.temperature, self.top_p, self.k = temperature, top_p, k

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float() / self.temperature
        vocab = logits.size(-1)
        if self.top_p >= 1.0:
            return categorical(logits)
        log_total = logits.logsumexp(dim=-1, keepdim=True)
        k = self.k if vocab > self.WHOLE else vocab
        while True:
            top, index = logits.topk(k, dim=-1)  # sorted, most likely first
            probs = (top - log_total).exp()
            mass = probs.cumsum(dim=-1)
            if k == vocab or bool((mass[:, -1] >= self.top_p).all()):
                break
            k = 2 * k if 2 * k <= vocab // 16 else vocab
        keep = (mass - probs) < self.top_p  # the tokens before this one fall short of top_p
        return index.gather(-1, torch.multinomial(probs * keep, 1)).squeeze(1)


def categorical(logits: torch.Tensor, block: int = 256) -> torch.Tensor:
    """One token per row, drawn from softmax(`logits`) by inverting its cumulative distribution.

    torch.multinomial draws an exponential variate per vocabulary entry (or, with replacement,
    accumulates each row in float64): 19 ms for 16 rows of SmolLM2's 49,152 logits on 2 cores, a
    fifth of a decoding step. Here a row takes one uniform variate: it picks a block of `block`
    tokens by a float64 running sum of the blocks' masses, then a token by a float32 running sum
    inside the block, so no rounding grows with the vocabulary."""
    rows, vocab = logits.shape
    weights = (logits - logits.amax(-1, keepdim=True)).exp_()
    if vocab % block:
        weights = torch.nn.functional.pad(weights, (0, block - vocab % block))
    weights = weights.view(rows, -1, block)
    masses = weights.sum(-1).double()
    ends = masses.cumsum(-1)
    target = _below(torch.rand(rows, 1, dtype=torch.float64, device=logits.device) * ends[:, -1:], ends[:, -1:])
    which = torch.searchsorted(ends, target, right=True)  # the first block whose running sum passes the target
    share = ((target - (ends.gather(1, which) - masses.gather(1, which))) / masses.gather(1, which)).clamp_(min=0.0)
    inside = weights[torch.arange(rows, device=logits.device), which[:, 0]].cumsum(-1)
    token = torch.searchsorted(inside, _below(share.float() * inside[:, -1:], inside[:, -1:]), right=True)
    return (which * block + token).squeeze(1)


def _below(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """`x` held under `total`, which rounding can bring it to: a search for the first running
    sum past it then lands on a token (or block) of positive weight, never past the last one."""
    return torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))
