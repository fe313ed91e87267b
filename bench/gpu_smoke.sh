#!/usr/bin/env bash
# The GPU check on a bare CUDA machine: install a folder of wheels beside the machine's own torch,
# then run the gpu-marked tests (tests/test_gpu.py: what no CPU test can show; results to
# $OUT/gpu_tests.xml) and bench/gpu_smoke.py (every stage kind; figures to $OUT/gpu_smoke.json).
# Both run; the exit status is 1 when either fails (docs/performance.md, "The GPU check").
#
#   bash bench/gpu_smoke.sh [WHEELS_DIR] [gpu_smoke.py options]
#
# WHEELS_DIR holds r1kit's own wheel and what the machine lacks, e.g. (on a machine with an index):
#   pip wheel --no-deps -w wheels .
#   pip download --no-deps -d wheels trl==1.16.0 datasets==5.2.0 math-verify==0.9.0 peft==0.21.2 \
#       latex2sympy2_extended antlr4-python3-runtime==4.13.2 dill multiprocess xxhash \
#       pandas pyarrow python-dateutil tzdata pytest iniconfig pluggy pygments
# (add --python-version X.Y --only-binary=:all: when the GPU machine's Python is another version).
# The wheels go into the machine's own environment with --no-index --no-deps (the machine is
# fresh at every start), so its torch, transformers and accelerate stay as they are. Not into a
# --target folder on PYTHONPATH: there pyarrow's types no longer pickle (datasets' fingerprinting
# fails on `MonthDayNano`; measured with pyarrow 26.0.1).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -gt 0 ] && [ -d "$1" ]; then
  python -m pip install -q --no-index --no-deps "$1"/*.whl || python -m pip install -q --user --no-index --no-deps "$1"/*.whl
  shift
fi
# Run outside the source tree: its r1kit/ folder (which lacks the installed r1kit.rewards) must
# not shadow the installed package in the worker processes, whose path starts with the current folder.
export OUT="${OUT:-$PWD}"
cd "$(mktemp -d)"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
status=0
python -m pytest -q -p no:cacheprovider -m gpu --junitxml "$OUT/gpu_tests.xml" "$here/tests/test_gpu.py" || status=1
python "$here/bench/gpu_smoke.py" "$@" || status=1
exit $status
