"""What a stage kind declares (`StageKind`), what its run function gets (`StageContext`) and what
it returns (`StageResult`). Stage modules import these; the registry in r1kit.stages maps kinds to
the modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from r1kit.hardware import Machine, World
from r1kit.stages import hooks

if TYPE_CHECKING:
    from r1kit.models import ModelRef


@dataclass(frozen=True)
class StageKind:
    config: type
    """The stage's config dataclass."""
    run: Callable[["StageContext"], "StageResult"]
    """Runs the stage."""
    trainer_config: Callable[[Any], type] | None = None
    """Returns the trainer library's config class for the stage's `trainer:` block (imported lazily)."""
    check: Callable[[Any], None] | None = None
    """Checks that need more than types (reward names, templates); raises RecipeError."""
    trainer_defaults: Callable[[Any], dict[str, Any]] = lambda stage: {}
    """r1kit's defaults for the stage's trainer config (the paper's), under the recipe's fields."""
    models: Callable[[Any], list[tuple[str, str]]] = hooks.model_refs
    """The model references the stage names (key, reference): ``model:``, a distill stage's teacher."""
    data: Callable[[Any], list[tuple[str, Any]]] = lambda stage: []
    """The stage's data sections (key, r1kit.config.DataConfig), checked before anything runs."""
    budgets: Callable[[Any], "hooks.TokenBudgets | None"] = lambda stage: None
    """The token budgets one sequence of the stage must hold (r1kit.stages.hooks.TokenBudgets)."""
    machine_problems: Callable[[Any, Machine], list[str]] = lambda stage, machine: []
    """What this machine (r1kit.hardware.Machine: a CUDA GPU or not, the run's processes, their
    launcher) lacks for the stage, one line each."""
    servers: Callable[[Any, ModelRef | None], list[str]] = lambda stage, start: []
    """The running servers the stage names that do not answer as the recipe says, one line each
    (asked before anything loads, by ``validate --here`` and ``run``); `start` is the model the
    stage starts from, as the recipe names it (None: written by an earlier stage during the run;
    r1kit.recipe.starting_models)."""
    bf16: Callable[[Any], dict[str, bool]] = lambda stage: {}
    """The stage's settings that ask for bfloat16 (key: asked), for r1kit.hardware.precision."""
    local_check: Callable[[Any, dict[str, tuple[str, Callable]]], None] | None = None
    """Checks that read the tokenizers of the models the stage names, where they are known before
    the run: a local folder's, the tiny model's (key: (what names it, a function loading it);
    ``model`` is the model the stage starts from, whose tokenizer training does not change)."""
    plots_rl: bool = False
    """The stage logs RL figures per step (metrics.jsonl): the report plots them and tabulates tool calls."""
    hands_on: bool = True
    """The model the stage writes is the next stage's to start from; False (a reward model): later
    stages only name it (by the stage's name, r1kit.stages.served_rewards)."""


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
    processes: World = World()
    """This process's place among the run's processes (one, outside a distributed run); every
    process runs every stage."""
    barrier: Callable[[], None] = field(default_factory=lambda: alone, repr=False)
    """Waits until every process of the run has called it (with no timeout that a long stage
    could reach); stages that share work among processes meet here before merging it."""

    @property
    def is_main(self) -> bool:
        """False on the non-main processes of a distributed run: they must not write reports."""
        return self.processes.is_main

    @property
    def rank(self) -> int:
        """This process's rank in the run (0 in a single process)."""
        return self.processes.rank

    @property
    def world(self) -> int:
        """The number of processes of the run."""
        return self.processes.world

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


def check_prompting(stage, no_rewards: str | None) -> None:
    """Refuse a prompting stage's (r1kit.config.PromptStageConfig) empty or unknown rewards list
    (`no_rewards` says why one is needed; None: none is) and an unknown template."""
    from r1kit import data as data_lib, reward_registry, templates
    from r1kit.errors import RecipeError

    if not stage.rewards and no_rewards:
        raise RecipeError(f"{stage.name}.rewards: {no_rewards}")
    for i, reward in enumerate(reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")):
        needed = [c for c in reward.columns() if c != "prompt"]  # the rendered prompt reaches every reward
        if needed and (lacking := data_lib.columns_lacking(stage.data, needed)):
            raise RecipeError(f"{stage.name}.rewards[{i}]: reward {reward.name!r} reads column {lacking[0]!r}, which the rows of "
                              f"{stage.data.source} lack; they have: {', '.join(lacking[1])} (set the reward's column parameter, "
                              "or rename a column in the data: section)")
    problem = templates.check(stage.template)
    if problem:
        raise RecipeError(f"{stage.name}.template: {problem}")
