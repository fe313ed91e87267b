"""Reading a recipe file: YAML, overrides, then every stage checked by its own kind.

    from r1kit.recipe import load_recipe
    recipe = load_recipe("recipes/demo.yaml", ["rl.trainer.learning_rate=1e-6"])

The stage registry (r1kit.stages) gives each ``kind:`` its config dataclass, its trainer
library's config class for the ``trainer:`` block, and its own checks; r1kit.config gives the
strict conversion. A stage may use only earlier stages' models and datasets. Errors are
`RecipeError` with one line ``FILE: key.path: what is wrong``.

This module reads and checks; it runs nothing, writes nothing and leaves the process as it found
it (``sys.path`` included).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from r1kit import stages as stage_registry
from r1kit.config import Recipe, StageConfig, apply_overrides, check_trainer_block, from_dict, parse_yaml
from r1kit.errors import RecipeError, suggest
from r1kit.hardware import World
from r1kit.models import ModelRef


def load_recipe(path: str | Path, overrides: list[str] = (), world: World | None = None) -> Recipe:
    """Read, override and check a recipe file. Raises RecipeError with a one-line message.
    `world`: the run's processes, as the trainer configs are checked (default: as the launcher's
    environment says). A ``module:function`` reward beside the recipe imports when the command
    has put the recipe's folder on ``sys.path`` (r1kit.reward_registry.add_plugin_folders)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte {exc.start}); save the recipe as UTF-8") from None
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe is a mapping with model, output_dir and stages")
    try:
        raw = apply_overrides(raw, list(overrides))
        recipe = _build(raw, stage_registry, world or World.from_env())
    except RecipeError as exc:
        raise RecipeError(f"{path}: {exc}") from None
    recipe.source = str(path)
    return recipe


def _build(raw: dict, stage_registry, world: World) -> Recipe:
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise RecipeError("stages: expected a non-empty list of stages")
    stages, seen = [], set()
    for i, s in enumerate(stages_raw):
        if not isinstance(s, dict):
            raise RecipeError(f"stages[{i}]: expected a mapping with name and kind")
        name = s.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise RecipeError(f"stages[{i}].name: expected a name of letters, digits, '_' or '-', got {name!r}")
        if name in seen:
            raise RecipeError(f"stages[{i}].name: duplicate stage name {name!r}")
        seen.add(name)
        kind = s.get("kind")
        kinds = stage_registry.kinds()
        if kind is None:
            typo = [k for k in map(str, s) if k != "kind" and suggest(k, ["kind"])]
            hint = f"; is {typo[0]!r} a typo of 'kind'?" if typo else ""
            raise RecipeError(f"{name}: each stage needs a kind: one of {', '.join(kinds)}{hint}")
        if kind not in kinds:
            raise RecipeError(f"{name}.kind: unknown stage kind {kind!r}{suggest(str(kind), kinds)}; allowed: {', '.join(kinds)}")
        spec = stage_registry.get(kind)
        stage = from_dict(spec.config, s, name)
        if spec.trainer_config is not None:
            stage.trainer = check_trainer_block(spec.trainer_config(stage), s.get("trainer"), f"{name}.trainer")
        if spec.check is not None:
            spec.check(stage)
        _check_limits(stage, spec.data(stage))
        stages.append(stage)
    top = {k: v for k, v in raw.items() if k != "stages"}
    top["stages"] = []
    recipe = from_dict(Recipe, top, "")
    recipe.stages = stages
    for stage in stages:
        spec = stage_registry.get(stage.kind)
        if spec.trainer_config is not None:
            check_trainer_config(spec, stage, recipe, world)
    earlier: set[str] = set()
    for stage in stages:
        for ref_where, ref in _stage_refs(stage, stage_registry.get(stage.kind)):
            if ref in seen and ref not in earlier:
                raise RecipeError(f"{stage.name}.{ref_where}: stage {ref!r} runs after {stage.name!r}; a stage can only use earlier stages")
        earlier.add(stage.name)
    _check_tiny(recipe)
    _check_sources(recipe, seen, stage_registry)
    _check_lengths(recipe, stage_registry)
    return recipe


