"""With no network, commands that need the hub fail in one line, exit 2, naming what they asked
for and the offline way (issue: tried as a new user would, point 4); HF_HUB_OFFLINE stands in for
a machine without network (the same errors, without waiting for timeouts)."""

from __future__ import annotations

import pytest

from r1kit.cli import main


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def run(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    out = capsys.readouterr()
    assert out.err.count("r1kit: error:") == 1 and "Traceback" not in out.err
    return out.err.splitlines()[-1]


def test_scoring_saved_generations_of_a_hub_benchmark(tmp_path, capsys):
    (tmp_path / "gen.jsonl").write_text('{"id": "1", "completion": "x"}\n')
    line = run(capsys, "eval", "--benchmark", "aime24", "--completions", str(tmp_path / "gen.jsonl"), "--output", str(tmp_path / "o"))
    assert "dataset HuggingFaceH4/aime_2024: the Hugging Face Hub cannot be reached" in line and "--data-file FILE" in line
    assert not (tmp_path / "o").exists()


def test_sampling_a_hub_model(tmp_path, capsys):
    line = run(capsys, "eval", "--benchmark", "task:addition", "--model", "Qwen/Qwen2.5-Math-7B", "--backend", "transformers",
               "--output", str(tmp_path / "o"))
    assert "model Qwen/Qwen2.5-Math-7B: the Hugging Face Hub cannot be reached" in line and "local model folder" in line
    assert not (tmp_path / "o").exists()


def test_a_stage_on_a_hub_dataset(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: tiny\noutput_dir: {tmp_path / 'run'}\nstages:\n"
                      "  - {name: s, kind: sft, data: {source: org/some-dataset}, trainer: {max_steps: 1}}\n")
    line = run(capsys, "run", str(recipe))
    assert "dataset org/some-dataset: the Hugging Face Hub cannot be reached" in line and ".jsonl, .json or .parquet" in line


def test_other_connection_errors_are_not_taken_for_the_hub():
    from r1kit.errors import unreachable

    assert not unreachable(ConnectionRefusedError("[Errno 111] Connection refused"))
    assert not unreachable(BrokenPipeError())
    try:
        try:
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")
        except OSError as inner:
            raise RuntimeError("loading failed") from inner
    except RuntimeError as outer:
        assert unreachable(outer)  # the cause says so
