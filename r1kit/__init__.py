"""r1kit: the DeepSeek-R1 post-training recipe end to end (SFT → GRPO → rejection sampling → SFT →
GRPO → eval), on TRL's trainers, with verifiable rewards, a local code sandbox and an evaluator."""

import logging

__version__ = "0.1.0"


def setup_logging(level: int = logging.INFO) -> None:
    """r1kit's log lines (``HH:MM:SS r1kit message``), for the CLI and the stage processes it starts."""
    logging.basicConfig(level=level, format="%(asctime)s r1kit %(message)s", datefmt="%H:%M:%S")
