"""The run report: one markdown page and a few plots for a finished (or partly finished) run.

    output_dir/report.md          stages with wall time and trained parameters; accuracy after
                                  each evaluated stage (with tools: calls per sample and pass@1
                                  with and without a call); the share of each grpo stage's wall
                                  time spent in its rewards; the tool-call rate over RL steps
                                  and, per grpo stage, accuracy, length, the reflection share and
                                  format/language failures from first to last step, with the step
                                  where accuracy and length rise together (R1-Zero's signature)
    output_dir/plots/<stage>.png  reward, per-reward means (reflection among them when logged),
                                  completion length (and the share of rollouts calling a tool) over
                                  RL steps, the rise marked
    output_dir/plots/rewards_by_stage.png
                                  each reward that several RL stages logged, a line per stage

`write_report(recipe, records)` is called by `r1kit run` at the end of a run (main process only)
and prints the accuracy table; it reads only what the stages left in the run folder (markers,
metrics.jsonl), so it can be re-made at any time.

Not here: the figures themselves (stages compute them; r1kit.evaluation.evaluate defines pass@1 and cons@k).
"""

from __future__ import annotations

from pathlib import Path

from r1kit.files import write_atomic
from r1kit.trainers.training import read_metrics


def _source_stage(model: str, records: dict[str, dict]) -> str:
    """Which stage produced `model` ("start" for the recipe's own model)."""
    for name, record in records.items():
        if record.get("model") and record["model"] == model:
            return name
    return "start"


def accuracy_rows(records: dict[str, dict]) -> list[dict]:
    """One row per (eval stage, benchmark): the evaluated stage and its figures."""
    rows = []
    for name, record in records.items():
        metrics = record.get("metrics", {})
        found = list(dict.fromkeys(key.split("/")[0] for key in metrics if key.endswith("/pass@1")))
        listed = _listed(record)  # in the stage's order: a record read back from DONE.json has its keys sorted
        benches = sorted(found, key=lambda b: listed.index(b) if b in listed else len(listed))
        for bench in benches:
            figures = {key.split("/", 1)[1]: value for key, value in metrics.items() if key.startswith(bench + "/")}
            rows.append({"eval": name, "model": _source_stage(record["input_model"], records), "benchmark": bench, **figures,
                         "protocol": _protocol((record.get("config") or {}).get("stage", {}), figures.get("domain"))})
    return rows


def _protocol(stage: dict, domain: str | None = None) -> str:
    """How an eval stage sampled and read a benchmark of `domain`, in one line, from its config
    (in the evaluator's phrasing)."""
    from r1kit.evaluation.evaluate import sampling_phrase

    if not stage:
        return "?"
    served = stage.get("endpoint") or {}
    phrase = sampling_phrase({**stage, "served_model": served.get("name") or "the stage's model", "chat": served.get("chat"),
                              "endpoint": served.get("url")})
    limit = f", the first {stage['limit']} problems only (limit)" if stage.get("limit") is not None else ""
    shuffled = f", choices shuffled with seed {stage.get('choice_seed', 0)}" if domain in ("choice", "mixed") else ""
    return phrase + shuffled + limit


def _listed(record: dict) -> list[str]:
    """The names of the benchmarks an eval stage's record lists, in its order."""
    from r1kit.errors import EvalError
    from r1kit.evaluation.benchmarks import benchmark_name

    names = []
    for source in (record.get("config") or {}).get("stage", {}).get("benchmarks", []):
        try:
            names.append(benchmark_name(source))
        except EvalError:
            pass
    return names


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def accuracy_table(rows: list[dict]) -> str:
    if not rows:
        return "(no eval stages)"
    cons = list(dict.fromkeys(k for row in rows for k in row if k.startswith("cons@")))  # one column per k the stages used
    tools = ["tool_calls", "tool_call_share", "pass@1_with_tool", "pass@1_without_tool"] if any("tool_calls" in r for r in rows) else []
    judged = ["judged", "judge_agreement"] if any("judged" in r for r in rows) else []  # r1kit.evaluation.judged
    twice = len({(r["model"], r["benchmark"]) for r in rows}) < len(rows)  # a model evaluated by several stages: name them
    cols = [*(["eval"] if twice else []), "model", "benchmark", "domain", "pass@1", *cons, "mean_tokens", "truncated", *tools, *judged]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c)) if c in tools or c in judged else _fmt(row.get(c, "")) for c in cols) + " |")
    note = "\n\ntool_calls: tool calls per sample (- where the eval ran without tools); pass@1 over the samples with and without a call." if tools else ""
    if judged:
        note += "\n\njudged: the judge's pass@1 (- where the eval had no judge); judge_agreement: the share of samples where judge and verifier agree."
    ways = dict.fromkeys((r["eval"], r.get("protocol", "?")) for r in rows)
    measured = "\n".join(f"{name}: {way}" for name, way in ways)
    return "\n".join(lines) + note + "\n\nMeasured with:\n" + measured


