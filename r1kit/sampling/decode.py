"""r1kit's decoding loop: n samples of each prompt from one prefill, for the transformers
sampling backend and for GRPO rollouts on a CPU.

    rows = decode(model, [[1, 2, 3], [4, 5]], counts=[4, 4], max_tokens=64,
                  draw=Nucleus(0.6, 0.95).draw, eos_ids={0}, pad_id=0)
    # -> 8 lists of new token ids, prompt 0's four samples first; each ends at its first eos id

What it does that ``model.generate`` does not, and why it is faster on a CPU (each measured on
SmolLM2-135M, see bench/sampling.py):
- each prompt is prefilled once, and its keys and values are kept once and read by all of its n
  samples (``generate`` prefills every copy: with R1's 8-16 samples a prompt, most of the
  prefill work, and each sample reads its own copy of the prompt at every step); the prefill
  computes logits at the last position only;
- each sample's own keys and values are written in place into buffers that grow by blocks of
  positions (``generate``'s cache concatenates every layer's keys and values at every step: a
  fresh allocation and a copy of the whole cache, which on a CPU cost more than the step's matmuls);
- one new token a row attends as batched matmuls per layer, each group of query heads against its
  own key-value head, all the samples of a prompt at once against the prompt's positions (SDPA's
  CPU kernels copy keys and values once per query head under grouped-query attention with a
  padding mask, and are slow with one query a row);
- on a CPU the linear layers multiply by weights packed once per call in oneDNN's layout
  (`r1kit.hardware.cpu.packed_linears`), in the autocast dtype inside an autocast region;
- for Llama-family models each step after the prefill is written out
  (r1kit.sampling.llama_step: the forward pass's logits, in far fewer operations);
- rows whose sample has ended leave the batch (once a quarter of it has ended);
- `Nucleus` draws temperature / top-p samples from the few most likely tokens instead of
  sorting the whole vocabulary at every step.

Otherwise the model's own forward pass does the work: any decoder-only transformers model whose
attention goes through transformers' attention interface and cache layers. The shared prompt
positions are read by `decode_attention` alone, which stands in for SDPA; with other attention
(eager, flash) and no written-out step, each row gets its own copy of its prompt's keys and values.
Greedy output equals ``model.generate``'s in float32 (a test checks it). Not here: beam search,
repetition penalties, top-k / min-p, stop strings, or multimodal inputs.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from r1kit.hardware import cpu
from r1kit.sampling.llama_step import LlamaStep

BLOCK = 16  # positions a row's buffers grow by: one copy of its own positions per BLOCK decoding steps


class PromptRows:
    """Which prompt each batch row samples (rows grouped by prompt, in prompt order), and the rows
    laid out prompt by prompt in `slots` [prompts, most rows of a prompt] (row index, or the
    batch size where a prompt has fewer rows), `flat` the place of each row in that layout."""

    def __init__(self, prompt: torch.Tensor, prompts: int):
        self.prompt = prompt
        counts = torch.bincount(prompt, minlength=prompts)
        self.width = int(counts.max())
        place = torch.arange(len(prompt), device=prompt.device) - (counts.cumsum(0) - counts)[prompt]
        self.flat = prompt * self.width + place
        self.slots = torch.full((prompts * self.width,), len(prompt), device=prompt.device)
        self.slots[self.flat] = torch.arange(len(prompt), device=prompt.device)
        self.slots = self.slots.view(prompts, self.width)


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values are views of zero-filled buffers with room ahead, so
    that each update writes the new positions in place. Keys are stored transposed
    ([B, H, D, capacity]): the views handed to attention are [B, H, L, D] as usual, and
    `decode_attention` reads the transposed buffer as a plain matrix.

    After `share`, the positions cached so far (the prompts') are a prefix kept once per prompt
    and read by all of its rows; the buffers hold each row's own positions after it. The key
    views handed to attention then carry the prefix as their attribute ``shared_prefix``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.prefix: tuple[torch.Tensor, torch.Tensor] | None = None  # [P, H, D, W] keys, [P, H, W, D] values
        self.rows: PromptRows | None = None

    def own_length(self) -> int:
        return 0 if self.buffers is None else self.values.shape[-2]

    def get_seq_length(self) -> int:
        return self.own_length() + (0 if self.prefix is None else self.prefix[1].shape[-2])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used = self.own_length()
        end = used + key_states.shape[-2]
        if self.buffers is None:
            batch, heads, _, dim = key_states.shape
            self.buffers = (key_states.new_zeros(batch, heads, dim, end + BLOCK), key_states.new_zeros(batch, heads, end + BLOCK, dim))
        elif end > self.buffers[1].shape[-2]:
            self.regrow(end + BLOCK)
        keys_t, values = self.buffers
        keys_t[..., used:end] = key_states.transpose(-1, -2)
        values[:, :, used:end] = value_states
        self.keys, self.values = keys_t[..., :end].transpose(-1, -2), values[:, :, :end]
        if self.prefix is not None:
            self.keys.shared_prefix = (*self.prefix, self.rows)
        return self.keys, self.values

    def regrow(self, capacity: int, keep: torch.Tensor | None = None) -> None:
        """New buffers of `capacity` positions holding the rows' own cached ones (of batch rows
        `keep` only, in that order, when given)."""
        used = self.own_length()
        keys_t, values = self.buffers
        if keep is not None:
            keys_t, values = keys_t[keep], values[keep]
        batch, heads, dim = values.shape[0], values.shape[1], values.shape[-1]
        self.buffers = (values.new_zeros(batch, heads, dim, capacity), values.new_zeros(batch, heads, capacity, dim))
        self.buffers[0][..., :used] = keys_t[..., :used]
        self.buffers[1][:, :, :used] = values[:, :, :used]
        self.keys, self.values = self.buffers[0][..., :used].transpose(-1, -2), self.buffers[1][:, :, :used]

    def share(self, rows: PromptRows, capacity: int, dtype: torch.dtype | None = None) -> None:
        """Make the cached positions (one batch row a prompt) the prefix of `rows`, with buffers
        of `capacity` positions for each row's own; all in `dtype` if given."""
        keys_t, values = self.buffers
        used = self.own_length()
        dtype = dtype or values.dtype
        self.prefix = (keys_t[..., :used].to(dtype).contiguous(), values[:, :, :used].to(dtype).contiguous())
        self.rows = rows
        batch, heads, dim = len(rows.prompt), values.shape[1], values.shape[-1]
        self.buffers = (values.new_zeros(batch, heads, dim, capacity, dtype=dtype), values.new_zeros(batch, heads, capacity, dim, dtype=dtype))
        self.keys, self.values = self.buffers[0][..., :0].transpose(-1, -2), self.buffers[1][:, :, :0]

    def select(self, keep: torch.Tensor, rows: PromptRows, prompts: torch.Tensor | None, headroom: int) -> None:
        """Keep batch rows `keep`, now `rows`, with room for `headroom` more positions of their
        own, and the prefixes of prompts `prompts` only (all when None)."""
        self.regrow(self.own_length() + headroom, keep)
        if prompts is not None and self.prefix is not None:
            self.prefix = (self.prefix[0][prompts], self.prefix[1][prompts])
        self.rows = rows


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for one new token a row (with the model's dropout on its weights, as in SDPA,
    when the model is training: GRPO rollouts); several a row (a prefill, a training step) go to SDPA.

    Keys and values that are views of a `GrowingLayer`'s buffers are read over the buffers' whole
    capacity, the positions past the cached ones masked out: a slice of a buffer is no plain
    matrix, and the matmuls would copy it at every step. With a shared prefix, each prompt's
    queries (all its rows') attend to its prefix in one product, and each row to its own
    positions; one softmax over both."""
    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    batch, heads, _, dim = query.shape
    groups, length = key.shape[1], key.shape[2]
    shared = getattr(key, "shared_prefix", None)
    keys_t = key.transpose(-1, -2)  # [B, KV heads, D, L]
    capacity = keys_t.stride(-2) if keys_t.stride(-1) == 1 and value.stride(-2) == dim else length
    if capacity > length:  # the zero-filled buffers behind the views
        keys_t = keys_t.as_strided((batch, groups, dim, capacity), keys_t.stride())
        value = value.as_strided((batch, groups, capacity, dim), value.stride())
    query = query.view(batch, groups, heads // groups, dim)
    scores = torch.matmul(query, keys_t)  # [B, KV heads, group, capacity]
    if shared is not None:  # [P, KV heads, D, W] keys and [P, KV heads, W, D] values, the rows' layout
        prefix_keys_t, prefix_values, rows = shared
        prompts, width = prefix_keys_t.shape[0], prefix_keys_t.shape[-1]
        by_prompt = _by_prompt(torch.cat([query, query.new_zeros(1, *query.shape[1:])])[rows.slots])
        prefix_scores = _by_row(torch.matmul(by_prompt, prefix_keys_t), rows)  # [B, KV heads, group, W]
        scores = torch.cat([prefix_scores, scores], dim=-1)
        length += width
    scores = scores * (dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:  # [B, 1, 1, L]: True where a row may attend, or additive
        if attention_mask.dtype == torch.bool:
            scores[..., :length].masked_fill_(~attention_mask, float("-inf"))
        else:
            scores[..., :length] += attention_mask
    scores[..., length:] = float("-inf")
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(value.dtype)
    if dropout:  # on the attention weights, as SDPA's (a model in training mode: GRPO rollouts)
        probs = torch.nn.functional.dropout(probs, dropout)
    if shared is None:
        out = torch.matmul(probs, value)
    else:
        placed = probs.new_zeros(prompts * rows.width, *probs.shape[1:-1], width)
        placed[rows.flat] = probs[..., :width]
        out = _by_row(torch.matmul(_by_prompt(placed.view(prompts, rows.width, *placed.shape[1:])), prefix_values), rows)
        out += torch.matmul(probs[..., width:], value)
    return out.view(batch, 1, heads, dim), None  # heads in repeat_kv's order


def _by_prompt(x: torch.Tensor) -> torch.Tensor:
    """[P, rows, KV heads, group, N] -> [P, KV heads, rows x group, N]: a prompt's rows as one matrix."""
    prompts, width, groups, group, n = x.shape
    return x.transpose(1, 2).reshape(prompts, groups, width * group, n)


def _by_row(x: torch.Tensor, rows: PromptRows) -> torch.Tensor:
    """[P, KV heads, rows x group, N] -> [B, KV heads, group, N], the batch's rows in order."""
    prompts, groups, _, n = x.shape
    return x.view(prompts, groups, rows.width, -1, n).transpose(1, 2).reshape(prompts * rows.width, groups, -1, n)[rows.flat]


@contextlib.contextmanager
def decoding_attention(model):
    """`decode_attention` in `model` while decoding, where it uses SDPA (as transformers' models do
    by default); eager or flash attention is left as it is. Yields whether the decoder's layers
    now attend with it. Registers it with transformers under ``r1kit_decode`` on first use (an
    added name; no other attention changes), not when this module is imported."""
    AttentionInterface.register("r1kit_decode", decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register("r1kit_decode", sdpa_mask)
    configs = [m.config for m in model.modules() if getattr(m, "config", None) is not None]
    configs = [c for c in {id(c): c for c in configs}.values() if c._attn_implementation == "sdpa"]
    for config in configs:
        config._attn_implementation = "r1kit_decode"
    try:
        yield model.config.get_text_config(decoder=True)._attn_implementation == "r1kit_decode"
    finally:
        for config in configs:
            config._attn_implementation = "sdpa"


def select_rows(cache: DynamicCache, rows: PromptRows, keep: torch.Tensor, headroom: int) -> PromptRows:
    """Keep the cache's batch rows `keep` (of prompts `rows.prompt[keep]`), with room for
    `headroom` more positions of their own; drop the prefixes no row reads any more. The rows kept."""
    prompt = rows.prompt[keep]
    live = torch.unique(prompt)  # sorted
    kept = PromptRows(torch.searchsorted(live, prompt), len(live))
    for layer in cache.layers:
        layer.select(keep, kept, live if len(live) < rows.slots.shape[0] else None, headroom)
    return kept


@torch.no_grad()
def decode(
    model,
    prompts: list[list[int]],
    counts: list[int],
    max_tokens: int,
    draw: Callable[[torch.Tensor], torch.Tensor],
    eos_ids: set[int],
    pad_id: int,
    stop: Callable[[int, list[int]], bool] | None = None,
    scores: tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], list[list[float]]] | None = None,
) -> list[list[int]]:
    """New token ids of `counts[i]` samples of each prompt `prompts[i]` (token ids), at most
    `max_tokens` each, ending with the first of `eos_ids` if one comes. `draw` maps the logits
    of a batch's last positions [B, V] to each row's next token [B]. `stop(sample, tokens)`,
    asked after each new token with the sample's index and its tokens so far, ends a sample
    where it says so (a tool call's closing fence, r1kit.sampling.tool_loop). With `scores`
    (`score`, `out`), `out` gets each sample's per-token ``score(logits, tokens)`` [B] beside its
    tokens (`Nucleus.log_prob`: the sampling log-probabilities)."""
    device = model.device
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    cache.layers = [GrowingLayer() for _ in range(model.config.get_text_config(decoder=True).num_hidden_layers)]
    autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    with decoding_attention(model) as ours, cpu.packed_linears(model, sum(counts), autocast):
        lean = LlamaStep.of(model, sum(counts), decode_attention, autocast)  # None: the model's forward pass decodes
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, logits_to_keep=1)
        # Each prompt's row once per sample: the prompt's cached positions shared, mask, positions and logits.
        rows = torch.repeat_interleave(torch.arange(len(prompts), device=device), torch.tensor(counts, device=device))
        shared = PromptRows(rows, len(prompts))
        for layer in cache.layers:
            if lean or ours:  # decode_attention reads a prompt's positions once for all its rows
                layer.share(shared, min(BLOCK, max_tokens), autocast if lean else None)
            else:  # the model's own attention (eager, flash) reads a copy of them in each row
                layer.regrow(layer.own_length() + BLOCK, keep=rows)
        logits, positions = out.logits[rows, -1], positions[rows, -1:]
        mask = torch.cat([mask[rows], mask.new_ones(len(rows), max_tokens)], dim=1)  # a slice of it per step
        eos = torch.tensor(sorted(eos_ids), device=device)

        live = torch.arange(len(rows), device=device)  # the sample of each batch row
        ended = torch.zeros(len(rows), dtype=torch.bool, device=device)
        samples: list[list[int]] = [[] for _ in range(len(rows))]
        score, scored = scores if scores is not None else (None, None)
        if scored is not None:
            scored[:] = [[] for _ in range(len(rows))]
        for step in range(max_tokens):
            tokens = draw(logits)
            values = score(logits, tokens).tolist() if score is not None else [None] * len(tokens)
            for sample, token, done, value in zip(live.tolist(), tokens.tolist(), ended.tolist(), values):
                if not done:
                    samples[sample].append(token)
                    if scored is not None:
                        scored[sample].append(value)
            ended |= torch.isin(tokens, eos)
            if stop is not None:
                ended |= torch.tensor([stop(i, samples[i]) for i in live.tolist()], device=device)
            finished = int(ended.sum())
            if step == max_tokens - 1 or finished == len(live):
                break
            if finished * 4 >= len(live):  # drop the ended rows: a copy of the cache, so not at every end
                keep = (~ended).nonzero().squeeze(1)
                live, tokens, mask, positions, ended = live[keep], tokens[keep], mask[keep], positions[keep], ended[keep]
                shared = select_rows(cache, shared, keep, BLOCK)
            positions = positions + 1
            attend = mask[:, : width + step + 1]
            if lean is not None:
                logits = lean(tokens, positions, attend, cache)
            else:
                logits = model(input_ids=tokens[:, None], attention_mask=attend, position_ids=positions, past_key_values=cache).logits[:, -1]
    return samples


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
