"""Shared fixtures: the offline tiny model (built once per session) and recipe writing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
    from r1kit.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def write_recipe(tmp_path):
    """Write a recipe mapping to tmp_path/recipe.yaml (output_dir defaults into tmp_path)."""

    def write(recipe: dict, name: str = "recipe.yaml") -> Path:
        recipe = {"output_dir": str(tmp_path / "run"), **recipe}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    return write
