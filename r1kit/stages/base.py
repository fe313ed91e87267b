"""What a stage kind declares (`StageKind`), what its run function gets (`StageContext`) and what
it returns (`StageResult`). Stage modules import these; the registry in r1kit.stages maps kinds to
the modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class StageKind:
    config: type
    """The stage's config dataclass."""
    run: Callable[["StageContext"], "StageResult"]
    """Runs the stage."""
    trainer_config: Callable[[], type] | None = None
    """Returns the trainer library's config class for the `trainer:` block (imported lazily)."""
    check: Callable[[Any], None] | None = None
    """Checks that need more than types (reward names, templates); raises RecipeError."""
    trainer_defaults: Callable[[Any], dict[str, Any]] = lambda stage: {}
    """r1kit's defaults for the stage's trainer config (the paper's), under the recipe's fields."""


def alone() -> None:
    """The barrier of a single process: nobody to wait for."""


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
    models: dict[str, str] = field(default_factory=dict)
    """Models written by earlier stages, by stage name (a distill stage's teacher may name one)."""
    is_main: bool = True
    """False on the non-main processes of a distributed run: they must not write reports."""
    rank: int = 0
    """This process's rank in a distributed run (0 in a single process)."""
    world: int = 1
    """The number of processes of the run; every one runs every stage."""
    barrier: Callable[[], None] = field(default_factory=lambda: alone, repr=False)
    """Waits until every process of the run has called it (with no timeout that a long stage
    could reach); stages that share work among processes meet here before merging it."""

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