def pass_at_1_table(rows: list[dict]) -> str:
    """pass@1 after each evaluated stage, one column per benchmark (and so per domain)."""
    benches = list(dict.fromkeys(f"{r['benchmark']} ({r.get('domain', '?')})" for r in rows))
    by_eval: dict[str, dict] = {}
    for r in rows:
        by_eval.setdefault(r["eval"], {"model": r["model"]})[f"{r['benchmark']} ({r.get('domain', '?')})"] = r.get("pass@1")
    lines = ["| model | " + " | ".join(benches) + " |", "|" + "---|" * (len(benches) + 1)]
    for cells in by_eval.values():
        lines.append("| " + " | ".join(_fmt(cells.get(c, "")) for c in ["model", *benches]) + " |")
    return "\n".join(lines)


def stage_table(recipe, records: dict[str, dict]) -> str:
    """Each stage's wall time, and the parameters a training stage trained (LoRA: the adapter's)."""
    lines = ["| stage | kind | trained parameters | wall time (s) |", "|---|---|---|---|"]
    for stage in recipe.stages:
        record = records.get(stage.name)
        if not record:
            lines.append(f"| {stage.name} | {stage.kind} | | not run |")
            continue
        metrics = record["metrics"]
        sizes = f"{metrics['trainable_params']:,} of {metrics['total_params']:,}" if "trainable_params" in metrics else "-"
        lines.append(f"| {stage.name} | {stage.kind} | {sizes} | {record['wall_s']:.1f} |")
    total = sum(r["wall_s"] for r in records.values())
    lines.append(f"| **total** | | | {total:.1f} |")
    return "\n".join(lines)


def trainer_paths_table(recipe, records: dict[str, dict]) -> str | None:
    """Per training stage, which of r1kit's paths through TRL's trainer were taken ("on") and why
    not where not (r1kit.trainers.trl_overrides); None when no stage recorded them."""
    lines = ["| stage | path | taken |", "|---|---|---|"]
    for stage in recipe.stages:
        paths = records.get(stage.name, {}).get("metrics", {}).get("trainer_paths", {})
        lines += [f"| {stage.name} | {name} | {taken} |" for name, taken in paths.items()]
    return "\n".join(lines) if len(lines) > 2 else None


def reward_time_table(recipe, records: dict[str, dict]) -> str | None:
    """Per RL stage: seconds in the reward functions (all calls), their share of the stage's wall
    time, and the seconds of each reward; None when no stage recorded reward seconds."""
    lines = ["| stage | reward time (s) | share of stage wall time | by reward (s) |", "|---|---|---|---|"]
    for stage in recipe.stages:
        record = records.get(stage.name)
        if not record or "reward_seconds" not in record["metrics"]:
            continue  # not an RL stage, or not run
        metrics = record["metrics"]
        by_reward = ", ".join(
            f"{key.removeprefix('reward_seconds/')} {value:.2f}" for key, value in metrics.items() if key.startswith("reward_seconds/")
        )
        share = metrics["reward_seconds"] / record["wall_s"]
        lines.append(f"| {stage.name} | {metrics['reward_seconds']:.2f} | {share:.1%} | {by_reward} |")
    return "\n".join(lines) if len(lines) > 2 else None


