"""DAPO's dynamic sampling on top of `trl.GRPOTrainer` (Yu et al., 2025, section 3.2).

A group whose G completions all get the same reward has zero advantage: it adds nothing to the
policy gradient but still dilutes the batch. `DynamicSampling` drops such groups after
scoring (read from the rewards: their weighted sum, or with ``multi_objective_aggregation:
normalize_then_sum`` each reward, equal across the group) and refills the generation batch with
groups generated from further training prompts, for at most `max_rounds` extra generation
rounds. If the batch is still short after that, the remaining slots are topped up with dropped
groups, their advantages set to zero (no gradient, shapes unchanged), and the shortfall is
logged. Logged per generation: ``dynamic_sampling/dropped_groups``, ``dynamic_sampling/rounds``
and ``dynamic_sampling/unfilled_groups``.

Refill prompts come from a seeded shuffle of the training set, independent of TRL's sampler. In a
multi-process run every process shuffles alike and takes its own share of that order (process
i takes every i-th prompt), so no two processes refill with the same prompts, and every process
does the same number of rounds (the largest any process needs), since generation and scoring
gather across processes.

Not supported: multimodal inputs and tool-calling rollouts (their extra tensors are not merged).
"""

from __future__ import annotations

import random

import torch

# Tensors of shape (B, T) and the side their padding is on; anything else of shape (B,) is per-row.
_LEFT_PADDED = {"prompt_ids", "prompt_mask"}
_RIGHT_PADDED = {"completion_ids", "completion_mask", "old_per_token_logps", "ref_per_token_logps",
                 "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask"}
_PER_ROW = {"advantages"}


def _pad_cat(tensors: list[torch.Tensor], value: float, left: bool) -> torch.Tensor:
    width = max(t.size(1) for t in tensors)
    padded = []
    for t in tensors:
        fill = t.new_full((t.size(0), width - t.size(1)), value)
        padded.append(torch.cat([fill, t] if left else [t, fill], dim=1))
    return torch.cat(padded)


def merge_rows(chunks: list[tuple[dict, torch.Tensor]], pad_token_id: int) -> dict:
    """Concatenate the selected rows of several scored batches, re-padding to a common width."""
    first = chunks[0][0]
    unknown = set(first) - _LEFT_PADDED - _RIGHT_PADDED - _PER_ROW - {"num_items_in_batch"}
    if unknown:
        raise NotImplementedError(f"dynamic sampling cannot merge batch fields {sorted(unknown)}")
    out = {}
    for key in first:
        if key == "num_items_in_batch":
            continue
        parts = [batch[key][rows] for batch, rows in chunks]
        if key in _PER_ROW:
            out[key] = torch.cat(parts)
        else:
            value = pad_token_id if key == "prompt_ids" or key == "completion_ids" else 0
            out[key] = _pad_cat(parts, value, left=key in _LEFT_PADDED)
    return out


class DynamicSampling:
    """DAPO's dynamic sampling for one trainer (r1kit.trainers.trl_overrides' ``GRPOTrainer`` calls
    `refill` after TRL generated and scored a batch, and hands it the rewards TRL computed)."""

    def __init__(self, max_rounds: int, seed: int):
        self.max_rounds = max_rounds
        self.rewards: torch.Tensor | None = None  # (all processes' rows, functions), the last computed
        self._refill_rng = random.Random(seed)
        self._refill_order: list[int] = []

    def _next_prompts(self, trainer, n: int) -> list[dict]:
        rows = []
        while len(rows) < n:
            if not self._refill_order:
                order = list(range(len(trainer.train_dataset)))
                self._refill_rng.shuffle(order)  # the same order on every process, each taking its share
                share = order[trainer.accelerator.process_index :: trainer.accelerator.num_processes]
                self._refill_order = share or order
            rows.append(trainer.train_dataset[self._refill_order.pop()])
        return rows

    def signal(self, trainer, rows: int) -> torch.Tensor:
        """(groups,) True where the rewards just computed differ within a group of this process.

        Read from the rewards, not the advantages: a group of equal rewards whose sum is inexact in
        float32 (weights like 0.2) gets advantages of about 1e-3 from rounding, not zero."""
        start = trainer.accelerator.process_index * rows
        scores = self.rewards[start : start + rows]
        if trainer.multi_objective_aggregation == "sum_then_normalize":  # the weighted sum is what TRL normalises
            unscorable = torch.isnan(scores).all(dim=1, keepdim=True)
            summed = (scores * trainer.reward_weights.to(scores.device)).nansum(dim=1, keepdim=True)
            scores = summed.masked_fill(unscorable, float("nan"))
        groups = scores.view(-1, trainer.num_generations, scores.size(-1))
        high = groups.nan_to_num(nan=float("-inf")).amax(dim=1)
        low = groups.nan_to_num(nan=float("inf")).amin(dim=1)
        return (high > low).any(dim=-1)

    def refill(self, trainer, batch: dict, generate_and_score) -> dict:
        """`batch` with its zero-signal groups replaced by groups of further prompts, drawn and
        scored by `generate_and_score` (TRL's ``_generate_and_score_completions``)."""
        G = trainer.num_generations
        n_groups = batch["advantages"].size(0) // G
        if batch["advantages"].size(0) % G:
            raise ValueError(
                "dynamic sampling needs whole groups on each process: make per_device_train_batch_size × "
                f"steps_per_generation a multiple of num_generations ({G})"
            )

        kept: list[tuple[dict, torch.Tensor]] = []
        dropped: list[tuple[dict, torch.Tensor]] = []
        n_kept, n_dropped, rounds = 0, 0, 0
        current = batch
        while True:
            has = self.signal(trainer, current["advantages"].size(0))
            groups = torch.arange(has.numel(), device=has.device)
            take = groups[has][: n_groups - n_kept]
            if take.numel():
                kept.append((current, (take[:, None] * G + torch.arange(G, device=has.device)).flatten()))
                n_kept += take.numel()
            lost = groups[~has]
            if lost.numel():
                dropped.append((current, (lost[:, None] * G + torch.arange(G, device=has.device)).flatten()))
                n_dropped += lost.numel()
            need = torch.tensor([n_groups - n_kept], device=has.device)
            if rounds >= self.max_rounds or trainer.accelerator.gather(need).max().item() == 0:
                break
            rounds += 1
            refill = [row for row in self._next_prompts(trainer, n_groups) for _ in range(G)]
            current = generate_and_score(refill)

        unfilled = n_groups - n_kept
        for chunk, rows in dropped:  # top up with zero-signal groups so every step sees a full batch
            if n_kept == n_groups:
                break
            rows = rows[: (n_groups - n_kept) * G]
            # Their advantages are rounding residue (or, normalised over the batch, not small at all).
            chunk = {**chunk, "advantages": chunk["advantages"].clone()}
            chunk["advantages"][rows] = 0.0
            kept.append((chunk, rows))
            n_kept += rows.numel() // G
        merged = merge_rows(kept, trainer.processing_class.pad_token_id)
        mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else merged["completion_mask"]
        merged["num_items_in_batch"] = trainer.accelerator.gather(mask.sum()).sum()
        metrics = trainer._metrics["train"]
        metrics["dynamic_sampling/dropped_groups"].append(float(n_dropped))
        metrics["dynamic_sampling/rounds"].append(float(rounds))
        metrics["dynamic_sampling/unfilled_groups"].append(float(unfilled))
        return merged
