"""Test-only: ``r1kit run`` in a process group with a short timeout, SECONDS, so that a stage that
outlasts it stands in for one that outlasts the default (30 minutes with gloo).

    accelerate launch --config_file recipes/accelerate/cpu_ddp.yaml tests/short_timeout.py SECONDS RECIPE
"""

from __future__ import annotations

import datetime
import sys

import torch.distributed as dist

from r1kit.cli import main

if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(sys.argv[1])))
    sys.exit(main(["run", *sys.argv[2:]]))
