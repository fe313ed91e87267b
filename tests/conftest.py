"""Shared fixtures: the offline tiny model and its short cold start (built once per session),
GRPO trainers on it, recipe writing, and runs that hold at a known point for kill-and-resume tests."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # tests run in parallel processes, one per core: one thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def interruptible() -> None:
    """A child's ``preexec_fn`` for the Ctrl-C tests: SIGINT back to its default. A shell without job
    control starts background commands (a CI run among them) with SIGINT ignored, their children
    inherit that, and Python then installs no KeyboardInterrupt handler: Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def ctrl_c_reaches_python():
    """SIGINT raises KeyboardInterrupt in this process while the test runs (see `interruptible`)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_net = pytest.mark.skip(reason="needs network access (set R1KIT_TEST_NETWORK=1)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "network" in item.keywords and os.environ.get("R1KIT_TEST_NETWORK") != "1":
            item.add_marker(skip_net)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from r1kit.offline.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def taught(tiny_model: Path, texts: list[str], out: Path, steps: int = 150) -> Path:
    """The tiny model trained on `texts` alone (Adam, `steps` steps over all of them), saved to
    `out`: a model whose greedy continuation of each text's start is that text, for tests that
    need a rollout to go a known way (call a tool, play a game)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    sequences = [torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]]) for text in texts]
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        optimizer.zero_grad()
        sum(model(input_ids=ids, labels=ids).loss for ids in sequences).backward()
        optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def cold_start(tmp_path_factory, tiny_model) -> Path:
    """The tiny model after a short SFT on one-digit addition: right format, about 20% right sums
    when sampling at temperature 1, so GRPO rewards vary."""
    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    out = tmp_path_factory.mktemp("cold_start")
    recipe = out / "r.yaml"
    recipe.write_text(
        json.dumps(
            {
                "model": str(tiny_model),
                "output_dir": str(out / "run"),
                "stages": [
                    {
                        "name": "sft",
                        "kind": "sft",
                        "format": "prompt_completion",
                        "data": {"source": "task:addition", "task": {"n": 80, "digits": 1}},
                        "trainer": {
                            "max_steps": 200,
                            "per_device_train_batch_size": 32,
                            "learning_rate": 5.0e-3,
                            "lr_scheduler_type": "cosine",
                            "warmup_steps": 10,
                            "logging_steps": 50,
                        },
                    }
                ],
            }
        )
    )
    return Path(pipeline.run(load_recipe(recipe))["sft"]["model"])


@pytest.fixture
def grpo_trainer(tiny_model, tmp_path):
    """A builder of r1kit's ``GRPOTrainer``s (r1kit.trainers.trl_overrides) on the tiny model, for
    tests of one training step's parts: `rows` copies of one prompt a batch in groups of
    `generations`, completions of up to `completion` tokens, a constant reward, no gradient
    checkpointing, none of r1kit's paths asked for unless `features` asks; other ``GRPOConfig``
    fields (and ``peft_config``) as keywords."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from r1kit.trainers.trl_overrides import Features, GRPOTrainer

    def build(rows: int, generations: int, completion: int, peft_config=None, features=None, **fields):
        config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=rows,
                            num_generations=generations, max_completion_length=completion, **{"gradient_checkpointing": False, **fields})
        tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
        return GRPOTrainer(model=str(tiny_model), reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=config,
                           train_dataset=Dataset.from_list([{"prompt": "1+1="}] * rows), processing_class=tokenizer, peft_config=peft_config,
                           features=features or Features(skip_zero_advantage=False))

    return build


@pytest.fixture
def write_recipe(tmp_path):
    """Write a recipe mapping to tmp_path/recipe.yaml (output_dir defaults into tmp_path)."""

    def write(recipe: dict, name: str = "recipe.yaml") -> Path:
        recipe = {"output_dir": str(tmp_path / "run"), **recipe}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    return write


class Hold:
    """Starts a run that stops at a known point and stays there until the test kills it.

    Training runs hold right after saving a chosen checkpoint (``tests/hold/sitecustomize.py``);
    test rewards hold on a chosen call. ``marker`` files appear, one per holding process, named
    ``<marker>.<pid>``. The environment also puts ``tests/`` on ``PYTHONPATH``, so the run finds
    test rewards by ``module:function``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def env(self, **where) -> dict[str, str]:
        """The environment of a run that holds at `where`: ``step=N, output_dir=DIR`` for a
        trainer, or ``reward_calls=N`` for the test rewards that read it (they hold on call N+1)."""
        hold = {**where, "marker": str(self.marker)}
        here = Path(__file__).parent
        paths = [str(here / "hold"), str(here), os.environ.get("PYTHONPATH", "")]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "R1KIT_TEST_HOLD": json.dumps(hold, default=str)}

    def pids(self) -> list[int]:
        return [int(p.suffix[1:]) for p in self.marker.parent.glob(self.marker.name + ".*")]

    def wait(self, proc, count: int = 1, limit_s: float = 900) -> list[int]:
        """Wait until `count` processes hold; fail if the run ends first. The limit only guards
        against a hang: a held run never moves on, so waiting longer changes nothing."""
        import time

        deadline = time.monotonic() + limit_s
        while len(self.pids()) < count:
            assert proc.poll() is None, "the run ended before it reached the hold point"
            assert time.monotonic() < deadline, "the run never reached the hold point"
            time.sleep(0.1)
        return self.pids()


def gone(pid: int) -> bool:
    """True when `pid` has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.fixture
def hold(tmp_path) -> Hold:
    return Hold(tmp_path / "held")


@pytest.fixture
def wait_gone():
    """Wait until every pid has exited; fail if one is still running after `limit_s`."""
    import time

    def wait(pids, limit_s: float = 60) -> None:
        deadline = time.monotonic() + limit_s
        while not all(gone(p) for p in pids):
            assert time.monotonic() < deadline, f"still running after the kill: {[p for p in pids if not gone(p)]}"
            time.sleep(0.1)

    return wait
