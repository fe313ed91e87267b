"""reasoning-gym's procedural tasks as r1kit rows, scored by each task's own scorer (offline).

    data: {source: "reasoning_gym:chain_sum", task: {size: 500, min_terms: 2, max_terms: 3}}
    rewards: [{name: reasoning_gym}]
    r1kit eval --model M --benchmark reasoning_gym:chain_sum --task-arg size=50 --output evals/chain_sum

reasoning-gym (``pip install 'r1kit[environments]'``) generates each of its tasks from a config:
entry i of a dataset is a pure function of the task's name, ``size``, ``seed``, its own config
keys and i. `rows(name, task, seed=...)` turns one such dataset into r1kit rows: ``id``,
``prompt`` (the question), ``answer`` (the reference answer) and ``reasoning_gym``, a compact JSON
string ``{"name", "config", "index"}`` from which `score` rebuilds the same dataset and entry to
ask the task's scorer (``score_answer``: partial credit on some tasks; a few read the dataset's
config, which is why the whole config travels with the row). `task` holds ``size`` (default
100), ``seed`` (default: the caller's) and the task's config keys; ``reasoning_gym:composite``
takes ``datasets: [{name, weight, config}]`` as reasoning-gym's composite does and scores a row by
the task it came from.

Seeds: training data draws from the recipe's seed (42 by default) and benchmarks from `EVAL_SEED`,
unless ``seed`` is given; different seeds give different problem sequences, but a small task
space (sums of two one-digit numbers) repeats problems whatever the seed.

What it does not do: it adds no answer format to the question (the stage's template asks for the
``<answer>`` block the reward reads) and judges nothing itself: a task's scorer, lenient or strict,
is reasoning-gym's. The reward is r1kit.rewards.reasoning_gym; the benchmarks are
r1kit.evaluation.benchmarks'.
"""

from __future__ import annotations

import dataclasses
import functools
import json

from r1kit.errors import DataError, suggest

PREFIX = "reasoning_gym:"
SIZE = 100
"""Rows of a task whose ``size`` is not given."""
EVAL_SEED = 1
"""The seed of a benchmark's problems when its task arguments give none (training data draws from
the recipe's seed)."""


def _gym():
    try:
        import reasoning_gym
    except ImportError:
        raise DataError("reasoning_gym: tasks need the reasoning-gym package: pip install 'r1kit[environments]'") from None
    return reasoning_gym


def _keys(name: str, config: dict, where: str) -> None:
    """An unknown task `name` or a key its config class lacks is one DataError naming `where`."""
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise DataError(f"{where}: unknown reasoning-gym task {name!r}{suggest(name, list(DATASETS))}; tasks: {', '.join(sorted(DATASETS))}")
    taken = [f.name for f in dataclasses.fields(DATASETS[name][1])]
    for key in config:
        if key not in taken:
            raise DataError(f"{where}: {key!r} is no setting of reasoning-gym's {name}{suggest(key, taken)}; it takes {', '.join(taken)}")
    if name == "composite":
        parts = config.get("datasets")
        if not isinstance(parts, list) or not parts:
            raise DataError(f"{where}: datasets: list the tasks to mix, each {{name: NAME, weight: W, config: {{...}}}}")
        for i, part in enumerate(parts):
            if not isinstance(part, dict) or set(part) - {"name", "weight", "config"} or not isinstance(part.get("name"), str) \
                    or not isinstance(part.get("config", {}), dict):
                raise DataError(f"{where}: datasets[{i}]: a mapping of name, weight and config, got {part!r:.80}")
            _keys(part["name"], part.get("config") or {}, f"{where}: datasets[{i}]")


def config(name: str, task: dict, seed: int) -> dict:
    """Every setting that decides the problems of task `name` (``size``, ``seed``, then the task's
    own keys as given), checked against the task; `seed` where `task` gives none."""
    _gym()
    full = {"size": SIZE, "seed": seed, **task}
    _keys(name, full, PREFIX + name)
    for key in ("size", "seed"):
        value = full[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "size" else 0):
            raise DataError(f"{PREFIX}{name}: {key} must be a whole number of at least {1 if key == 'size' else 0}, got {value!r}")
    try:
        return json.loads(json.dumps(full))  # as the rows carry it: tuples become lists on both sides
    except TypeError as exc:
        raise DataError(f"{PREFIX}{name}: task settings must be plain YAML values ({exc})") from None


def _create(name: str, settings: dict):
    """reasoning-gym's dataset of `settings` (as `config` returns them); its own refusal of a value
    is one DataError."""
    gym = _gym()
    if name == "composite":
        from reasoning_gym.composite import DatasetSpec

        settings = {**settings, "datasets": [DatasetSpec(p["name"], p.get("weight", 1.0), p.get("config") or {}) for p in settings["datasets"]]}
    try:
        return gym.create_dataset(name, **settings)
    except (AssertionError, ValueError, TypeError, KeyError) as exc:  # reasoning-gym checks its configs with assert
        raise DataError(f"{PREFIX}{name}: reasoning-gym refuses these settings: {exc or type(exc).__name__}") from None


def rows(name: str, task: dict, *, seed: int) -> list[dict]:
    """The rows of ``reasoning_gym:NAME`` with `task`'s settings (see the module docstring)."""
    settings = config(name, task, seed)
    ds = _create(name, settings)
    out = []
    for i in range(settings["size"]):
        entry = ds[i]
        meta = json.dumps({"name": name, "config": settings, "index": i}, separators=(",", ":"), sort_keys=True)
        answer = entry["answer"]
        out.append({"id": f"{name}-{i}", "prompt": str(entry["question"]), "answer": None if answer is None else str(answer), "reasoning_gym": meta})
    return out


def extract(completion: str) -> str | None:
    """reasoning-gym's reading of a completion's answer: its last ``<answer>`` block, stripped."""
    _gym()
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


@functools.lru_cache(maxsize=64)
def _dataset(name: str, settings: str):
    return _create(name, json.loads(settings))


@functools.lru_cache(maxsize=4096)
def _entry(meta: str):
    """The dataset and entry a row's ``reasoning_gym`` string names, built once per dataset."""
    row = json.loads(meta)
    ds = _dataset(row["name"], json.dumps(row["config"], sort_keys=True))
    return ds, ds[row["index"]]


def score(answers: list[str | None], metas: list[str]) -> list[float]:
    """Each answer's score by its row's task (`metas`: the rows' ``reasoning_gym`` strings);
    None is no answer."""
    out = []
    for answer, meta in zip(answers, metas, strict=True):
        ds, entry = _entry(meta)
        out.append(float(ds.score_answer(answer, entry)))
    return out
