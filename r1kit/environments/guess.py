"""``guess``: a stateful game played through function calls, r1kit's built-in environment.

The model looks for a secret whole number between ``low`` and ``high`` (1 and 8 by default) by
calling ``guess(number)``; each call is answered ``higher``, ``lower`` or ``correct``. The
episode's reward is 1 when a call found the number within ``max_guesses`` calls (4), else 0.
Halving the range finds any number of 1..8 in four calls; four blind guesses find it half the
time: the feedback is what there is to learn. With ``feedback: false`` every miss is answered
``higher`` or ``lower`` at random (a control: the same game and the same words, without the
information).

The secret comes from the row's ``secret`` field (an eval's episodes are then the same on every
run), else from ``seed`` and the episode count.

Not here: the data (r1kit.offline.tasks makes rows for the offline demo), the turn loop.
"""

from __future__ import annotations

import random


class Guess:
    """Find a secret number in [low, high]; each guess is answered higher, lower or correct."""

    def __init__(self, low: int = 1, high: int = 8, max_guesses: int = 4, seed: int = 0, feedback: bool = True):
        if not low < high:
            raise ValueError(f"guess: low must be below high, got {low} and {high}")
        self.low, self.high, self.max_guesses, self.feedback = low, high, max_guesses, feedback
        self.rng = random.Random(seed)
        self.secret, self.guesses, self.solved = low, 0, False

    def reset(self, secret: int | None = None, **row) -> str | None:
        self.secret = int(secret) if secret is not None else self.rng.randint(self.low, self.high)
        self.guesses, self.solved = 0, False
        return None

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The guess.
        """
        if self.solved:
            return "correct"
        self.guesses += 1
        if self.guesses > self.max_guesses:
            return "no guesses left"
        if int(number) == self.secret:
            self.solved = True
            return "correct"
        if not self.feedback:
            return self.rng.choice(["higher", "lower"])
        return "higher" if self.secret > int(number) else "lower"

    def get_reward(self) -> float:
        return 1.0 if self.solved else 0.0
