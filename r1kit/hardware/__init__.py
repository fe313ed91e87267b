"""Hardware paths: what r1kit changes to train and sample fast on a CPU (r1kit.hardware.cpu) and
when it chooses bfloat16 there (r1kit.hardware.precision).

Not here: anything that changes results beyond rounding, anything on a GPU (TRL's and torch's own
paths run there). Imports nothing of r1kit but its errors and the model reference; trainers,
sampling and the stages import it.
"""