def context_length(source: str, recipe: Recipe) -> tuple[int, str] | None:
    """The model's context in tokens and where it was read, when known without loading
    anything: the tiny model's own setting, or ``max_position_embeddings`` in a local folder's
    config.json. Hub ids and GGUF files are not looked up (None)."""
    import json

    ref = ModelRef.parse(source)
    if ref.form == "tiny" and not ref.name:
        import inspect

        from r1kit.offline.tiny import build_tiny_model

        default = inspect.signature(build_tiny_model).parameters["max_position_embeddings"].default
        return int(recipe.tiny_model.get("max_position_embeddings", default)), "the tiny model's max_position_embeddings"
    config = Path(source).expanduser() / "config.json"
    if ref.form != "folder" or not config.is_file():
        return None
    try:
        fields = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    value = fields.get("max_position_embeddings")
    if fields.get("rope_scaling") or (fields.get("rope_parameters") or {}).get("factor"):
        return None  # scaled positions: vLLM and the model extend the context beyond this figure
    return (int(value), f"max_position_embeddings in {config}") if isinstance(value, int) else None


def _budgets(stage, budgets) -> list[tuple[str, int, str]]:
    """(key, tokens, what) for each token budget the stage kind reports (r1kit.stages.hooks.TokenBudgets)
    that one sequence must hold; a completion budget at or above vLLM's sequence limit is refused."""
    if budgets is None:
        return []
    out = []
    if isinstance(budgets.completion, int):
        out.append((budgets.completion_key, budgets.completion, "completion"))
    if isinstance(budgets.limit, int):
        out.append((budgets.limit_key, budgets.limit, "vLLM sequence"))
        if isinstance(budgets.completion, int) and budgets.completion >= budgets.limit and budgets.vllm:
            raise RecipeError(
                f"{stage.name}.{budgets.completion_key}: {budgets.completion} tokens leave no room for the prompt in "
                f"{budgets.limit_key} {budgets.limit}; vLLM would stop every completion early"
            )
    return out


def _check_lengths(recipe: Recipe, stage_registry) -> None:
    """Token budgets that cannot fit: a completion budget at or above vLLM's sequence limit, and,
    where the model's context is known without loading it (`context_length`), a budget above it.
    Each stage's model derives from the recipe's model or the folder or stage it names."""
    start: dict[str, str] = {}
    current = recipe.model
    for stage in recipe.stages:
        source = start.get(stage.model, stage.model) if stage.model else current
        start[stage.name] = current = source
        budgets = _budgets(stage, stage_registry.get(stage.kind).budgets(stage))
        known = context_length(source, recipe)
        if known is None:
            continue
        context, where = known
        for key, tokens, what in budgets:
            if tokens > context:
                raise RecipeError(
                    f"{stage.name}.{key}: a {tokens}-token {what} does not fit the model's context of {context} tokens ({where})"
                )


