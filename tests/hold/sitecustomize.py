"""Test-only: hold a training process right after it saves a chosen checkpoint, until it is killed.

Kill-and-resume tests put this folder on ``PYTHONPATH`` of the run they start and set
``R1KIT_TEST_HOLD`` to a JSON object ``{"step": N, "output_dir": DIR, "marker": PATH}`` (see
``Hold`` in ``tests/conftest.py``). Python
imports ``sitecustomize`` at start-up in every process of that run (accelerate's workers
included); when a trainer whose ``output_dir`` is DIR has saved checkpoint N, the process writes
``PATH.<pid>`` and sleeps. The test waits for the marker and kills the run there: the stage cannot
finish before the kill, whatever the machine's speed.

Nothing else changes: the hook patches ``transformers``' callback dispatch only when the variable
is set, and only once ``transformers.trainer_callback`` is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

_HOLD = json.loads(os.environ["R1KIT_TEST_HOLD"]) if os.environ.get("R1KIT_TEST_HOLD") else None
_MODULE = "transformers.trainer_callback"


def _patch(module) -> None:
    save = module.CallbackHandler.on_save

    def on_save(self, args, state, control):
        control = save(self, args, state, control)
        if state.global_step == _HOLD["step"] and Path(args.output_dir) == Path(_HOLD["output_dir"]):
            Path(f"{_HOLD['marker']}.{os.getpid()}").write_text(str(state.global_step))
            while True:
                time.sleep(60)
        return control

    module.CallbackHandler.on_save = on_save


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the module as it is imported, so processes that never train pay nothing."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _HOLD and "step" in _HOLD:
    sys.meta_path.insert(0, _Finder())
