"""r1kit.trainers.trl_overrides.check against the libraries r1kit allows: the functions of
transformers that r1kit patches (r1kit.trainers.trl_patches), read out of the wheel of the oldest
transformers pyproject.toml allows (``make test`` downloads it into the venv's ``floor/``), fit
what r1kit relies on; a transformers whose functions or inherited Trainer methods differ is
refused in one line that names transformers, not TRL."""

from __future__ import annotations

import ast
import sys
import zipfile
from importlib.metadata import requires
from pathlib import Path

import pytest

from r1kit.errors import RecipeError
from r1kit.trainers import trl_overrides, trl_patches
from r1kit.trainers.trl_overrides import TRANSFORMERS_RANGE, fits, params

FLOOR = TRANSFORMERS_RANGE.partition(">=")[2]
WHEEL = Path(sys.prefix) / "floor" / f"transformers-{FLOOR}.0-py3-none-any.whl"
SDPA = "transformers.integrations.sdpa_attention.sdpa_attention_forward"


def from_wheel(name: str, drop: tuple[str, ...] = ()):
    """The function `name` ("transformers.module.function") as the floor's wheel defines it, without
    its annotations, decorators and body (and without `drop`: leading parameters, or "kwargs"):
    what `params` reads."""
    assert WHEEL.exists(), f"{WHEEL} is missing: `make {Path(sys.prefix).name}/.floor` downloads it"
    module, _, function = name.rpartition(".")
    with zipfile.ZipFile(WHEEL) as wheel:
        tree = ast.parse(wheel.read(module.replace(".", "/") + ".py"))
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function)
    args = fn.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    args.args = [a for a in args.args if a.arg not in drop]  # leading ones, without defaults
    args.kwarg = None if "kwargs" in drop else args.kwarg
    fn.returns, fn.decorator_list, fn.body = None, [], [ast.Pass()]
    space = {"__name__": module}
    exec(compile(ast.fix_missing_locations(ast.Module([fn], type_ignores=[])), str(WHEEL), "exec"), space)
    return space[function]


def test_the_transformers_range_is_pyprojects():
    assert TRANSFORMERS_RANGE in requires("r1kit")


def test_the_patched_functions_of_the_oldest_transformers_allowed_fit(monkeypatch):
    """5.17's SDPA attention has no ``cache`` parameter (5.19 added it); r1kit's wrapper passes it
    through by keyword, so the check accepts 5.17's function, and refuses one without what the
    wrapper relies on."""
    import transformers.integrations.sdpa_attention as sdpa

    ours = [name for name in trl_patches.TARGETS if name.startswith("transformers.")]
    assert ours == [SDPA]
    floor = from_wheel(SDPA)
    assert "cache" not in params(floor)
    assert fits(trl_patches.TARGETS[SDPA], params(floor))
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", floor)
    trl_overrides.check()  # the live check, on 5.17's parameters
    for lacking in (("attention_mask",), ("kwargs",)):
        assert not fits(trl_patches.TARGETS[SDPA], params(from_wheel(SDPA, drop=lacking))), lacking


def test_a_transformers_function_that_differs_is_refused_naming_transformers(monkeypatch):
    import transformers
    import transformers.integrations.sdpa_attention as sdpa

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", from_wheel(SDPA, drop=("kwargs",)))
    with pytest.raises(RecipeError) as e:
        trl_overrides.check()
    assert str(e.value) == (
        f"r1kit patches {SDPA}(module, query, key, value, attention_mask, ..., **kwargs), written against transformers 5.19; "
        f"the installed transformers {transformers.__version__} has (module, query, key, value, attention_mask, dropout=0.0, "
        "scaling=None, is_causal=None, position_bias=None): install transformers>=5.17 (pyproject.toml's range)")


def test_an_inherited_trainer_method_that_differs_is_refused_naming_transformers(monkeypatch):
    """``get_batch_samples`` is transformers' Trainer's, reached through TRL's GRPOTrainer."""
    import transformers

    def changed(self, epoch_iterator, num_batches, device, extra=None):
        raise AssertionError("never called")

    monkeypatch.setattr(transformers.Trainer, "get_batch_samples", changed)
    with pytest.raises(RecipeError, match=r"^r1kit overrides trl\.GRPOTrainer\.get_batch_samples\(self, epoch_iterator, "
                       r"num_batches, device\), written against transformers 5\.19; the installed transformers ") as e:
        trl_overrides.check()
    assert str(e.value).endswith("install transformers>=5.17 (pyproject.toml's range)") and "TRL" not in str(e.value)