ASYNC_COLUMNS = [("staleness_mean", "staleness mean", "{:.2f}"), ("staleness_max", "max", "{:.0f}"), ("dropped_share", "dropped", "{:.1%}"),
                 ("dropped_samples", "dropped samples", "{:.0f}"),
                 ("ratio_min", "ratio min", "{:.3g}"), ("ratio_max", "ratio max", "{:.3g}"), ("corrected_share", "clipped or truncated", "{:.2%}"),
                 ("trainer_wait_seconds", "trainer waited (s)", "{:.1f}"), ("generator_wait_seconds", "generator waited (s)", "{:.1f}")]


def async_table(recipe, records: dict[str, dict]) -> str | None:
    """Per asynchronous GRPO stage: how stale its samples were, how far the importance ratio went
    and what share of tokens the correction clipped, and how long each side waited for the other;
    None without such stages."""
    lines = ["| stage | " + " | ".join(title for _, title, _ in ASYNC_COLUMNS) + " |", "|---" * (len(ASYNC_COLUMNS) + 1) + "|"]
    for stage in recipe.stages:
        metrics = records.get(stage.name, {}).get("metrics", {})
        if "staleness_mean" in metrics:
            cells = [form.format(metrics[key]) if key in metrics else "-" for key, _, form in ASYNC_COLUMNS]
            lines.append(f"| {stage.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else None


def plots_rl(stage) -> bool:
    """Whether the stage's kind logs RL figures per step (r1kit.stages.base.StageKind.plots_rl)."""
    from r1kit import stages

    return stages.get(stage.kind).plots_rl


def rl_records(out: Path, stage, key: str) -> list[dict]:
    """The logged steps of RL stage `stage` that carry `key` (none for other stages or no log)."""
    path = out / stage.name / "metrics.jsonl"
    if not plots_rl(stage) or not path.exists():
        return []
    return [r for r in read_metrics(path) if key in r]


def tool_table(recipe, out: Path) -> str | None:
    """Per RL stage with tools: the share of rollouts that called a tool and the calls per rollout
    at the first and last logged steps, errors per call over the stage; None without such stages."""
    lines = ["| stage | call share (first → last step) | calls per rollout (first → last) | errors per call | sandbox s |", "|---|---|---|---|---|"]
    for stage in recipe.stages:
        records = rl_records(out, stage, "tools/call_share")
        if not records:
            continue
        first, last = records[0], records[-1]
        errors = sum(r["tools/error_share"] for r in records) / len(records)
        seconds = sum(r["tools/sandbox_seconds"] for r in records)
        lines.append(f"| {stage.name} | {first['tools/call_share']:.3f} → {last['tools/call_share']:.3f} | "
                     f"{first['tools/calls_per_rollout']:.2f} → {last['tools/calls_per_rollout']:.2f} | {errors:.3f} | {seconds:.1f} |")
    return "\n".join(lines) if len(lines) > 2 else None


ACCURACY = ("math_accuracy", "code_tests", "multiple_choice", "reasoning_gym")  # the verifiers whose mean is "accuracy"
WINDOW = 5  # logged steps averaged at the start, at the end, and around each step


def _accuracy_key(record: dict) -> str:
    return next((f"rewards/{n}/mean" for n in ACCURACY if f"rewards/{n}/mean" in record), "reward")


def _smooth(values: list[float]) -> list[float]:
    """Each value averaged with up to WINDOW - 1 values before it."""
    return [sum(values[max(0, i - WINDOW + 1) : i + 1]) / len(values[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(values))]


def rise_together(records: list[dict]) -> int | None:
    """The step from which accuracy and mean completion length have both made half their rise (start:
    mean of the first WINDOW logged steps, end: of the last WINDOW, each step smoothed over WINDOW),
    when accuracy rose by at least 0.05 and length by at least a quarter; else None."""
    records = [r for r in records if "completions/mean_length" in r]
    if len(records) < 2 * WINDOW:
        return None
    key = _accuracy_key(records[0])
    series = [[r[key] for r in records], [r["completions/mean_length"] for r in records]]
    ends = [(sum(v[:WINDOW]) / WINDOW, sum(v[-WINDOW:]) / WINDOW) for v in series]
    (a0, a1), (l0, l1) = ends
    if a1 - a0 < 0.05 or l1 < 1.25 * l0:
        return None
    smooth = [_smooth(v) for v in series]
    for i, record in enumerate(records):
        if all(sm[i] >= start + (end - start) / 2 for sm, (start, end) in zip(smooth, ends)):
            return record["step"]
    return None


def _span(records: list[dict], key: str, fail: bool) -> str:
    """`key`'s mean over the first WINDOW and the last WINDOW records ("-" if never logged); with
    `fail`, of 1 - the value (a failure rate)."""
    values = [r[key] for r in records if r.get(key) is not None]
    if not values:
        return "-"
    first, last = (sum(v) / len(v) for v in (values[:WINDOW], values[-WINDOW:]))
    if fail:
        first, last = 1 - first, 1 - last
    digits = 1 if key.startswith("completions/") else 3
    return f"{first:.{digits}f} → {last:.{digits}f}"


def trend_table(recipe, out: Path) -> str | None:
    """Per RL stage, what a reasoning-RL user watches, first → last logged step (each the mean of
    WINDOW steps): accuracy, mean length, the reflection share, format and language failures, and
    the step where accuracy and length rise together."""
    lines = ["| stage | accuracy | mean length (tokens) | reflection | format failures | language failures | rise together at step |",
             "|---|---|---|---|---|---|---|"]
    for stage in recipe.stages:
        records = rl_records(out, stage, "completions/mean_length")
        if not records:
            continue

        rise = rise_together(records)
        spans = [_span(records, key, fail) for key, fail in [(_accuracy_key(records[0]), False), ("completions/mean_length", False),
                 ("rewards/reflection/mean", False), ("rewards/format/mean", True), ("rewards/language_consistency/mean", True)]]
        lines.append(f"| {stage.name} | {' | '.join(spans)} | {rise if rise is not None else 'no'} |")
    return "\n".join(lines) if len(lines) > 2 else None


def plot_rl(metrics_file: Path, out: Path) -> bool:
    """Reward, per-reward means and completion length over steps; False when nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in read_metrics(metrics_file) if "reward" in r] if metrics_file.exists() else []
    if not records:
        return False
    steps = [r["step"] for r in records]
    tools = "tools/call_share" in records[0]
    fig, axes = plt.subplots(1, 4 if tools else 3, figsize=(17 if tools else 13, 3.6))
    axes[0].plot(steps, [r["reward"] for r in records])
    axes[0].set_title("total reward")
    for key in sorted(k for k in records[0] if k.startswith("rewards/") and k.endswith("/mean")):
        axes[1].plot(steps, [r.get(key) for r in records], label=key.split("/")[1])
    axes[1].set_title("reward by verifier (mean)")
    axes[1].legend(fontsize=8)
    for key, label, alpha in [("completions/mean_length", "mean", 1.0), ("completions/max_length", "max", 0.6)]:
        if any(key in r for r in records):  # TRL's asynchronous trainer logs them in windows where rollouts ended
            axes[2].plot(steps, [r.get(key, float("nan")) for r in records], label=label, alpha=alpha)
    axes[2].set_title("completion length (tokens)")
    axes[2].legend(fontsize=8)
    rise = rise_together(records)
    if rise is not None:
        for ax in axes[:3]:
            ax.axvline(rise, color="grey", linestyle="--", linewidth=1)
        axes[2].annotate("accuracy and length rise together", (rise, 0.02), xycoords=("data", "axes fraction"), fontsize=7, color="grey")
    lag = [r.get("async/staleness") for r in records]
    if any(v is not None for v in lag):  # asynchronous rollouts: the policy lag of each step's samples
        twin = axes[0].twinx()
        twin.step(steps, lag, where="mid", color="tab:red", alpha=0.5, linewidth=1)
        twin.set_ylabel("policy lag (steps)", color="tab:red", fontsize=8)
        twin.set_ylim(0, max(v or 0 for v in lag) + 1)
    if tools:
        axes[3].plot(steps, [r["tools/call_share"] for r in records])
        axes[3].set_ylim(0, 1.05)
        axes[3].set_title("share of rollouts calling a tool")
    return _saved(fig, axes, out)


def _saved(fig, axes, path: Path) -> bool:
    """Label the step axes, save `fig` to `path` and close it: True."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def plot_rewards_by_stage(recipe, out: Path, path: Path) -> bool:
    """One panel per reward that two or more RL stages logged (``rewards/NAME/mean``), a line per
    stage over its steps: a learned reward beside the verifier's, in runs trained on either; False
    when fewer than two stages share one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {stage.name: rl_records(out, stage, "reward") for stage in recipe.stages}
    runs = {name: records for name, records in runs.items() if records}
    keys = sorted({k for records in runs.values() for k in records[0] if k.startswith("rewards/") and k.endswith("/mean")})
    shared = [k for k in keys if sum(k in records[0] for records in runs.values()) >= 2]
    if not shared:
        return False
    fig, axes = plt.subplots(1, len(shared), figsize=(5.5 * len(shared), 3.6), squeeze=False)
    for ax, key in zip(axes[0], shared):
        for name, records in runs.items():
            if key in records[0]:
                ax.plot([r["step"] for r in records], [r.get(key) for r in records], label=name)
        ax.set_title(f"{key.split('/')[1]} (mean per step)")
        ax.legend(fontsize=8)
    return _saved(fig, axes[0], path)


def write_report(recipe, records: dict[str, dict]) -> Path:
    out = Path(recipe.output_dir)
    rows = accuracy_rows(records)
    parts = [f"# r1kit run report: {Path(recipe.source).name}", "", f"Run folder: `{out}` · seed {recipe.seed} · model `{recipe.model}`", ""]
    parts += ["## Accuracy after each stage", "", accuracy_table(rows), ""]
    if len({r["benchmark"] for r in rows}) > 1:
        parts += ["## pass@1 by benchmark", "", pass_at_1_table(rows), ""]
    parts += ["## Stages", "", stage_table(recipe, records), ""]
    paths = trainer_paths_table(recipe, records)
    if paths:
        parts += ["## Trainer paths", "", "Where r1kit's code stood in for TRL's in each training stage, and why not where not.", "", paths, ""]
    rewards = reward_time_table(recipe, records)
    if rewards:
        parts += ["## Reward time", "", "Seconds the reward functions took (main process), against the stage's wall time.", "", rewards, ""]
    lag = async_table(recipe, records)
    if lag:
        parts += ["## Asynchronous rollouts", "", ("Samples drawn ahead of training: their staleness in optimizer steps, the share dropped as "
                  "too old, the importance ratio's range, the share of tokens its correction clipped or truncated, and the seconds "
                  "each side waited for the other. The RL plot marks each step's policy lag."), "", lag, ""]
    tools = tool_table(recipe, out)
    if tools:
        parts += ["## Tool calls in RL", "", "Logged per step (metrics.jsonl); the model's own tokens only are trained.", "", tools, ""]
    trends = trend_table(recipe, out)
    if trends:
        parts += ["## What RL changed", "", (f"First → last logged step, each the mean of {WINDOW} steps; failures are 1 - the reward's mean. "
                  "The dashed line in the plots marks where accuracy and length have both made half their rise."), "", trends, ""]
    for stage in recipe.stages:
        if plots_rl(stage) and plot_rl(out / stage.name / "metrics.jsonl", out / "plots" / f"{stage.name}.png"):
            parts += [f"## RL curves: {stage.name}", "", f"![{stage.name}](plots/{stage.name}.png)", ""]
    if plot_rewards_by_stage(recipe, out, out / "plots" / "rewards_by_stage.png"):
        parts += ["## Rewards by RL stage", "", ("Each reward that several RL stages logged, per step, one line a stage (a reward of "
                  "weight 0 is logged and not trained on)."), "", "![rewards by stage](plots/rewards_by_stage.png)", ""]
    report = out / "report.md"
    write_atomic(report, "\n".join(parts))
    return report
