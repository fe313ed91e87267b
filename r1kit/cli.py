"""The `r1kit` command line.

    r1kit run RECIPE [KEY=VALUE ...] [--restart-from STAGE]   run (or resume) an experiment
    r1kit validate RECIPE [KEY=VALUE ...] [--here]            check a recipe, write nothing
    r1kit tiny-model OUTDIR                                   build the offline tiny model
    r1kit rewards list                                        registered rewards and parameters
    r1kit rewards score NAME [--input F] [--output F] [--param K=V ...]
    r1kit eval --model M --benchmark B --output DIR [...]   evaluate with the R1 protocol (r1kit.evaluation.evaluate)
    r1kit eval --suite r1 --model M --output DIR [...]      a suite of benchmarks, one table (r1kit.evaluation.suite)
    r1kit eval compare DIR [DIR ...]                         evaluations side by side

Bad input (recipe, override, data, parameters) prints one line ``r1kit: error: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from r1kit import setup_logging
from r1kit.errors import EvalError, RecipeError, RewardError

log = logging.getLogger("r1kit")


def _parser() -> argparse.ArgumentParser:
    from importlib.metadata import version

    p = argparse.ArgumentParser(prog="r1kit", description="Reasoning-RL post-training: the DeepSeek-R1 recipe on TRL.")
    p.add_argument("--version", action="version", version=f"r1kit {version('r1kit')}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run or resume a recipe", description="Run a recipe's stages in order; finished stages are skipped, an interrupted one resumes.")
    run.add_argument("recipe", help="recipe YAML file")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, stages by name: rl.trainer.learning_rate=1e-6")
    run.add_argument("--restart-from", metavar="STAGE", help="redo this stage and every stage after it")
    run.add_argument("--accelerate-config", metavar="FILE", help="run under `accelerate launch` with this config (DDP, DeepSpeed, FSDP)")

    val = sub.add_parser("validate", help="check a recipe without running it", description="Load and check a recipe (and overrides); print the resolved stages.")
    val.add_argument("recipe", help="recipe YAML file")
    val.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, as for run")
    val.add_argument("--accelerate-config", metavar="FILE", help="also check this accelerate config file")
    val.add_argument("--here", action="store_true", help="also refuse what this machine lacks to run it (vLLM, a CUDA GPU, a package's model file)")

    tiny = sub.add_parser("tiny-model", help="build the offline tiny model", description="Build a tiny random Qwen2-style model and tokenizer offline.")
    tiny.add_argument("out_dir", metavar="OUTDIR", help="folder to write the model and tokenizer to")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")

    rw = sub.add_parser("rewards", help="list or try rewards", description="List registered rewards or score a jsonl file with one.")
    rsub = rw.add_subparsers(dest="rewards_command", required=True, metavar="ACTION")
    rsub.add_parser("list", help="registered rewards, their descriptions and parameters")
    score = rsub.add_parser("score", help="score completions from a jsonl file", description="Each input row is {\"completion\": str, <columns>...}; each output row adds \"reward\".")
    score.add_argument("name", help="registered reward name or module:function")
    score.add_argument("--input", default="-", help="jsonl file (default: stdin)")
    score.add_argument("--output", default="-", help="jsonl file (default: stdout)")
    score.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="reward parameter (repeatable)")
    score.add_argument("--batch-size", type=_positive_int, default=1024, help="rows per reward call (default: 1024)")

    _add_eval(sub)
    return p


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


class _Defaults(argparse.HelpFormatter):
    """Help with each flag's default, where it has one."""

    def _get_help_string(self, action):
        if action.default in (None, [], argparse.SUPPRESS) or action.option_strings == ["-h", "--help"]:
            return action.help
        return f"{action.help} (default: {action.default})"


def _add_flags(parser, cls: type, names: list[str], metavars: dict[str, str] | None = None) -> None:
    """``--name`` flags for the fields `names` of dataclass `cls`: type, choices, default and help
    all come from the field's declaration (its annotation, default and docstring)."""
    import dataclasses
    import typing

    from r1kit.config import field_docs

    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for name in names:
        flag, tp, default = "--" + name.replace("_", "-"), hints[name], defaults[name]
        if typing.get_origin(tp) is list:  # repeated: --tools python --tools my_pkg:sql
            parser.add_argument(flag, action="append", default=[], metavar="NAME", help=docs[name] + " (repeatable)")
            continue
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=docs[name])
            continue
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) is typing.Literal:
            parser.add_argument(flag, choices=options, default=default, help=docs[name])
        else:
            kind = options[0] if options else tp  # `int | None` takes ints
            parser.add_argument(flag, type=kind, default=default, metavar=(metavars or {}).get(name), help=docs[name])


