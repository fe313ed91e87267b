"""The transformers sampling backend: batched `model.generate` with left padding.

Prompts are expanded n times and generated in chunks of `batch_size` sequences; each chunk is
seeded from ``params.seed`` and its index, so results do not depend on what ran before.
Temperature and top-p sampling is r1kit's `Nucleus` (the distribution transformers' own warpers
give, without sorting the vocabulary at every step). Not fast: on GPUs prefer the vLLM backend.
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
            sampler = [Nucleus(params.temperature, params.top_p)] if params.temperature > 0 else []
            gen = self.model.generate(
                **enc,
                max_new_tokens=params.max_tokens,
                do_sample=False,  # greedy on Nucleus's output: the token it sampled
                temperature=None,
                top_p=None,
                top_k=None,
                logits_processor=sampler,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            for row in new.tolist():
                ended = next((i for i, t in enumerate(row) if t in eos_ids), None)
                tokens = row[: ended + 1] if ended is not None else row
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                out.append(Completion(text=text, tokens=len(tokens), truncated=ended is None))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]


class Nucleus:
    """Temperature and top-p (nucleus) sampling as a logits processor for greedy decoding: it
    draws each row's next token and returns scores that are 0 there and -inf elsewhere.

    The distribution is that of transformers' temperature and top-p warpers followed by
    multinomial sampling: the smallest set of most likely tokens whose probability reaches
    `top_p`, renormalised (no top-k, as in vLLM). transformers sorts the whole vocabulary and
    draws from all of it at every step, which on a CPU costs more than the model's own matmuls
    for a 135M-parameter model; here the k most likely tokens hold the nucleus as soon as their
    probability reaches `top_p` (k starts at 64 and doubles until it does, up to a sixteenth of
    the vocabulary, past which it is ranked whole, as a vocabulary of up to 4,096 tokens always
    is), and only they are drawn from. The same up to rounding at the nucleus's edge and the order
    of tied tokens. Draws come from torch's global generator. Other sampling settings of the
    model's generation_config.json (min_p, typical_p, ...) are not applied, as in vLLM.
    """

    WHOLE = 4096  # a vocabulary up to this size is ranked whole: cheaper than a second topk

    def __init__(self, temperature: float, top_p: float, k: int = 64):
        if not temperature > 0 or not 0 < top_p <= 1:
            raise ValueError(f"sampling needs temperature > 0 and 0 < top_p <= 1; got {temperature}, {top_p}")
        self.temperature, self.top_p, self.k = temperature, top_p, k

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature
        vocab = logits.size(-1)
        if self.top_p >= 1.0:
            tokens = torch.multinomial(logits.softmax(dim=-1), 1)
        else:
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
            tokens = index.gather(-1, torch.multinomial(probs * keep, 1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)
