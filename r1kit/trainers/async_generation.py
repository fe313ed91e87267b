"""Asynchronous GRPO on a CPU: rollouts drawn in a process of their own, at most `max_staleness`
optimizer steps ahead of the trainer, with the trainer's new weights after every step.

    trainer process (r1kit's GRPOTrainer)                      generator process (`Generator`)
    get_batch_samples: this step's batches, and the prompts   waits until its weights are at most
      of the next max_staleness steps sent ahead (`Feed`)       max_staleness steps behind the step
    _generate_single_turn: a batch's completions, with the      a batch is for, takes the newest,
      sampling log-probabilities and the weights' version       draws with r1kit's decoding loop
    on_step_end: the new weights into shared memory

- **Versions.** A policy version is the number of optimizer steps behind a set of weights; the
  batch trained at step k was drawn by version v >= k - max_staleness, its staleness k - v. The
  generator waits for new enough weights rather than draw with older ones, so no batch is ever too
  old and none is dropped here (TRL's GPU engine, whose generator does not wait, drops them).
- **Correction.** By default PPO's ratio is taken to the policy that drew the samples, as TRL's
  asynchronous trainer does: TRL's ``old_per_token_logps`` are the generator's log-probabilities,
  so the clip (``epsilon``) bounds how far a stale sample moves the policy, at no extra cost. With
  ``trainer.vllm_importance_sampling_correction: true`` the trainer instead scores each batch with
  its weights at the step (one more forward pass) and TRL's importance-sampling correction weighs
  the loss by the ratio of those to the generator's, truncated or masked as its
  ``vllm_importance_sampling_mode`` says (decoupled PPO, as AReaL and verl do).
- **Lockstep.** With ``max_staleness: 0`` the generator draws each batch with the weights of the
  step that trains on it, and torch's random state travels with the batch and back: the samples,
  and so the steps, are the synchronous stage's, generated in another process. Above 0 each batch
  is drawn from a seed of its own (the recipe's seed and the step), but which version draws it
  depends on timing (the newest the generator holds), so two runs may differ.
- **Resume.** A restarted stage starts a new generator from the checkpoint's weights; batches that
  were in flight are drawn again, for the steps that train on them.
- **Cores.** The generator gets half of the process's cores (at least one), the trainer the rest.
- **LoRA.** With ``peft:`` the generator holds a plain model: each step it gets the base weights with
  the adapter's delta added (`plain_weights`), the trainer's model left as it is.

Not here: the loss (TRL's), the rewards (TRL computes them in the trainer's process while the
generator draws the next batches), GPUs (TRL's own asynchronous trainer: the async_grpo stage,
r1kit.stages.async_grpo).
"""

from __future__ import annotations

import logging
import os
import queue
import time
import traceback
from collections import deque
from dataclasses import dataclass

import torch

from r1kit import hardware

log = logging.getLogger(__name__)


@dataclass
class Drawn:
    """One generation batch as the generator drew it."""

    step: int
    """The optimizer step that trains on it."""
    version: int
    """Optimizer steps behind the weights that drew it."""
    prompts: list[list[int]]
    counts: list[int]
    completions: list[list[int]]
    logps: list[list[float]]
    seconds: float
    """Generating it (the tools' runs included)."""
    waited: float
    """Waiting for the trainer before drawing it: for its prompts (sent as the trainer starts the step
    `max_staleness` before) and weights new enough (the first batch: the process's start-up too)."""
    rng: torch.Tensor | None = None
    masks: list[list[int]] | None = None
    """With tools: 1 where the model wrote a token, 0 where a tool's output did."""
    tool_figures: dict[str, float] | None = None


