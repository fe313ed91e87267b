"""r1kit's decoding loop: n samples of each prompt from one prefill, for the transformers
sampling backend and for GRPO rollouts on a CPU.

    rows = decode(model, [[1, 2, 3], [4, 5]], counts=[4, 4], max_tokens=64,
                  draw=Nucleus(0.6, 0.95).draw, eos_ids={0}, pad_id=0)   # r1kit.sampling.draws
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
- rollouts of several turns (`Decoder`, `Step.session`: r1kit.sampling.tool_loop) keep their keys
  and values from one turn to the next, so that a turn prefills only what a tool or an
  environment appended, not the whole rollout again;
- r1kit.sampling.draws.Nucleus draws temperature / top-p samples from the few most likely
  tokens instead of sorting the whole vocabulary at every step.

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
    """Which prompt each batch row samples, and the rows laid out prompt by prompt in `slots`
    [prompts, most rows of a prompt] (row index, or the batch size where a prompt has fewer rows),
    `flat` the place of each row in that layout."""

    def __init__(self, prompt: torch.Tensor, prompts: int):
        self.prompt = prompt
        counts = torch.bincount(prompt, minlength=prompts)
        self.width = int(counts.max())
        order = torch.argsort(prompt, stable=True)  # each row's rank among its prompt's rows
        place = torch.empty_like(prompt)
        place[order] = torch.arange(len(prompt), device=prompt.device) - (counts.cumsum(0) - counts)[prompt[order]]
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
    """Attention for one new token a row, or several after a shared prefix (a turn's appended
    tokens, `Decoder.extend`), with the model's dropout on its weights, as in SDPA, when the model
    is training (GRPO rollouts); several a row without a shared prefix (a prefill, a training step)
    go to SDPA.

    Keys and values that are views of a `GrowingLayer`'s buffers are read over the buffers' whole
    capacity, the positions past the cached ones masked out: a slice of a buffer is no plain
    matrix, and the matmuls would copy it at every step. With a shared prefix, each prompt's
    queries (all its rows') attend to its prefix in one product, and each row to its own
    positions; one softmax over both."""
    shared = getattr(key, "shared_prefix", None)
    batch, heads, new, dim = query.shape
    if new != 1 and shared is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    groups, length = key.shape[1], key.shape[2]
    keys_t = key.transpose(-1, -2)  # [B, KV heads, D, L]
    capacity = keys_t.stride(-2) if keys_t.stride(-1) == 1 and value.stride(-2) == dim else length
    if capacity > length:  # the zero-filled buffers behind the views
        keys_t = keys_t.as_strided((batch, groups, dim, capacity), keys_t.stride())
        value = value.as_strided((batch, groups, capacity, dim), value.stride())
    group = heads // groups * new  # a KV head's query rows: its query heads' (x the new tokens)
    query = query.reshape(batch, groups, group, dim)
    scores = torch.matmul(query, keys_t)  # [B, KV heads, group, capacity]
    if shared is not None:  # [P, KV heads, D, W] keys and [P, KV heads, W, D] values, the rows' layout
        prefix_keys_t, prefix_values, rows = shared
        prompts, width = prefix_keys_t.shape[0], prefix_keys_t.shape[-1]
        by_prompt = _by_prompt(torch.cat([query, query.new_zeros(1, *query.shape[1:])])[rows.slots])
        prefix_scores = _by_row(torch.matmul(by_prompt, prefix_keys_t), rows)  # [B, KV heads, group, W]
        scores = torch.cat([prefix_scores, scores], dim=-1)
        length += width
    scores = scores * (dim**-0.5 if scaling is None else scaling)
    if attention_mask is None and new > 1:  # causal: each new token sees the cache and the new tokens up to itself
        attention_mask = torch.ones(new, length, dtype=torch.bool, device=query.device).tril(length - new)
    if attention_mask is not None:  # [B, 1, new, L]: True where a row may attend, or additive
        held = scores.view(batch, groups, -1, new, scores.shape[-1])[..., :length]
        attention_mask = attention_mask.reshape(-1, 1, 1, new, length)
        if attention_mask.dtype == torch.bool:
            held.masked_fill_(~attention_mask, float("-inf"))
        else:
            held += attention_mask
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
    if new == 1:
        return out.view(batch, 1, heads, dim), None  # heads in repeat_kv's order
    return out.view(batch, groups, heads // groups, new, dim).permute(0, 3, 1, 2, 4).reshape(batch, new, heads, dim), None


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
    decoder = Decoder(model, draw, eos_ids, pad_id, keep=False)
    with decoder.engine(sum(counts)):
        decoder.start(prompts, counts, room=max_tokens)
        return decoder.generate(max_tokens, stop, scores)


class Decoder:
    """r1kit's decoding loop as samples that go on across calls (r1kit.sampling.tool_loop's turns):
    `start` prefills the prompts, `generate` draws each live sample's tokens until it ends,
    `extend` keeps the samples it names and appends tokens to each (what a tool or an environment
    wrote), prefilling only those: everything before stays cached, each prompt's positions once.

        decoder = Decoder(model, Nucleus(1.0, 1.0).draw, eos_ids={0}, pad_id=0)
        decoder.start([[1, 2, 3]], [4])
        turn = decoder.generate(32)              # 4 lists of new tokens
        decoder.extend([0, 2], [[7, 8], [9]])    # samples 0 and 2 go on after these tokens
        turn = decoder.generate(32)              # 2 lists: samples 0 and 2, in that order

    Samples that end early in a `generate` leave the batch as in `decode`, their keys and values
    kept aside (with `keep`; `decode` drops them); `extend` lays the kept samples' positions side
    by side again, leaving out those of tokens drawn after a sample ended. A sample's last token
    is cached by `extend`, with the appended ones. The cached positions of the samples go on
    with the appended tokens in one forward pass of the model: with r1kit's decoding attention,
    each prompt's positions read once by all of its samples; with the model's own (eager,
    flash), copies of them in each row. Greedy samples are those of prefilling each whole
    sequence again, up to rounding (a test compares both)."""

    def __init__(self, model, draw: Callable[[torch.Tensor], torch.Tensor], eos_ids: set[int], pad_id: int, keep: bool = True,
                 region: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.model, self.draw, self.pad_id, self.keep, self.region = model, draw, pad_id, keep, region
        self.eos = torch.tensor(sorted(eos_ids))
        self.active: tuple | None = None
        self.lean: LlamaStep | bool | None = None  # the written-out step; False: none for this model

    @contextlib.contextmanager
    def engine(self, rows: int, steps: bool = True):
        """Inside: `region`, r1kit's decoding attention and packed weights for about `rows` rows
        (the calls inside share them; a call outside enters its own); with `steps`, the
        written-out step where it applies (not needed to prefill)."""
        if self.active is not None:
            yield self.active
            return
        with self.region() as model:
            self.model = model = model if model is not None else self.model
            self.eos = self.eos.to(model.device)
            autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
            with decoding_attention(model) as ours, cpu.packed_linears(model, rows, autocast):
                # the written-out step, unless kept samples must go on through the model's own attention;
                # built once (its joined weights packed once): the weights do not change while sampling
                if steps and (ours or not self.keep) and self.lean is None:
                    self.lean = LlamaStep.of(model, rows, decode_attention, autocast) or False
                lean = (self.lean or None) if steps and (ours or not self.keep) else None
                self.active = (ours, lean, autocast)
                try:
                    yield self.active
                finally:
                    self.active = None

    @torch.no_grad()
    def start(self, prompts: list[list[int]], counts: list[int], room: int = BLOCK) -> None:
        """Prefill `prompts` (token ids) for `counts[i]` samples of each (room for `room` tokens a sample ahead)."""
        with self.engine(sum(counts)) as (ours, lean, autocast):
            model, pad_id = self.model, self.pad_id
            device = model.device
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            self.cache = cache = DynamicCache()
            cache.layers = [GrowingLayer() for _ in range(model.config.get_text_config(decoder=True).num_hidden_layers)]
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, logits_to_keep=1)
            # Each prompt's row once per sample: the prompt's cached positions shared, mask, positions and logits.
            rows = torch.repeat_interleave(torch.arange(len(prompts), device=device), torch.tensor(counts, device=device))
            self.rows = PromptRows(rows, len(prompts))
            self.shares = bool(lean or ours)
            for layer in cache.layers:
                if self.shares:  # decode_attention reads a prompt's positions once for all its rows
                    layer.share(self.rows, min(BLOCK, room), autocast if lean else None)
                else:  # the model's own attention (eager, flash) reads a copy of them in each row
                    layer.regrow(layer.own_length() + BLOCK, keep=rows)
        self.logits, self.positions, self.mask = out.logits[rows, -1], positions[rows, -1:], mask[rows]
        self.width = width if self.shares else 0  # cached positions kept once per prompt

    @torch.no_grad()
    def generate(
        self,
        max_tokens: int,
        stop: Callable[[int, list[int]], bool] | None = None,
        scores: tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], list[list[float]]] | None = None,
    ) -> list[list[int]]:
        """Each live sample's new tokens, as `decode` draws them (its `stop` and `scores` too)."""
        cache, shared, logits, positions = self.cache, self.rows, self.logits, self.positions
        device, batch = positions.device, len(positions)
        base = self.mask.shape[1]  # positions cached before this call
        mask = torch.cat([self.mask, self.mask.new_ones(batch, max_tokens)], dim=1)  # a slice of it per step
        # what extend needs: each sample's prompt, the prefixes, and where its positions are
        self.before = (self.mask, positions[:, 0].clone(), shared.prompt, [layer.prefix for layer in cache.layers])
        self.parked: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        with self.engine(batch) as (_, lean, _):
            model = self.model
            live = torch.arange(batch, device=device)  # the sample of each batch row
            ended = torch.zeros(batch, dtype=torch.bool, device=device)
            samples: list[list[int]] = [[] for _ in range(batch)]
            score, scored = scores if scores is not None else (None, None)
            if scored is not None:
                scored[:] = [[] for _ in range(batch)]
            for step in range(max_tokens):
                tokens = self.draw(logits)
                values = score(logits, tokens).tolist() if score is not None else [None] * len(tokens)
                for sample, token, done, value in zip(live.tolist(), tokens.tolist(), ended.tolist(), values):
                    if not done:
                        samples[sample].append(token)
                        if scored is not None:
                            scored[sample].append(value)
                ended |= torch.isin(tokens, self.eos)
                if stop is not None:
                    ended |= torch.tensor([stop(i, samples[i]) for i in live.tolist()], device=device)
                finished = int(ended.sum())
                if step == max_tokens - 1 or finished == len(live):
                    break
                if finished * 4 >= len(live):  # drop the ended rows: a copy of the cache, so not at every end
                    if self.keep:
                        self._park(live, ended.nonzero().squeeze(1))
                    keep = (~ended).nonzero().squeeze(1)
                    live, tokens, mask, positions, ended = live[keep], tokens[keep], mask[keep], positions[keep], ended[keep]
                    shared = select_rows(cache, shared, keep, BLOCK)
                positions = positions + 1
                attend = mask[:, : base + step + 1]
                if lean is not None:
                    logits = lean(tokens, positions, attend, cache)
                else:
                    logits = model(input_ids=tokens[:, None], attention_mask=attend, position_ids=positions, past_key_values=cache).logits[:, -1]
        if self.keep:
            self._park(live, None)
        self.samples = samples
        return samples

    def _park(self, live: torch.Tensor, rows: torch.Tensor | None) -> None:
        """Keep aside the cached positions of batch rows `rows` (all when None), samples `live[rows]`."""
        held = [(layer.buffers[0], layer.buffers[1]) if rows is None else (layer.buffers[0][rows], layer.buffers[1][rows])
                for layer in self.cache.layers]
        self.parked.append((live if rows is None else live[rows], held))

    @torch.no_grad()
    def extend(self, keep: list[int], tokens: list[list[int]]) -> None:
        """Keep samples `keep` of the last `generate` (its indices, in this order) and append
        `tokens[k]` to sample `keep[k]`: the next `generate` goes on from there."""
        before, start, prompt, prefixes = self.before
        device = self.positions.device
        kept = torch.tensor(keep, device=device)
        drawn = torch.tensor([len(self.samples[s]) for s in keep], device=device)
        # each row's own positions to keep: not its prompt's, nor those of tokens drawn after it ended
        ran = torch.arange(int(drawn.max()) - 1, device=device)
        valid = torch.cat([before[kept, self.width:] != 0, ran[None] < drawn[:, None] - 1], dim=1)
        lengths = valid.sum(1)
        own = int(lengths.max())
        index = torch.argsort(~valid, dim=1, stable=True)[:, :own]  # [B, own]: the positions kept, in order
        appended = [[self.samples[s][-1], *t] for s, t in zip(keep, tokens)]
        new = max(len(a) for a in appended)
        place = torch.full((len(self.samples),), -1, device=device)
        place[kept] = torch.arange(len(keep), device=device)
        moves = []  # per piece: its rows kept, and their places in the new batch
        for samples, _ in self.parked:
            target = place[samples]
            moves.append(((target >= 0).nonzero().squeeze(1), target[target >= 0]))
        for i, layer in enumerate(self.cache.layers):
            keys_t, values = self.parked[0][1][i]
            heads, dim = values.shape[1], values.shape[-1]
            fresh = (keys_t.new_zeros(len(keep), heads, dim, own + new + BLOCK), values.new_zeros(len(keep), heads, own + new + BLOCK, dim))
            for (_, held), (source, target) in zip(self.parked, moves):
                at = index[target]
                fresh[0][target, ..., :own] = held[i][0][source].gather(-1, at[:, None, None, :].expand(-1, heads, dim, -1))
                fresh[1][target, :, :own] = held[i][1][source].gather(-2, at[:, None, :, None].expand(-1, heads, -1, dim))
            layer.buffers = fresh
            layer.keys, layer.values = fresh[0][..., :own].transpose(-1, -2), fresh[1][:, :, :own]
        if self.shares:  # the prefixes of the kept samples' prompts
            live = torch.unique(prompt[kept])
            self.rows = PromptRows(torch.searchsorted(live, prompt[kept]), len(live))
            for layer, prefix in zip(self.cache.layers, prefixes):
                layer.prefix, layer.rows = (prefix[0][live], prefix[1][live]), self.rows
        pads = torch.tensor([new - len(a) for a in appended], device=device)
        ids = torch.tensor([[self.pad_id] * (new - len(a)) + a for a in appended], device=device)
        added = (torch.arange(new, device=device)[None] >= pads[:, None]).long()
        first = start[kept] + drawn  # the last drawn token's position
        positions = (first[:, None] + torch.arange(new, device=device)[None] - pads[:, None]).clamp(min=0)
        mask = torch.cat([before[kept, : self.width], (torch.arange(own, device=device)[None] < lengths[:, None]).long(), added], dim=1)
        with self.engine(len(keep), steps=False):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache, logits_to_keep=1)
        self.logits, self.positions, self.mask, self.parked = out.logits[:, -1], positions[:, -1:], mask, []


class Step:
    """r1kit's decoding loop as r1kit.sampling.tool_loop's step: a call decodes one turn of whole
    prompts (`decode`); `session(prompts, counts)` is a started `Decoder`, whose turns go on from
    its cache. `region`: a context entered around each call (a trainer's generation settings),
    which may yield the model to decode with (else `model`)."""

    def __init__(self, model, draw: Callable[[torch.Tensor], torch.Tensor], eos_ids: set[int], pad_id: int,
                 region: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.model, self.draw, self.eos_ids, self.pad_id, self.region = model, draw, eos_ids, pad_id, region

    def __call__(self, prompts: list[list[int]], counts: list[int], max_tokens: int, stop=None) -> list[list[int]]:
        with self.region() as model:
            return decode(model if model is not None else self.model, prompts, counts, max_tokens, self.draw, self.eos_ids, self.pad_id, stop)

    def session(self, prompts: list[list[int]], counts: list[int]) -> Decoder:
        decoder = Decoder(self.model, self.draw, self.eos_ids, self.pad_id, region=self.region)
        decoder.start(prompts, counts)
        return decoder