def _add_eval(sub) -> None:
    """``r1kit eval`` (flags generated from the protocol's declarations) and ``r1kit eval compare``."""
    import dataclasses

    from r1kit.evaluation.benchmarks import BENCHMARKS, CHOICE_BENCHMARKS, CODE_BENCHMARKS, BenchmarkFields
    from r1kit.evaluation.evaluate import Settings
    from r1kit.sampling.base import EngineConfig

    ev = sub.add_parser(
        "eval",
        usage="r1kit eval --benchmark B --output DIR (--model M | --completions GEN.jsonl) [options]\n"
        "       r1kit eval --suite SUITE --model M --output DIR [--data NAME=FILE ...] [options]\n"
        "       r1kit eval compare DIR [DIR ...]",
        help="evaluate a model on a benchmark (DeepSeek-R1 protocol); eval compare: tables side by side",
        description="Sample k completions per problem and report pass@1, cons@k and pass@k (see r1kit.evaluation.evaluate). "
        "Defaults are the DeepSeek-R1 protocol's.",
        formatter_class=_Defaults,
        allow_abbrev=False,  # a suite takes the protocol flags given on the command line: spelled out
    )
    ev.add_argument("--benchmark", help=f"{', '.join([*BENCHMARKS, *CODE_BENCHMARKS, *CHOICE_BENCHMARKS])}, task:NAME, reasoning_gym:NAME, or a .jsonl/.json/.parquet file")
    ev.add_argument("--suite", help="a built-in suite (r1: the DeepSeek-R1 paper's table) or a suite .yaml file (r1kit.evaluation.suite); instead of --benchmark")
    ev.add_argument("--data", action="append", default=[], metavar="NAME=FILE", help="with --suite: read benchmark NAME from a local copy in its hub schema (repeatable)")
    ev.add_argument("--only", action="append", default=[], metavar="NAME", help="with --suite: run this benchmark of the suite only (repeatable)")
    ev.add_argument("--output", metavar="DIR", help="folder for settings.json, samples.jsonl and summary.json")
    ev.add_argument("--model", help="model folder or hub id to sample")
    ev.add_argument("--completions", metavar="GEN.jsonl", help="score these generations instead of sampling a model; with --suite a folder "
                    "of NAME.jsonl (or NAME/samples.jsonl) per benchmark")
    protocol = [f.name for f in dataclasses.fields(Settings) if f.name != "environment"]
    _add_flags(ev, Settings, protocol, {"samples": "K"})
    ev.add_argument("--env", "--environment", dest="environment", metavar="ENV", help="each sample an episode of this environment (r1kit.environments: "
                    "a registered name, module:Class, or a YAML mapping {name: guess, max_turns: 6}), which scores it")
    ev.add_argument("--judge", metavar="YAML", help="grade every sample with a judge too, a judged column (r1kit.evaluation.judged): the judge "
                    "reward's parameters, {url: http://127.0.0.1:8000/v1, model: judge, template: reference}")
    _add_flags(ev, EngineConfig, ["backend"])
    ev.add_argument("--endpoint", action="append", default=[], metavar="URL", help="sample a served model at this OpenAI-compatible base URL (http://host:8000/v1; repeatable: requests spread over the servers); backend endpoint")
    ev.add_argument("--served-model", metavar="NAME", help="with --endpoint: the name the server serves the model under (default: --model)")
    ev.add_argument("--concurrency", type=_positive_int, default=16, metavar="N", help="served backends: requests in flight at once")
    ev.add_argument("--api-key-env", metavar="VAR", default="", help="with --endpoint: the environment variable holding the API key")
    ev.add_argument("--chat", action="store_true", help="with --endpoint: send chat messages (/chat/completions) instead of r1kit's rendered prompt")
    _add_flags(ev, BenchmarkFields, ["limit", "id_field", "problem_field", "answer_field", "since", "until", "data_file", "choice_seed", "rating_table"],
               {"limit": "N", "since": "DAY", "until": "DAY", "data_file": "FILE", "choice_seed": "SEED", "rating_table": "FILE"})
    ev.add_argument("--task-arg", action="append", default=[], metavar="KEY=VALUE", help="argument of a task:NAME or reasoning_gym:NAME benchmark (repeatable)")
    ev.set_defaults(handler=_cmd_eval)
    esub = ev.add_subparsers(dest="eval_command", title="subcommand", metavar="compare DIR [DIR ...]", help="side-by-side table of evaluations")
    cmp = esub.add_parser("compare", usage="r1kit eval compare DIR [DIR ...]", description="One row per summary.json; a DIR without one contributes each DIR/*/summary.json.")
    cmp.add_argument("dirs", nargs="+", metavar="DIR", help="evaluation folders")
    cmp.set_defaults(handler=_cmd_compare)


