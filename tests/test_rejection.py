"""The rejection stage on the tiny cold-started model: kept samples verify, statistics add up, chat
rows render back to the sampled text, pass-rate filtering feeds a grpo stage, and a run killed
with SIGKILL resumes to exactly what an uninterrupted run writes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from r1kit import pipeline
from r1kit.config import DataConfig
from r1kit.errors import RecipeError
from r1kit.recipe import load_recipe
from r1kit.filters import normalize
from r1kit.stages.rejection import DROPS, RejectionStage, select
from r1kit.offline.tasks import addition


def stage(n=24, **extra):
    return {
        "name": "rej",
        "kind": "rejection",
        "template": "plain",
        "data": {"source": "task:addition", "task": {"n": n, "digits": 1}},
        "rewards": [{"name": "math_accuracy"}],
        "samples": 8,
        "max_kept_per_prompt": 3,
        "chunk_prompts": 4,
        "backend": "transformers",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 32,
        **extra,
    }


def read_rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def always_right(completions, **columns):
    """1.0 for every sample (to keep whatever the filters keep)."""
    return [1.0] * len(completions)


def by_answer(completions, *, answer, prompt, **columns):
    """A pass rate fixed by the problem, whatever the model writes: answers divisible by 3 always
    pass, answers 1 mod 3 never do, answers 2 mod 3 pass on every other sample of their prompt."""
    seen: Counter = Counter()
    scores = []
    for a, p in zip(answer, prompt):
        seen[p] += 1
        scores.append([1.0, 0.0, float(seen[p] % 2)][int(a) % 3])
    return scores


HELD_CALLS = 0


def hold_after_two_chunks(completions, **columns):
    """Not applicable to any sample (None). In a run started with ``hold.env(reward_calls=N)``,
    call N+1 (chunks 0..N-1 are journaled by then) writes the hold marker and sleeps until killed."""
    global HELD_CALLS
    spec = json.loads(os.environ.get("R1KIT_TEST_HOLD", "{}"))
    if HELD_CALLS == spec.get("reward_calls"):
        Path(f"{spec['marker']}.{os.getpid()}").write_text("held")
        while True:
            time.sleep(60)
    HELD_CALLS += 1
    return [None] * len(completions)


def test_kept_samples_verify_and_statistics_add_up(write_recipe, cold_start, tmp_path):
    record = pipeline.run(load_recipe(write_recipe({"model": str(cold_start), "stages": [stage()]})))["rej"]
    out = tmp_path / "run" / "rej"
    assert record["model"] is None and record["dataset"] == str(out / "dataset.jsonl")
    rows, stats = read_rows(record["dataset"]), json.loads((out / "stats.json").read_text())
    task = {r["id"]: r for r in addition(n=24, digits=1, seed=42)}
    assert rows and stats["dropped"]["failed"] > 0  # the model is right sometimes, not always

    from r1kit.rewards.math import math_accuracy

    assert math_accuracy([r["completion"] for r in rows], answer=[task[r["id"]]["answer"] for r in rows]) == [1.0] * len(rows)
    for r in rows:
        assert "messages" not in r  # a plain template: prompt/completion rows, trained as sampled
        assert r["prompt"] == task[r["id"]]["prompt"] and r["origin"] == "sampled"
        assert r["rewards"] == {"math_accuracy": 1.0} and r["reward_total"] == 1.0 and 0 <= r["sample"] < 8
        assert r["sampling"] | {"seed": 0} == {"model": str(cold_start), "backend": "transformers", "temperature": 1.0, "top_p": 1.0, "max_tokens": 32, "seed": 0}
    by_prompt: dict[str, list] = {}
    for r in rows:
        by_prompt.setdefault(r["id"], []).append(normalize(r["completion"]))
    assert all(len(v) <= 3 and len(set(v)) == len(v) for v in by_prompt.values())

    assert stats["prompts"] == 24 and stats["samples"] == 24 * 8 and stats["kept"] == len(rows)
    assert set(stats["dropped"]) == set(DROPS)
    assert sum(stats["dropped"].values()) + stats["kept"] == stats["samples"]
    assert stats["passed"] == stats["samples"] - stats["dropped"]["failed"]
    assert [p["kept"] for p in stats["per_prompt"]] == [len(by_prompt.get(i, [])) for i in task]
    assert stats["pass_rate"] == pytest.approx(sum(p["pass_rate"] for p in stats["per_prompt"]) / 24)
    assert record["metrics"]["kept"] == len(rows) and record["metrics"]["pass_rate"] == stats["pass_rate"]


def test_chat_rows_render_back_to_the_sampled_text_and_mixed_rows_train(write_recipe, cold_start, tmp_path):
    from transformers import AutoTokenizer

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": str(i), "name": "x"}]}) + "\n"
        for i in range(40)
    ))
    rej = stage(
        n=6,
        template="chat",
        think_prefill=True,
        rewards=[{"name": f"{__name__}:always_right"}],
        samples=2,
        filters={"truncated": False, "repetition": False, "mixed_language": False},
        mix={"source": str(chats), "ratio": 0.5},
    )
    sft = {"name": "sft", "kind": "sft", "data": {"source": "rej"}, "trainer": {"max_steps": 2, "per_device_train_batch_size": 4}}
    records = pipeline.run(load_recipe(write_recipe({"model": str(cold_start), "stages": [rej, sft]})))
    rows = read_rows(records["rej"]["dataset"])
    sampled = [r for r in rows if r["origin"] == "sampled"]
    mixed = [r for r in rows if r["origin"] == str(chats)]
    assert sampled and len(mixed) == round(0.5 * len(sampled)) and len(rows) == len(sampled) + len(mixed)
    tok = AutoTokenizer.from_pretrained(cold_start)
    for r in sampled:
        assert r["prompt"].endswith("<|im_start|>assistant\n<think>\n")
        # the conversation renders into exactly the text the model continued, then the sample
        assert tok.apply_chat_template(r["messages"], tokenize=False) == r["prompt"] + r["completion"] + "<|im_end|>\n"
    for r in mixed:
        assert r["prompt"] is None and r["messages"][1] == {"role": "assistant", "content": r["id"].rpartition("#")[2]}
    assert records["sft"]["metrics"]["rows"] == len(rows)  # the next sft stage trained on all of them


def test_pass_rate_filter_writes_the_prompts_in_the_band_for_grpo(write_recipe, cold_start, tmp_path):
    # The pass rates come from the problems (by_answer), not from what the model samples.
    rej = stage(n=16, mode="pass_rate_filter", min_pass_rate=0.1, rewards=[{"name": f"{__name__}:by_answer"}])
    grpo = {
        "name": "rl",
        "kind": "grpo",
        "template": "plain",
        "data": {"source": "rej"},
        "rewards": [{"name": "math_accuracy"}],
        "trainer": {"max_steps": 1, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16},
    }
    records = pipeline.run(load_recipe(write_recipe({"model": str(cold_start), "stages": [rej, grpo]})))
    rows = read_rows(records["rej"]["dataset"])
    stats = json.loads((tmp_path / "run" / "rej" / "stats.json").read_text())
    task = addition(n=16, digits=1, seed=42)
    expected = {0: 1.0, 1: 0.0, 2: 0.5}
    assert [p["pass_rate"] for p in stats["per_prompt"]] == [expected[int(r["answer"]) % 3] for r in task]
    band = [r for r in task if int(r["answer"]) % 3 == 2]  # strictly inside (0.1, 1.0)
    assert 0 < len(band) < 16 and stats["kept"] == len(rows) and stats["dropped"] == {}
    assert rows == [{**r, "pass_rate": 0.5} for r in band]  # the original rows, in order, plus their pass rate
    assert records["rl"]["input_model"] == str(cold_start) and records["rl"]["model"]


def test_select_verifies_filters_then_caps():
    from r1kit.sampling import Completion

    cfg = RejectionStage(name="r", kind="rejection", data=DataConfig(source="x"), rewards=[], max_kept_per_prompt=2, min_total=1.5)
    good = ["<think> add them </think> 7", "<think> add them up </think> 7", "<think> carry one </think> 7", "<think> sum </think> 7"]
    texts = good[:1] + ["<think> 加 them </think> 7", good[0].upper(), good[1], good[2], good[3], "wrong"]
    totals = [1.5, 2.0, 1.5, 1.5, 1.5, 1.5, 1.0]
    samples = [Completion(text=t, tokens=5, truncated=False) for t in texts]
    assert select(totals, samples, cfg) == [None, "mixed_language", "exact_duplicate", None, "over_cap", "over_cap", "failed"]
    cfg.max_kept_per_prompt = None
    samples[4].truncated = True
    assert select(totals, samples, cfg)[3:] == [None, "truncated", None, "failed"]


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"rewards": []}, "rej.rewards: a rejection stage needs at least one reward"),
        ({"mix": {"source": "chats.jsonl"}}, "rej.mix: mixing conversations needs mode: samples and template: chat"),
        ({"min_pass_rate": 0.5, "max_pass_rate": 0.5}, "need 0 <= min_pass_rate < max_pass_rate <= 1"),
        ({"top_p": 0.0}, "rej: need temperature >= 0, 0 < top_p <= 1 and max_tokens >= 1; got temperature 1.0, top_p 0.0"),
        ({"temperature": -1}, "need temperature >= 0, 0 < top_p <= 1"),
        ({"filters": {"langauge": "en"}}, "rej.filters: unknown key 'langauge' (did you mean 'language'?)"),
        ({"filters": {"language": "xx"}}, "rej.filters.language: 'xx' is not one of en, zh"),
        ({"backend": "sglang"}, "rej.backend: 'sglang' is not a sampling backend; allowed: auto, endpoint, transformers, vllm, vllm_server"),
        ({"max_kept_per_prompt": -1}, "rej.max_kept_per_prompt: must be at least 1, got -1"),  # sliced off the last survivor
        ({"max_kept_per_prompt": 0}, "rej.max_kept_per_prompt: must be at least 1, got 0"),
        ({"rewards": [{"name": "math_accuracy", "when": 3}]}, "rej.rewards[0]: reward 'math_accuracy': `when` maps column names"),
    ],
)
def test_config_errors(write_recipe, tmp_path, extra, expected):
    with pytest.raises(RecipeError) as err:
        load_recipe(write_recipe({"model": "tiny", "stages": [stage(**extra)]}))
    assert expected in str(err.value)


# ---------------------------------------------------------------------------------------------
# Resume


def finished_chunks(journal: Path) -> int:
    return journal.read_bytes().count(b"\n") - 1 if journal.exists() else 0  # minus the header line


def test_resume_after_sigkill_loses_nothing_and_duplicates_nothing(write_recipe, cold_start, tmp_path, hold, wait_gone):
    rewards = [{"name": "math_accuracy"}, {"name": "test_rejection:hold_after_two_chunks"}]
    rej = stage(n=32, samples=4, chunk_prompts=2, rewards=rewards)
    whole = write_recipe({"model": str(cold_start), "output_dir": str(tmp_path / "whole"), "stages": [rej]}, "whole.yaml")
    expected = read_rows(pipeline.run(load_recipe(whole))["rej"]["dataset"])

    killed = write_recipe({"model": str(cold_start), "output_dir": str(tmp_path / "killed"), "stages": [rej]}, "killed.yaml")
    out = tmp_path / "killed" / "rej"
    command = [sys.executable, "-m", "r1kit.cli", "run", str(killed)]
    # The run holds while scoring its third chunk, two chunks journaled, until it is killed.
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=hold.env(reward_calls=2))
    pids = hold.wait(proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the run and its reward workers
    proc.wait()
    wait_gone(pids)
    done = finished_chunks(out / "journal.jsonl")
    assert done == 2 and not (out / "dataset.jsonl").exists() and not (out / "DONE.json").exists()
    with open(out / "journal.jsonl", "a") as f:  # as a kill in the middle of a write leaves it
        f.write('{"chunk": 15, "prompts": [{"index": 30, "id": "addi')

    with pytest.raises(RecipeError, match=r"stage 'rej' did not finish \(interrupted or failed\) .* \(changed: stage.samples\)"):
        pipeline.run(load_recipe(killed, ["rej.samples=5"]))  # the journal's chunks were sampled 4 a prompt
    (out / pipeline.STARTED).unlink()  # as a run from before the pipeline recorded it: the journal's own check
    with pytest.raises(RecipeError, match="written with another config"):
        pipeline.run(load_recipe(killed, ["rej.samples=5"]))

    resumed = subprocess.run(command, capture_output=True, text=True, env=hold.env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming, {done} of 16 chunks already done" in resumed.stderr
    assert "dropping a partial last line" in resumed.stderr
    got = read_rows(out / "dataset.jsonl")
    key = lambda rows: sorted((r["id"], r["sample"], r["completion"]) for r in rows)  # noqa: E731
    assert len(set(key(got))) == len(got)  # no duplicates
    assert key(got) == key(expected)  # no loss, nothing extra
    assert json.loads((out / "stats.json").read_text()) == json.loads((tmp_path / "whole" / "rej" / "stats.json").read_text())


def test_a_journal_of_another_number_of_processes_resumes(write_recipe, cold_start, tmp_path):
    """Process 1 of a 2-process run journals its shard (chunks 1, 3, 5) and the run ends; a
    single process resumes from that journal, samples only chunks 0, 2, 4, and writes what an
    uninterrupted single-process run writes."""
    from r1kit.hardware import World
    from r1kit.stages import StageContext
    from r1kit.stages.rejection import run

    rej = stage(n=12, samples=4, chunk_prompts=2)
    whole = write_recipe({"model": str(cold_start), "output_dir": str(tmp_path / "whole"), "stages": [rej]}, "whole.yaml")
    expected = read_rows(pipeline.run(load_recipe(whole))["rej"]["dataset"])
    path = write_recipe({"model": str(cold_start), "output_dir": str(tmp_path / "run"), "stages": [rej]}, "run.yaml")
    recipe, out = load_recipe(path), tmp_path / "run" / "rej"
    out.mkdir(parents=True)
    ctx = StageContext(recipe=recipe, stage=recipe.stages[0], dir=out, model=str(cold_start), datasets={},
                       processes=World(rank=1, world=2, local_rank=1, local_world=2))
    assert run(ctx).dataset is None  # not the main process: it merges nothing
    assert [json.loads(line).get("chunk") for line in (out / "journal.shard1.jsonl").read_text().splitlines()] == [None, 1, 3, 5]
    assert not (out / "journal.jsonl").exists()
    assert read_rows(pipeline.run(load_recipe(path))["rej"]["dataset"]) == expected
    main_chunks = [json.loads(line).get("chunk") for line in (out / "journal.jsonl").read_text().splitlines()]
    assert main_chunks == [None, 0, 2, 4]
    assert json.loads((out / "stats.json").read_text()) == json.loads((tmp_path / "whole" / "rej" / "stats.json").read_text())


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"filters": {"max_tokens": 0}}, "rej.filters.max_tokens: must be at least 1"),
        ({"filters": {"max_chars": -5}}, "rej.filters.max_chars: must be at least 1"),
        ({"filters": {"min_language_share": 2.0}}, "rej.filters.min_language_share: a share, from 0 to 1, got 2.0"),
        ({"filters": {"max_repetition": -0.1}}, "rej.filters.max_repetition: a share, from 0 to 1"),
        ({"filters": {"near_duplicate_threshold": 1.5}}, "rej.filters.near_duplicate_threshold: a similarity above 0 and at most 1"),
        ({"filters": {"repetition_ngram": 0}}, "rej.filters.repetition_ngram: a word n-gram length of at least 1"),
        ({"mix": {"ratio": -1}}, "rej.mix.ratio: mixed conversations per kept sample, 0 or more, got -1"),
    ],
)
def test_validate_refuses_filters_that_keep_nothing_or_mean_nothing(write_recipe, tmp_path, capsys, extra, key):
    from r1kit.cli import main

    path = write_recipe({"model": "tiny", "stages": [stage(**extra)]})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_rejection_stage_that_keeps_nothing_fails_naming_what_dropped_everything(write_recipe, cold_start, tmp_path, capsys):
    """Keeping no sample fails the stage (no marker: the next sft stage would train on nothing),
    naming the filter that dropped the samples and leaving stats.json to read."""
    from r1kit.cli import main

    rej = stage(n=8, rewards=[{"name": f"{__name__}:always_right"}], filters={"max_tokens": 1})
    path = write_recipe({"model": str(cold_start), "stages": [rej]})
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("r1kit: error: rej: kept nothing of 64 samples of 8 prompts; dropped by overlong ")
    assert "loosen the overlong filter (filters.max_tokens or filters.max_chars)" in err and "stats.json has every prompt's pass rate" in err
    stats = json.loads((tmp_path / "run" / "rej" / "stats.json").read_text())
    assert stats["kept"] == 0 and stats["dropped"]["overlong"] > 0
    assert not (tmp_path / "run" / "rej" / "DONE.json").exists()


def test_what_to_loosen_names_the_keys_of_every_filter():
    """Issue 66, point 13: the hint "loosen the overlong filter (filters:)" named no key."""
    from r1kit.filters import LOOSEN, REASONS, FilterConfig
    from r1kit.stages.rejection import RejectionStage, kept_nothing

    keys = {f.name for f in dataclasses.fields(FilterConfig)}
    assert set(LOOSEN) == set(REASONS)
    for reason, fix in LOOSEN.items():
        named = [word.split(".")[1].rstrip(":,") for word in fix.split() if word.startswith("filters.")]
        assert named and set(named) <= keys, (reason, fix)
    stage = RejectionStage(name="rej", kind="rejection", data={"source": "task:addition"}, rewards=[{"name": "math_accuracy"}])
    assert kept_nothing(stage, {"failed": 0, "repetition": 5}).endswith("loosen the repetition filter (filters.max_repetition, or filters.repetition: false)")
