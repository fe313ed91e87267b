"""The `reward` stage (r1kit.stages.reward): a reward model trained on preference pairs ranks held-out
pairs right, scores through the `reward_model` reward as it was trained (the same rendered
tokens), hands no model on, and validate refuses bad settings in one line."""

from __future__ import annotations

import json

import pytest

from r1kit.cli import main


def recipe(tmp_path, tiny_model, **stage) -> str:
    path = tmp_path / "r.yaml"
    rm = {"name": "rm", "kind": "reward", "data": {"source": "task:chain_sum", "task": {"n": 400, "pairs": True}}, "text": "full",
          "trainer": {"max_steps": 40, "per_device_train_batch_size": 16, "learning_rate": 1.0e-3, "logging_steps": 10}} | stage
    after = {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "task": {"n": 2}, "samples": 1, "max_tokens": 4,
             "template": "plain", "backend": "transformers"}
    path.write_text(json.dumps({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "seed": 3, "stages": [rm, after]}))
    return str(path)


def test_a_reward_model_learns_the_pairs_and_scores_them_as_it_was_trained(tmp_path, tiny_model):
    from r1kit import reward_registry
    from r1kit.offline.tasks import chain_sum

    assert main(["run", recipe(tmp_path, tiny_model)]) == 0
    done = json.loads((tmp_path / "run" / "rm" / "DONE.json").read_text())
    metrics = done["metrics"]
    assert metrics["pairs"] == 360 and metrics["held_out"] == 40
    assert metrics["pair_accuracy"] >= 0.9 > metrics["pair_accuracy_before"] and metrics["last_loss"] < metrics["first_loss"]
    model = done["model"]
    assert model == str(tmp_path / "run" / "rm" / "model")
    assert json.loads((tmp_path / "run" / "ev" / "DONE.json").read_text())["input_model"] == str(tiny_model)  # not handed on
    fresh = chain_sum(n=50, split="test", pairs=True)  # pairs it never saw, scored by the reward a grpo stage would use
    reward = reward_registry.build("reward_model", {"model": model, "text": "full"})
    prompts = [r["prompt"] for r in fresh]
    chosen, rejected = reward([r["chosen"] for r in fresh], prompt=prompts), reward([r["rejected"] for r in fresh], prompt=prompts)
    assert sum(c > r for c, r in zip(chosen, rejected)) >= 45


def test_the_held_out_ranking_is_measured_on_the_ids_the_reward_scores(tmp_path, tiny_model):
    """`pairs` renders and tokenizes as the reward does: the ids of a pair are the reward's encoding of it."""
    from types import SimpleNamespace

    from r1kit.config import DataConfig
    from r1kit.reward_text import encode, rendered, tokenizer_of
    from r1kit.stages import reward as stage_module
    from r1kit.offline.tasks import chain_sum

    tokenizer = tokenizer_of(str(tiny_model))
    stage = SimpleNamespace(data=DataConfig(source="task:chain_sum", task={"n": 20, "pairs": True}), text="summary", max_length=12,
                            held_out=0.25, name="rm")
    ctx = SimpleNamespace(stage=stage, recipe=SimpleNamespace(seed=0), resolve_data_source=lambda s: s, datasets={}, dir=tmp_path)
    train, held = stage_module.pairs(ctx, tokenizer)
    assert len(train) == 15 and len(held) == 5
    rows = chain_sum(n=20, pairs=True)
    expected = encode(tokenizer, rendered(tokenizer, [r["chosen"] for r in rows], "summary", [r["prompt"] for r in rows]), 12)
    assert sorted(p["chosen_ids"] for p in train + held) == sorted(expected) and all(len(p["rejected_ids"]) <= 12 for p in train)


@pytest.mark.parametrize("stage, says", [({"held_out": 1.0}, "rm.held_out: a share from 0 to below 1"),
                                         ({"trainer": {"max_length": 64}}, "rm.trainer.max_length: r1kit renders and cuts the pairs itself"),
                                         ({"text": "half"}, "rm.text")])
def test_validate_refuses_bad_reward_stage_settings_in_one_line(tmp_path, tiny_model, capsys, stage, says):
    assert main(["validate", recipe(tmp_path, tiny_model, **stage)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_the_report_draws_each_reward_that_several_rl_stages_logged(tmp_path, monkeypatch):
    """A learned reward and the verifier's, logged by two grpo stages (one trained on each): one
    panel per shared reward, a line per stage; nothing when no reward is shared."""
    from types import SimpleNamespace

    import matplotlib.axes

    from r1kit import report

    drawn = []
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, x, y, label=None, **kw: drawn.append((ax.get_title(), label, list(y))))
    stages = [SimpleNamespace(name=n, kind=k) for n, k in [("rm", "reward"), ("rl_learned", "grpo"), ("rl_rule", "grpo"), ("ev", "eval")]]
    logged = {"rl_learned": ("reward_model", "reasoning_gym"), "rl_rule": ("reasoning_gym", "reward_model")}
    for name, (trained, watched) in logged.items():
        (tmp_path / name).mkdir()
        rows = [{"step": s, "reward": 0.1 * s, f"rewards/{trained}/mean": 0.1 * s, f"rewards/{watched}/mean": 0.5} for s in (1, 2, 3)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = SimpleNamespace(stages=stages)
    assert report.plot_rewards_by_stage(recipe, tmp_path, tmp_path / "plots" / "by.png") and (tmp_path / "plots" / "by.png").is_file()
    assert sorted((label, y) for _, label, y in drawn) == sorted([("rl_learned", [0.1, 0.2, 0.30000000000000004]), ("rl_learned", [0.5] * 3),
                                                                  ("rl_rule", [0.5] * 3), ("rl_rule", [0.1, 0.2, 0.30000000000000004])])
    (tmp_path / "rl_rule" / "metrics.jsonl").unlink()
    assert not report.plot_rewards_by_stage(recipe, tmp_path, tmp_path / "plots" / "none.png")
