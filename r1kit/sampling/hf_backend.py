"""The transformers sampling backend: batched `model.generate` with left padding.

Prompts are expanded n times and generated in chunks of `batch_size` sequences; each chunk is
seeded from ``params.seed`` and its index, so results do not depend on what ran before.
Not fast: on GPUs prefer the vLLM backend.
"""

from __future__ import annotations

import torch

from r1kit.sampling.base import Completion, SamplingParams


class HFSampler:
    backend = "transformers"

    def __init__(self, model: str, batch_size: int = 64, dtype: str = "auto"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
        self.batch_size = batch_size

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[str]]:
        return [[c.text for c in row] for row in self.generate_full(prompts, n, params)]

    @torch.no_grad()
    def generate_full(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        flat = [p for p in prompts for _ in range(n)]
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        out: list[Completion] = []
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start : start + self.batch_size]
            enc = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
            torch.manual_seed(params.seed + start)
            sampling = params.temperature > 0
            gen = self.model.generate(
                **enc,
                max_new_tokens=params.max_tokens,
                do_sample=sampling,
                temperature=params.temperature if sampling else None,
                top_p=params.top_p if sampling else None,
                top_k=0 if sampling else None,  # no top-k: only top-p, as vLLM does
                pad_token_id=self.tokenizer.pad_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            for row in new.tolist():
                ended = next((i for i, t in enumerate(row) if t in eos_ids), None)
                tokens = row[: ended + 1] if ended is not None else row
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                out.append(Completion(text=text, tokens=len(tokens), truncated=ended is None))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]
