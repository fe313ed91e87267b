"""The transformers sampling backend: a transformers model driven by r1kit's decoding loop
(r1kit.sampling.decode: one prefill per prompt for its n samples, an in-place cache, finished
samples leave the batch; temperature and top-p sampling by its `Nucleus`).

The n samples of each prompt are generated in chunks of at most `batch_size` samples (by default
as many as keep a chunk's cached keys and values under `CACHE_BYTES`, at most `MAX_ROWS`: on a
CPU a decoding step of 128 rows computed SmolLM2's tokens 1.2-1.3x as fast as two of 64); each chunk
is seeded from ``params.seed`` and the index of its first sample, so results do not depend on
what ran before. On GPUs prefer the vLLM backend: no paged attention or continuous batching here.
"""

from __future__ import annotations

import torch

from r1kit import hardware
from r1kit.hardware import cpu
from r1kit.sampling import tool_loop
from r1kit.sampling.base import Completion, SamplingParams
from r1kit.sampling.decode import BLOCK, Step, decode
from r1kit.sampling.draws import Nucleus, greedy

CACHE_BYTES = 2 * 2**30  # keys and values a chunk's samples may cache, by default
MAX_ROWS = 256


class HFSampler:
    backend = "transformers"

    def __init__(self, model: str, batch_size: int | None = None, dtype: str = "auto"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        device = "cuda" if hardware.has_gpu() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
        self.batch_size = batch_size
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = {i for i in [*(eos if isinstance(eos, list) else [eos]), self.tokenizer.eos_token_id] if i is not None}
        """The tokens that end a sample: the generation config's and the tokenizer's (either may have none)."""

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[str]]:
        return [[c.text for c in row] for row in self.generate_full(prompts, n, params)]

    def generate_full(self, prompts: list[str], n: int, params: SamplingParams, tools: list | None = None) -> list[list[Completion]]:
        eos_ids = self.eos_ids
        draw = Nucleus(params.temperature, params.top_p).draw if params.temperature > 0 else greedy
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        out: list[Completion] = []
        batch = self.batch_size or self.rows_for(params.max_tokens)
        step = Step(self.model, draw, eos_ids, self.tokenizer.pad_token_id)

        with cpu.packed_linears(self.model, batch):  # once for all chunks: the weights do not change
            for start, chunk in chunks(len(prompts), n, batch):
                torch.manual_seed(params.seed + start)
                chunk_prompts, counts = [ids[p] for p, _ in chunk], [k for _, k in chunk]
                if tools:
                    out += tool_loop.completions(step, chunk_prompts, counts, params.max_tokens, tools, self.tokenizer, eos_ids, start)
                    continue
                for tokens in decode(self.model, chunk_prompts, counts, params.max_tokens, draw, eos_ids, self.tokenizer.pad_token_id):
                    text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                    out.append(Completion(text=text, tokens=len(tokens), truncated=tokens[-1] not in eos_ids))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def rows_for(self, max_tokens: int) -> int:
        """Samples a chunk of completions of up to `max_tokens` tokens can hold: their own keys
        and values (each prompt's are kept once) within `CACHE_BYTES`, at most `MAX_ROWS`."""
        config = self.model.config.get_text_config(decoder=True)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        per_position = 2 * config.num_hidden_layers * heads * dim * self.model.dtype.itemsize
        return max(1, min(MAX_ROWS, CACHE_BYTES // (per_position * (max_tokens + BLOCK))))


def chunks(prompts: int, n: int, batch_size: int):
    """(index of the chunk's first sample, [(prompt, samples), ...]) over the prompts' n samples
    each, in order, at most `batch_size` samples a chunk (a prompt's samples may span chunks)."""
    chunk: list[tuple[int, int]] = []
    size = start = 0
    for prompt in range(prompts):
        left = n
        while left:
            take = min(left, batch_size - size)
            chunk.append((prompt, take))
            size, left = size + take, left - take
            if size == batch_size:
                yield start, chunk
                chunk, start, size = [], start + size, 0
    if chunk:
        yield start, chunk
