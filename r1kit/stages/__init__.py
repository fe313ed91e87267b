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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

_MODULES = {
    "sft": "r1kit.stages.sft",
    "grpo": "r1kit.stages.grpo",
    "rejection": "r1kit.stages.rejection",
    "eval": "r1kit.stages.evaluate",
}


@dataclass(frozen=True)
class StageKind:
    config: type
    """The stage's config dataclass."""
    run: Callable[["StageContext"], "StageResult"]
    """Runs the stage."""
    trainer_config: Callable[[], type] | None = None
    """Returns the trainer library's config class for the `trainer:` block (imported lazily)."""
    distributed: bool = True
    """True: every process of a distributed run runs it (training). False: only the main process."""
    check: Callable[[Any], None] | None = None
    """Checks that need more than types (reward names, templates); raises RecipeError."""


@dataclass
class StageContext:
    recipe: Any
    """The whole recipe (r1kit.config.Recipe)."""
    stage: Any
    """This stage's config."""
    dir: Path
    """This stage's folder, output_dir/<name>/; the stage writes only here."""
    model: str
    """Model to start from: a local folder or a hub id."""
    datasets: dict[str, str]
    """Datasets written by earlier stages, by stage name."""
    is_main: bool = True
    """False on the non-main processes of a distributed run: they must not write reports."""

    def resolve_data_source(self, source: str) -> str:
        """An earlier stage's dataset when `source` names one, else `source` unchanged."""
        return self.datasets.get(source, source)


@dataclass
class StageResult:
    model: str | None = None
    """Folder of the model this stage produced (handed to the next stage)."""
    dataset: str | None = None
    """File of the dataset this stage produced (usable as a later stage's data.source)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Figures for the run report."""


def kinds() -> list[str]:
    return list(_MODULES)


def get(kind: str) -> StageKind:
    return importlib.import_module(_MODULES[kind]).STAGE
