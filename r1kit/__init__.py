"""r1kit: the DeepSeek-R1 post-training recipe end to end (SFT → GRPO → rejection sampling → SFT →
GRPO → eval), on TRL's trainers, with verifiable rewards, a local code sandbox and an evaluator.

The package's top holds the pipeline's spine (cli, recipe, config, pipeline, stage processes,
report, data, templates, text, models, the reward registry, files, errors, rejection filters);
the folders group the rest by concern (docs/contributing.md draws the tree). Modules that moved
into a folder keep their old import path: ``import r1kit.tools`` is ``r1kit.execution.tools``.
"""

import importlib
import importlib.abc
import importlib.util
import logging
import sys

__version__ = "0.1.0"

# Old module name -> where it lives now, without the package prefix (the layout test reads quoted
# module names as imports; these are aliases, not imports).
MOVED = {
    "benchmarks": "evaluation.benchmarks",
    "choices": "evaluation.choices",
    "code_benchmarks": "evaluation.code_benchmarks",
    "codeforces": "evaluation.codeforces",
    "evaluate": "evaluation.evaluate",
    "metrics": "evaluation.metrics",
    "suite": "evaluation.suite",
    "judge": "execution.judge",
    "sandbox": "execution.sandbox",
    "sandbox_server": "execution.sandbox_server",
    "tools": "execution.tools",
    "dynamic_sampling": "trainers.dynamic_sampling",
    "lora": "trainers.lora",
    "shared_prompts": "trainers.shared_prompts",
    "training": "trainers.training",
    "zero_advantage": "trainers.zero_advantage",
    "cpu": "hardware.cpu",
    "precision": "hardware.precision",
    "corpus": "offline.corpus",
    "tasks": "offline.tasks",
    "tiny": "offline.tiny",
    "gguf": "models",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module it moved to (one module object, two names)."""

    def find_spec(self, name, path=None, target=None):
        prefix, _, old = name.partition(".")
        if prefix == __name__ and old in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MOVED[spec.name.partition('.')[2]]}")

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.append(_Moved())


def setup_logging(level: int = logging.INFO) -> None:
    """r1kit's log lines (``HH:MM:SS r1kit message``), for the CLI and the stage processes it starts."""
    logging.basicConfig(level=level, format="%(asctime)s r1kit %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request to a served model otherwise
    logging.getLogger("vllm.triton_utils").setLevel(logging.ERROR)  # importing vLLM on a CPU: three lines on Triton's absence