def _cmd_eval(args) -> None:
    import dataclasses

    from r1kit.evaluation.benchmarks import load_benchmark
    from r1kit.config import parse_override
    from r1kit.evaluation.evaluate import Settings, check_settings, evaluate, limits, score_completions, table

    _served(args)
    if args.suite:
        if args.judge:
            raise EvalError("--judge grades one benchmark's samples: give --benchmark, not --suite")
        return _cmd_suite(args)
    if args.data:
        raise EvalError("--data NAME=FILE is for --suite; with --benchmark use --data-file FILE")
    if args.only:
        raise EvalError("--only NAME picks benchmarks of a --suite; with --benchmark name the one benchmark")
    if not args.benchmark or not args.output or bool(args.model) == bool(args.completions):
        raise EvalError("eval needs --benchmark, --output, and either --model (or --endpoint) or --completions")
    task_args = {}
    for text in args.task_arg:
        key, value = parse_override(text)
        task_args[".".join(key)] = value
    fields = {"id_field": args.id_field, "problem_field": args.problem_field, "answer_field": args.answer_field}
    window = {"since": args.since, "until": args.until}
    extra = {"data_file": args.data_file, "choice_seed": args.choice_seed, "rating_table": args.rating_table}
    bench = load_benchmark(args.benchmark, **fields, **window, limit=args.limit, task_args=task_args, environment=args.environment is not None, **extra)
    settings = Settings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)})
    judge = _judge(args.judge)
    if args.completions:
        check_settings(settings)
        if args.environment is not None:
            raise EvalError("--env plays episodes while sampling; --completions scores saved generations: drop --env")
        if args.tools:
            raise EvalError("--tools runs code while sampling; --completions scores saved generations, whose transcripts hold any tool output: drop --tools")
        summary = score_completions(bench, args.completions, args.output, args.answer_fallback, limits(settings), settings.think_prefill,
                                    limited=args.limit is not None, judge=judge)
    else:
        from r1kit.hardware import cpu

        cpu.keep_freed_memory()
        from r1kit.sampling import closing, load_sampler

        with closing(lambda: load_sampler(args.model, args.backend, endpoint=args.endpoint_config, log_dir=args.output)) as sampler:
            summary = evaluate(bench, args.output, settings, model=args.model, backend=args.backend, endpoint=args.endpoint_config, sampler=sampler,
                               judge=judge)
    print(table([summary]), end="")
    print(f"samples and summary: {args.output}")


def _judge(text: str | None):
    """The --judge flag's reward (r1kit.evaluation.judged), or None; an EvalError names what is wrong."""
    from r1kit.config import parse_yaml
    from r1kit.evaluation import judged

    if text is None:
        return None
    try:
        spec = parse_yaml(text)
        if isinstance(spec, dict) and spec.get("serve") is not None:
            raise RewardError("serve: r1kit starts a judge's server for an eval stage of a recipe; here give the url of a running one")
        return judged.load(spec)
    except RewardError as exc:
        raise EvalError(f"--judge: {exc}") from None
    except Exception as exc:  # YAML that does not parse
        raise EvalError(f"--judge: not a YAML mapping ({' '.join(str(exc).split())[:200]})") from None


def _served(args) -> None:
    """The served-model flags as `args.endpoint_config` (r1kit.sampling.base.Endpoint); --endpoint
    means backend endpoint, and --model defaults to --served-model (the tokenizer's name)."""
    from r1kit.sampling.base import Endpoint

    served = args.served_model or args.api_key_env or args.chat
    if args.endpoint:
        if args.backend not in ("auto", "endpoint"):
            raise EvalError(f"--endpoint samples a served model; it takes no --backend {args.backend}")
        if args.completions:
            raise EvalError("--endpoint samples a model; --completions scores saved ones: give one of them")
        args.backend, args.model = "endpoint", args.model or args.served_model
        if not args.model:
            raise EvalError("--endpoint needs --served-model NAME (the name the server serves) or --model (its tokenizer and name)")
    elif served:
        raise EvalError("--served-model, --api-key-env and --chat go with --endpoint URL")
    args.endpoint_config = Endpoint(url=args.endpoint, name=args.served_model or "", api_key_env=args.api_key_env,
                                    concurrency=args.concurrency, chat=args.chat)
    from r1kit.sampling import backends

    problem = backends.settings_problem(args.backend, args.endpoint_config, tools=bool(args.tools) or args.environment is not None) or args.endpoint_config.machine_problem()
    if problem:
        raise EvalError("--" + problem.replace("endpoint.url", "endpoint").replace("endpoint.api_key_env", "api-key-env").replace("endpoint.", ""))


