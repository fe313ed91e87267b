"""r1kit: the DeepSeek-R1 post-training recipe end to end (SFT → GRPO → rejection sampling → SFT →
GRPO → eval), on TRL's trainers, with verifiable rewards, a local code sandbox and an evaluator."""

__version__ = "0.1.0"