def split_cores(cores: int | None = None) -> tuple[int, int]:
    """(generator's threads, trainer's threads): half each, the generator at least one."""
    cores = cores or hardware.cores()
    generator = max(1, cores // 2)
    return generator, max(1, cores - generator)


class Generator:
    """The trainer's handle on the generator process: `publish` weights, `submit` batches in step
    order, `take` them back in the same order."""

    def __init__(self, model, *, max_staleness: int, temperature: float, top_p: float, eos_ids: set[int], pad_id: int,
                 bf16: bool, threads: int, seed: int, tools: list | None = None, tokenizer=None):
        mp = torch.multiprocessing.get_context("spawn")
        self.max_staleness = max_staleness
        self.buffers = {k: v.detach().to(torch.float32).clone().share_memory_() for k, v in plain_weights(model).items()}
        self.version = mp.Value("q", -1, lock=False)
        self.lock = mp.Lock()
        self.requests, self.results = mp.Queue(), mp.Queue()
        settings = {"temperature": temperature, "top_p": top_p, "eos_ids": sorted(eos_ids), "pad_id": pad_id, "bf16": bf16,
                    "threads": threads, "seed": seed, "tools": tools, "tokenizer": tokenizer, "parent": os.getpid()}
        config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
        self.process = mp.Process(target=serve, args=(config, self.buffers, self.version, self.lock, self.requests,
                                                      self.results, settings), daemon=True, name="r1kit-generator")
        self.process.start()
        self.pending: deque[tuple[int, list[list[int]], list[int]]] = deque()

    def publish(self, model, version: int) -> None:
        """`model`'s weights, `version` optimizer steps in, for the generator's next batch."""
        with torch.no_grad():
            weights = plain_weights(model)
            with self.lock:
                for name, tensor in weights.items():
                    self.buffers[name].copy_(tensor)
                self.version.value = version

    def submit(self, step: int, prompts: list[list[int]], counts: list[int], max_tokens: int) -> None:
        """Ask for `counts[i]` completions of each `prompts[i]`, for optimizer step `step`: drawn by
        weights at most `max_staleness` steps older; in lockstep (`max_staleness` 0), from torch's
        random state as it is now (taken back by `take`)."""
        rng = torch.get_rng_state() if self.max_staleness == 0 else None
        self.requests.put((step, step - self.max_staleness, prompts, counts, max_tokens, rng))
        self.pending.append((step, prompts, counts))

    def take(self) -> tuple[Drawn, float]:
        """The oldest submitted batch, and the seconds spent waiting for it. A batch drawn for other
        prompts than submitted, or a generator that failed or died, stops training with its reason."""
        step, prompts, counts = self.pending.popleft()
        start = time.perf_counter()
        while True:
            try:
                got = self.results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(f"the rollout generator process ended (exit code {self.process.exitcode})") from None
        if isinstance(got, str):
            raise RuntimeError(f"the rollout generator failed:\n{got}")
        if (got.step, got.prompts, got.counts) != (step, prompts, counts):
            raise RuntimeError(f"the rollout generator answered step {got.step} for step {step}, or other prompts")
        if got.rng is not None:
            torch.set_rng_state(got.rng)
        return got, time.perf_counter() - start

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def plain_weights(model) -> dict[str, torch.Tensor]:
    """The weights of `model` as a plain transformers model of its architecture names them: a LoRA
    model's (peft) with each adapter's delta added to its base weight, the model left untouched."""
    if not hasattr(model, "get_base_model"):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {name: sum(m.get_delta_weight(a) for a in m.active_adapters) for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    out = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        owner, _, leaf = key.rpartition(".base_layer.")
        if owner in deltas and leaf == "weight":
            value = value + deltas[owner].to(value.dtype)
        out[key.replace(".base_layer.", ".")] = value
    return out


def serve(config, buffers, version, lock, requests, results, settings) -> None:
    """The generator process: draws each requested batch once its weights are new enough."""
    import signal

    from r1kit.hardware import die_with

    die_with(settings["parent"])  # ends with the trainer, however it ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle (one line, no traceback here)
    torch.set_num_threads(settings["threads"])
    try:
        from transformers import AutoModelForCausalLM

        from r1kit.sampling.decode import decode
        from r1kit.sampling.draws import Nucleus

        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        nucleus = Nucleus(settings["temperature"], settings["top_p"])
        eos_ids, pad_id = set(settings["eos_ids"]), settings["pad_id"]
        tools = None
        if settings["tools"]:
            from r1kit.execution.tools import Tool, from_recipe

            tools = [Tool(c) for c in from_recipe(settings["tools"], "tools")]
        held = -1
        idle = time.perf_counter()
        while (request := requests.get()) is not None:
            step, oldest, prompts, counts, max_tokens, rng = request
            while version.value < oldest:
                time.sleep(0.001)
            waited = time.perf_counter() - idle
            if version.value != held:
                with torch.no_grad(), lock:
                    model.load_state_dict(buffers, strict=False)
                    held = version.value
            start = time.perf_counter()
            if rng is not None:
                torch.set_rng_state(rng)
            else:  # each batch from its own seed: the same draws after a restart
                torch.manual_seed(settings["seed"] * 1_000_003 + step)
            logps: list[list[float]] = []
            masks = figures = None
            region = torch.autocast("cpu", dtype=torch.bfloat16) if settings["bf16"] else torch.autocast("cpu", enabled=False)
            with region:
                if tools is None:
                    completions = decode(model, prompts, counts, max_tokens, nucleus.draw, eos_ids, pad_id,
                                         scores=(nucleus.log_prob, logps))
                else:
                    completions, masks, logps, figures = tool_rollouts(model, prompts, counts, max_tokens, tools, settings["tokenizer"],
                                                                       nucleus, eos_ids, pad_id)
            idle = time.perf_counter()
            results.put(Drawn(step, held, prompts, counts, completions, logps, idle - start, waited,
                              torch.get_rng_state() if rng is not None else None, masks, figures))
    except Exception:  # noqa: BLE001 - the trainer raises it, with this traceback
        results.put(traceback.format_exc())


def tool_rollouts(model, prompts, counts, max_tokens, tools, tokenizer, nucleus, eos_ids, pad_id):
    """Rollouts that call `tools` (r1kit.sampling.tool_loop) with r1kit's decoding loop: their
    tokens, tool masks, sampling log-probabilities (scored afterwards by the weights that drew
    them, in one forward pass a chunk of rows; 0 for a tool's tokens, which leave the loss), and the
    tools' figures."""
    from r1kit.sampling import tool_loop
    from r1kit.sampling.decode import Step

    step = Step(model, nucleus.draw, eos_ids, pad_id)
    transcripts = tool_loop.rollouts(step, prompts, counts, max_tokens, tools, tokenizer, eos_ids)
    rows = [p for p, n in zip(prompts, counts) for _ in range(n)]
    logps = []
    for start in range(0, len(rows), 32):
        chunk = list(zip(rows[start:start + 32], transcripts[start:start + 32]))
        width = max(len(p) + len(t.ids) for p, t in chunk)
        ids = torch.tensor([p + t.ids + [pad_id] * (width - len(p) - len(t.ids)) for p, t in chunk])
        mask = torch.tensor([[1] * (len(p) + len(t.ids)) + [0] * (width - len(p) - len(t.ids)) for p, t in chunk])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        for row, (p, t) in enumerate(chunk):
            if not t.ids:
                logps.append([])
                continue
            picked = nucleus.log_prob(logits[row, len(p) - 1:len(p) + len(t.ids) - 1], torch.tensor(t.ids))
            logps.append([v if m else 0.0 for v, m in zip(picked.tolist(), t.mask)])
    return [t.ids for t in transcripts], [t.mask for t in transcripts], logps, tool_loop.metrics(transcripts)


class Feed:
    """The trainer's side of the lookahead: hands the trainer each optimizer step's batches from
    its data iterator, and sends the prompts of the next `max_staleness` steps to the generator
    as soon as they are known (one generation batch per optimizer step)."""

    def __init__(self, generator: Generator, tokenize, max_tokens: int):
        self.generator, self.tokenize, self.max_tokens = generator, tokenize, max_tokens
        self.iterator = None
        self.ahead: deque[list] = deque()

    def next_step(self, epoch_iterator, num_batches: int, step: int) -> list:
        """The batches of optimizer step `step` (the trainer's ``global_step``); at an epoch's end
        the lookahead stops (the next epoch's order is not drawn yet)."""
        if epoch_iterator is not self.iterator:
            self.iterator, self.ahead = epoch_iterator, deque()
        while len(self.ahead) <= self.generator.max_staleness:
            batches = [b for b in (next(epoch_iterator, None) for _ in range(num_batches)) if b is not None]
            if not batches:
                break
            self.ahead.append(batches)
            self._submit(batches[0], step + len(self.ahead) - 1)
        return self.ahead.popleft() if self.ahead else []

    def _submit(self, rows: list[dict], step: int) -> None:
        from r1kit.trainers.rollouts import groups

        prompts, counts = groups(self.tokenize([row["prompt"] for row in rows]))
        self.generator.submit(step, prompts, counts, self.max_tokens)


def outside_share(batch: dict, mode: str, low: float | None, high: float | None) -> float:
    """The share of a batch's completion tokens (sequences, for the ``sequence_*`` modes) whose
    importance ratio TRL's correction truncated or masked: outside [`low`, `high`]."""
    mask = batch["completion_mask"].bool()
    diff = (batch["old_per_token_logps"] - batch["sampling_per_token_logps"]).nan_to_num(0.0) * mask
    ratio = diff.sum(-1).exp() if mode.startswith("sequence") else diff.exp()[mask]
    return _share_outside(ratio, low, high) if ratio.numel() else 0.0


def _share_outside(ratio: torch.Tensor, low: float | None, high: float | None) -> float:
    """The share of `ratio`'s (non-empty) values below `low` or above `high` (None: no bound)."""
    out = torch.zeros_like(ratio, dtype=torch.bool)
    if low is not None:
        out |= ratio < low
    if high is not None:
        out |= ratio > high
    return float(out.float().mean())


def ratio_figures(logps: torch.Tensor, rows: dict, low: float, high: float) -> dict[str, float]:
    """The importance ratio of a training forward pass's log-probabilities to the sampling ones
    (``old_per_token_logps``, the generator's): mean, min, max over completion tokens, and the share
    outside PPO's clip range [1 - `low`, 1 + `high`]."""
    mask = rows["completion_mask"].bool()
    if "tool_mask" in rows:
        mask &= rows["tool_mask"].bool()
    ratio = (logps - rows["old_per_token_logps"]).exp()[mask]
    if not ratio.numel():
        return {}
    return {"async/ratio_mean": float(ratio.mean()), "async/ratio_min": float(ratio.min()), "async/ratio_max": float(ratio.max()),
            "async/corrected_share": _share_outside(ratio, 1 - low, 1 + high)}