def _cmd_suite(args) -> None:
    import dataclasses

    from r1kit.hardware import cpu
    from r1kit.evaluation.evaluate import Settings
    from r1kit.evaluation.suite import load_suite, run_suite

    from pathlib import Path

    if args.benchmark or not args.output or not (args.model or args.completions):
        raise EvalError("eval --suite needs --output and --model (or --completions DIR of saved generations), and takes no --benchmark")
    if args.completions and (args.endpoint or args.tools):
        raise EvalError("--completions scores saved generations: it takes no --endpoint or --tools")
    for name in ("id_field", "problem_field", "answer_field", "since", "until", "data_file", "task_arg"):
        if getattr(args, name):
            where = "its benchmarks' task: {KEY: VALUE}" if name == "task_arg" else "its benchmarks' entries, or use --data NAME=FILE"
            raise EvalError(f"--{name.replace('_', '-')} is per benchmark: set it in the suite file ({where})")
    data = {}
    for text in args.data:
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise EvalError(f"--data {text!r}: write NAME=FILE, e.g. --data gpqa_diamond=gpqa.jsonl")
        data[name] = path
    suite = load_suite(args.suite)
    # Protocol flags given on the command line override the suite's values for every benchmark.
    given = {a.split("=", 1)[0].removeprefix("--no-").removeprefix("--") for a in args.argv if a.startswith("--")}
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings) if f.name.replace("_", "-") in given and f.name != "seed"}
    cpu.keep_freed_memory()
    text = run_suite(suite, args.output, model=args.model or Path(args.completions).name, backend=args.backend, settings_overrides=overrides,
                     data=data, limit=args.limit, seed=args.seed, choice_seed=args.choice_seed, rating_table=args.rating_table,
                     endpoint=args.endpoint_config, only=args.only or None, completions=args.completions)
    print(text, end="")
    print(f"evaluations and table: {args.output}")


def _cmd_compare(args) -> None:
    from pathlib import Path

    from r1kit.evaluation.evaluate import table

    summaries, labels = [], []
    for d in map(Path, args.dirs):
        found = [d / "summary.json"] if (d / "summary.json").is_file() else sorted(d.glob("*/summary.json"))
        if not found:
            raise EvalError(f"{d}: no summary.json here or in its subfolders")
        for path in found:
            summaries.append(json.loads(path.read_text()))
            labels.append(str(path.parent))
    print(table(summaries, labels), end="")


def _check_accelerate_config(path: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(path)
    except (OSError, ValueError, TypeError) as exc:
        raise RecipeError(f"{path}: not a valid accelerate config: {exc}") from None


def _relaunch_under_accelerate(args) -> None:
    """Replace this process with `accelerate launch --config_file FILE -m r1kit.cli run ...`."""
    import os

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", args.accelerate_config]
    cmd += ["-m", "r1kit.cli", "run", args.recipe, *args.overrides]
    if args.restart_from:
        cmd += ["--restart-from", args.restart_from]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)


def _cmd_run(args) -> None:
    from r1kit import pipeline
    from r1kit.hardware import World, cpu
    from r1kit.recipe import load_recipe

    world = World.from_env()  # this process's place in a launch of several (accelerate, torchrun)
    recipe = load_recipe(args.recipe, args.overrides, world)
    if args.accelerate_config:
        _check_accelerate_config(args.accelerate_config)
        pipeline.plan(recipe, args.restart_from)  # refuse before launching processes
        _relaunch_under_accelerate(args)
    cpu.keep_freed_memory()
    cpu.share_cores(world)  # launched processes of one node divide its cores, as one process alone uses them all
    from r1kit import report

    try:
        records = pipeline.run(recipe, restart_from=args.restart_from, world=world)
    except Exception:  # a failed stage: the report holds what finished (its tables, not only the DONE.json files)
        finished = pipeline.plan(recipe, args.restart_from).done if world.is_main else {}
        if finished:
            print(f"report of the finished stages: {report.write_report(recipe, finished)}", file=sys.stderr)
        raise
    if not world.is_main:
        return

    for name, record in records.items():
        figures = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record["metrics"].items())
        print(f"{name}: {record['wall_s']:.1f}s {figures}")
    path = report.write_report(recipe, records)
    print()
    print(report.accuracy_table(report.accuracy_rows(records)))
    print(f"\nreport: {path}")


