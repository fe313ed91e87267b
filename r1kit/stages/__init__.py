"""The stage registry: maps a recipe's ``kind:`` to the code that runs it.

Each stage module defines ``STAGE = StageKind(config=..., run=..., trainer_config=...)``: its
config dataclass (a subclass of `r1kit.config.StageConfig`), its run function, and, for training
stages, the trainer library's config class that checks the ``trainer:`` block. Modules are
imported only when a recipe uses their kind, so the CLI stays fast.

A run function gets a `StageContext` and returns a `StageResult`: where its model and/or dataset
ended up, and the figures worth reporting. It writes only inside ``ctx.dir``; the pipeline owns
markers, resume and hand-off.
"""

from __future__ import annotations

import importlib

from r1kit.stages.base import StageContext, StageKind, StageResult

__all__ = ["StageContext", "StageKind", "StageResult", "get", "kinds"]

_MODULES = {
    "sft": "r1kit.stages.sft",
    "grpo": "r1kit.stages.grpo",
    "async_grpo": "r1kit.stages.async_grpo",
    "rejection": "r1kit.stages.rejection",
    "eval": "r1kit.stages.evaluate",
    "distill": "r1kit.stages.distill",
    "reward": "r1kit.stages.reward",
}


def kinds() -> list[str]:
    return list(_MODULES)


def get(kind: str) -> StageKind:
    return importlib.import_module(_MODULES[kind]).STAGE
