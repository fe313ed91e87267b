"""Plug-ins written against r1kit's documented API, in a folder of their own: a reward and a tool
load by ``module:function`` and by entry point (a distribution's ``entry_points.txt`` on the path,
as ``pip install`` of the user's package leaves it), whatever folder r1kit's modules live in."""

from __future__ import annotations

import textwrap

import pytest

from r1kit import reward_registry
from r1kit.execution.tools import Tool, ToolConfig

REWARDS = '''
def starts_with_think(completions: list[str], **columns) -> list[float | None]:
    """1.0 where a completion opens with <think>."""
    return [float(c.startswith("<think>")) for c in completions]
'''

# The tool imports from r1kit.tools, the path the tool docs have always named.
TOOLS = '''
from r1kit.tools import ToolConfig, ToolOutput


def shout(blocks: list[str], history: list[list[str]], config: ToolConfig) -> list[ToolOutput]:
    """Each block upper-cased."""
    return [ToolOutput(text=b.upper(), ok=True) for b in blocks]


shout.language = "shout"
'''

ENTRY_POINTS = """
[r1kit.rewards]
thinks = my_rewards:starts_with_think

[r1kit.tools]
shout = my_tools:shout
"""


@pytest.fixture
def plugin_folder(tmp_path, monkeypatch):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "my_rewards.py").write_text(textwrap.dedent(REWARDS))
    (folder / "my_tools.py").write_text(textwrap.dedent(TOOLS))
    info = folder / "my_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.mark.parametrize("name", ["thinks", "my_rewards:starts_with_think"])
def test_a_reward_from_a_folder_of_its_own_loads_by_entry_point_and_by_module_function(plugin_folder, name):
    reward = reward_registry.load(name)
    assert reward(["<think> a </think>", "b"]) == [1.0, 0.0]
    assert name in reward_registry.available() or ":" in name


@pytest.mark.parametrize("name", ["shout", "my_tools:shout"])
def test_a_tool_from_a_folder_of_its_own_loads_by_entry_point_and_by_module_function(plugin_folder, name):
    tool = Tool(ToolConfig(name=name))
    assert tool.language == "shout"
    assert tool.find("```shout\nhello\n```\n") == "hello"
    assert [out.text for out in tool.run(["hello"], [[]])] == ["HELLO"]