def _cmd_validate(args) -> None:
    from r1kit import pipeline
    from r1kit.hardware import Machine, World
    from r1kit.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides, World.from_env())
    if args.accelerate_config:
        _check_accelerate_config(args.accelerate_config)
    the_plan = pipeline.plan(recipe)
    machine = Machine.here(args.accelerate_config)
    lacking = pipeline.machine_problems(recipe, machine)
    if args.here:
        pipeline.preflight(recipe, machine=machine)  # also asks each served model's servers
    for stage in recipe.stages:
        state = "finished" if stage.name in the_plan.done else "to run"
        print(f"  {stage.name:<16} {stage.kind:<10} {state}")
    print(f"{args.recipe}: valid ({len(recipe.stages)} stages, output_dir {recipe.output_dir})")
    for line in lacking:
        print(f"note: not runnable on this machine: {line}", file=sys.stderr)


def _cmd_tiny(args) -> None:
    from r1kit.offline.tiny import build_tiny_model

    print(build_tiny_model(args.out_dir, seed=args.seed))


def _cmd_rewards_list(args) -> None:
    from r1kit import reward_registry as rewards

    for name, target in sorted(rewards.available().items()):
        fn = rewards.load(name)
        needed = rewards.required(fn)
        params = ", ".join(f"{k} (required)" if k in needed else f"{k}={v!r}" for k, v in rewards.parameters(fn).items())
        print(f"{name:<22} {rewards.summary(fn)}")
        print(f"{'':<22} parameters: {params or 'none'}   ({target})")


def _cmd_rewards_score(args) -> None:
    from r1kit import reward_registry as rewards
    from r1kit.config import parse_override

    params = {}
    for text in args.param:
        path, value = parse_override(text)
        params[".".join(path)] = value
    reward = rewards.build(args.name, params)
    from r1kit.data import parse_jsonl

    source = "<stdin>" if args.input == "-" else args.input
    try:
        fin = sys.stdin if args.input == "-" else open(args.input)
    except OSError as exc:
        raise RecipeError(f"{source}: cannot read ({exc.strerror})") from None
    rows = parse_jsonl(fin, source)
    for lineno, row in enumerate(rows, 1):
        if not isinstance(row.get("completion"), str):
            raise RecipeError(f"{source}: row {lineno}: each row needs a string field 'completion'")
    keys = sorted({k for r in rows for k in r} - {"completion"})
    t0 = time.time()
    scores: list[float | None] = []
    for i in range(0, len(rows), args.batch_size):
        batch = rows[i : i + args.batch_size]
        columns = {k: [r.get(k) for r in batch] for k in keys}
        scores += reward([r["completion"] for r in batch], **columns)
    elapsed = time.time() - t0
    text = "".join(json.dumps({**row, "reward": s}) + "\n" for row, s in zip(rows, scores))
    if args.output == "-":
        sys.stdout.write(text)
    else:
        from r1kit.files import write_atomic

        try:
            write_atomic(args.output, text)
        except OSError as exc:
            raise RecipeError(f"{args.output}: cannot write the scores ({exc.strerror})") from None
    valid = [s for s in scores if s is not None]
    mean = sum(valid) / len(valid) if valid else float("nan")
    print(
        f"{args.name}: {len(scores)} rows, mean {mean:.4f}, nulls {len(scores) - len(valid)}, "
        f"{elapsed:.2f}s ({len(scores) / max(elapsed, 1e-9):.0f} rows/s)",
        file=sys.stderr,
    )


COMMANDS = {"run": _cmd_run, "validate": _cmd_validate, "tiny-model": _cmd_tiny}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("run", "validate") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra  # KEY=VALUE after a flag (argparse takes positionals in one run only)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv = sys.argv[1:] if argv is None else argv
    setup_logging()
    from r1kit.reward_registry import add_plugin_folders

    add_plugin_folders(getattr(args, "recipe", None))  # `module:function` rewards and tools beside the recipe or here
    try:
        if args.command == "rewards":
            {"list": _cmd_rewards_list, "score": _cmd_rewards_score}[args.rewards_command](args)
        elif args.command == "eval":
            args.handler(args)
        else:
            COMMANDS[args.command](args)
    except (RecipeError, RewardError) as exc:
        print(f"r1kit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: journals and checkpoints keep what finished
        print("r1kit: interrupted; run the same command again to resume from what finished", file=sys.stderr)
        return 130
    except Exception as exc:
        from r1kit.errors import unreachable

        if not unreachable(exc):
            raise
        first = " ".join(str(exc).split())[:300]
        print(f"r1kit: error: the Hugging Face Hub cannot be reached ({first}); offline, name local folders and files "
              "for models and data (r1kit eval: --data-file FILE)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
