"""``skyrl_gym``: skyrl-gym's text environments (``BaseTextEnv``) through r1kit's gym-style
``step(text)`` protocol.

    environment: {name: skyrl_gym, args: {env_id: gsm8k_multi_turn, answer: answer, extras: {max_turns: 3}}}

Each episode makes a new skyrl-gym environment with ``skyrl_gym.make(env_id, extras=...)``,
``extras`` holding the recipe's and the row's ground truth (``reward_spec.ground_truth`` from the
row's `answer` field), and ``init`` with the rollout's prompt. Each model turn goes to its
``step``: its observations come back as the next user turn, ``done`` ends the episode, and the
episode's reward is the sum of its steps' rewards (skyrl-gym's rewards are per turn).

skyrl-gym is an optional dependency (``pip install r1kit[environments]``); its tool environments
(search, text2sql) need services r1kit does not start.
"""

from __future__ import annotations

from typing import Any


class SkyRLGym:
    """A skyrl-gym text environment, one per episode."""

    def __init__(self, env_id: str = "gsm8k_multi_turn", answer: str = "answer", prompt: str = "prompt",
                 extras: dict[str, Any] | None = None):
        try:
            import skyrl_gym  # noqa: F401
        except ImportError as exc:
            raise ImportError(f"skyrl_gym environment: skyrl-gym is not installed ({exc}); pip install 'r1kit[environments]'") from None
        self.env_id, self.answer, self.prompt, self.extras = env_id, answer, prompt, dict(extras or {})
        self.env, self.total, self.done = None, 0.0, False

    def reset(self, **row) -> str | None:
        import skyrl_gym

        extras = {**self.extras, "reward_spec": {"method": "rule", "ground_truth": str(row.get(self.answer, ""))}}
        extras.setdefault("extra_info", {})
        self.env = skyrl_gym.make(self.env_id, extras=extras)
        self.env.init([{"role": "user", "content": str(row.get(self.prompt, ""))}])
        self.total, self.done = 0.0, False
        return None

    def step(self, text: str) -> str | None:
        out = self.env.step(text)
        self.total += float(out["reward"])
        self.done = bool(out["done"])
        if self.done:
            return None
        return "\n".join(str(m.get("content", "")) for m in out["observations"]) or None

    def get_reward(self) -> float:
        return self.total