def _check_tiny(recipe: Recipe) -> None:
    """tiny_model and every tiny_models entry take only r1kit.offline.tiny.build_tiny_model's
    arguments (whole numbers of at least 1; true or false where its default is), in a shape it
    builds (r1kit.offline.tiny.shape_problem)."""
    import inspect

    from r1kit.offline.tiny import build_tiny_model, shape_problem

    defaults = {k: p.default for k, p in inspect.signature(build_tiny_model).parameters.items() if k not in ("out_dir", "seed")}
    allowed = list(defaults)
    for where, args in [("tiny_model", recipe.tiny_model), *((f"tiny_models.{n}", a) for n, a in recipe.tiny_models.items())]:
        for key, value in args.items():
            if key not in allowed:
                raise RecipeError(f"{where}: unknown key {key!r}{suggest(key, allowed)}; allowed: {', '.join(allowed)}")
            if isinstance(defaults[key], bool):
                if not isinstance(value, bool):
                    raise RecipeError(f"{where}.{key}: expected true or false, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RecipeError(f"{where}.{key}: expected a whole number of at least 1, got {value!r}")
        if problem := shape_problem(**{**defaults, **args}):
            raise RecipeError(f"{where}: {problem}")


def _check_sources(recipe: Recipe, names: set[str], stage_registry) -> None:
    """What a recipe names that can be checked without loading weights or asking the network:
    local files and model folders exist, tasks and their arguments fit their generators, a near
    miss of a stage's name is not taken for a hub id, and what the stage kinds read of the
    tokenizers known before the run (`StageKind.local_check`: a distill stage's two)."""
    from r1kit.offline import tasks
    from r1kit.data import is_local
    from r1kit.errors import DataError

    ModelRef.parse(recipe.model, names).check(recipe, "model")
    origins = tokenizer_origins(recipe)
    for stage in recipe.stages:
        kind = stage_registry.get(stage.kind)
        for key, ref in kind.models(stage):
            ModelRef.parse(ref, names).check(recipe, f"{stage.name}.{key}")
        if kind.local_check:
            refs = {**{k: origins.get(r, r) for k, r in kind.models(stage)}, "model": origins[stage.name]}
            kind.local_check(stage, {k: known for k, r in refs.items() if (known := _tokenizer(recipe, ModelRef.parse(r, names)))})
        for where, section in kind.data(stage):
            source = section.source
            if source.startswith("task:"):
                try:
                    tasks.check(source[5:], section.task)
                except DataError as exc:
                    raise RecipeError(f"{stage.name}.{where}: {exc}") from None
            elif source.startswith("reasoning_gym:"):
                from r1kit.environments import reasoning_gym

                try:
                    reasoning_gym.config(source.removeprefix("reasoning_gym:"), section.task, seed=recipe.seed)
                except DataError as exc:
                    raise RecipeError(f"{stage.name}.{where}: {exc}") from None
            elif source in names:
                continue
            elif is_local(source):
                if not Path(source).is_file():
                    raise RecipeError(f"{stage.name}.{where}.source: no such file {source!r}")
            elif "/" not in source and suggest(source, sorted(names)):
                raise RecipeError(
                    f"{stage.name}.{where}.source: no stage named {source!r}{suggest(source, sorted(names))}; "
                    "a hub dataset id has the form org/name"
                )


def tokenizer_origins(recipe: Recipe) -> dict[str, str]:
    """The model whose tokenizer each stage's model has, by stage name, as the recipe names it:
    training keeps a model's tokenizer, so a stage after training has the tokenizer of the model
    the chain started from (an earlier stage's name resolved to that stage's origin)."""
    origins: dict[str, str] = {}
    current = recipe.model
    for stage in recipe.stages:
        start = stage.model or current
        origins[stage.name] = current = origins.get(start, start)
    return origins


def _tokenizer(recipe: Recipe, ref: ModelRef):
    """(what names it, a function loading it) for the tokenizer of a model known before the run: a
    local folder's, or the tiny model's (r1kit.offline.tiny.tiny_tokenizer, built from the recipe's
    arguments); None for a hub id and the rest."""
    if ref.form == "folder":
        from transformers import AutoTokenizer

        return ref.text, lambda: AutoTokenizer.from_pretrained(ref.text)
    if ref.form == "tiny":
        from r1kit.offline.tiny import tiny_tokenizer

        args = recipe.tiny_models.get(ref.name, {}) if ref.name else recipe.tiny_model
        return f"{ref.text} (built)", lambda: tiny_tokenizer(**{"seed": recipe.seed, **args})
    return None


def starting_models(recipe: Recipe) -> dict[str, str | None]:
    """The model each stage starts from, by stage name, as the recipe names it, where that is known
    before the run: its ``model:``, else the recipe's until a stage trains (r1kit.pipeline.run
    hands a training stage's model folder on), None after that."""
    starts, current = {}, recipe.model
    for stage in recipe.stages:
        starts[stage.name] = stage.model or current
        if stage_registry.get(stage.kind).trainer_config:
            current = None  # the stage trains: what comes next starts from a model not written yet
    return starts


def _check_limits(stage: StageConfig, sections) -> None:
    """A data section's ``limit`` keeps at least one row (0 or less would train on nothing)."""
    for where, section in sections:
        if section.limit is not None and section.limit < 1:
            raise RecipeError(f"{stage.name}.{where}.limit: must be at least 1 (or null for every row), got {section.limit}")


def _stage_refs(stage: StageConfig, kind):
    """What the stage names that may be an earlier stage: its models and its data sources."""
    yield from kind.models(stage)
    for where, section in kind.data(stage):
        yield f"{where}.source", section.source


def check_trainer_config(spec, stage: StageConfig, recipe: Recipe, world: World) -> None:
    """Build the trainer library's config with exactly the fields the stage will run with, so its
    own consistency checks (batch sizes, loss options, precision on this machine) run before
    any compute. Nothing heavy is loaded; `world` says whether this process must stay off the
    device (r1kit.stage_process.off_device)."""
    import contextlib

    from r1kit import stage_process
    from r1kit.trainers.training import trainer_fields

    fields, _ = trainer_fields(stage, recipe, spec.trainer_defaults(stage))
    try:
        with stage_process.hidden_world() if stage_process.off_device(world) else contextlib.nullcontext():
            spec.trainer_config(stage)(**fields)
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"{stage.name}.trainer: {' '.join(str(exc).split())}") from None
