"""The resumable sampling engine (r1kit.sampling.jobs) with a scripted backend: a chunk is one
generate call and one journal line, a cut last line is ignored and redone, a rerun samples only
what is missing, two shards cover every chunk once, and the merged records come in item order
whoever journaled them."""

from __future__ import annotations

import json

import pytest

from r1kit.errors import RecipeError
from r1kit.sampling import Completion, SamplingParams
from r1kit.sampling.jobs import JOURNAL, Job, Request

HEADER = {"model": "m", "seed": 7}


class Scripted:
    """Completions that say which prompt, seed and sample they are; raises on call `fail_on`."""

    backend = "scripted"
    tokenizer = None

    def __init__(self, fail_on: int | None = None):
        self.calls: list[tuple[list[str], int]] = []
        self.fail_on = fail_on

    def generate_full(self, prompts, n, params):
        if len(self.calls) + 1 == self.fail_on:
            raise KeyboardInterrupt  # as if the run were stopped here
        self.calls.append((prompts, params.seed))
        return [[Completion(f"{p}|{params.seed}|{j}", tokens=j, truncated=False) for j in range(n)] for p in prompts]


class Items:
    """A consumer: item i's prompt is "item i"; a chunk is seeded by its first item."""

    def request(self, chunk, sampler):
        return Request([f"item {i}" for i in range(chunk.start, chunk.stop)], 2, SamplingParams(seed=100 + chunk.start))

    def records(self, chunk, request, completions, sampler):
        return [{"item": i, "texts": [c.text for c in group]} for i, group in zip(range(chunk.start, chunk.stop), completions)]


def job(folder, items=7, chunk=3, **extra):
    return Job(folder, HEADER, items, chunk, "test", **extra)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected(items=7):
    return [{"item": i, "texts": [f"item {i}|{100 + i // 3 * 3}|{j}" for j in range(2)]} for i in range(items)]


def test_a_chunk_is_one_generate_call_and_one_journal_line(tmp_path):
    sampler = Scripted()
    assert job(tmp_path).sample(Items(), lambda: sampler) == 3
    assert sampler.calls == [(["item 0", "item 1", "item 2"], 100), (["item 3", "item 4", "item 5"], 103), (["item 6"], 106)]
    journal = lines(tmp_path / JOURNAL)
    assert journal[0] == {"header": HEADER}
    assert [(j["chunk"], j["start"], j["stop"], [r["item"] for r in j["records"]]) for j in journal[1:]] == [
        (0, 0, 3, [0, 1, 2]), (1, 3, 6, [3, 4, 5]), (2, 6, 7, [6]),
    ]
    assert list(job(tmp_path).records()) == expected()


def test_nothing_left_loads_no_backend_and_another_header_is_refused(tmp_path):
    job(tmp_path).sample(Items(), Scripted)

    def must_not_load():
        raise AssertionError("nothing is left to sample")

    assert job(tmp_path).sample(Items(), must_not_load) == 0
    with pytest.raises(RecipeError, match="written with another config, model or seed"):
        Job(tmp_path, {**HEADER, "seed": 8}, 7, 3, "test").sample(Items(), must_not_load)


def test_a_backend_that_fails_to_load_leaves_the_folder_as_it_was(tmp_path):
    def broken():
        raise OSError("no such model")

    with pytest.raises(OSError):
        job(tmp_path / "out").sample(Items(), broken)
    assert not (tmp_path / "out").exists()


def test_a_rerun_samples_only_the_missing_chunks_and_a_cut_last_line_is_redone(tmp_path, caplog):
    with pytest.raises(KeyboardInterrupt):
        job(tmp_path).sample(Items(), lambda: Scripted(fail_on=2))
    path = tmp_path / JOURNAL
    assert [j.get("chunk") for j in lines(path)] == [None, 0]
    with open(path, "a") as f:  # a kill in the middle of chunk 1's line
        f.write('{"chunk": 1, "start": 3, "stop": 6, "records": [{"item": 3, "te')
    assert list(job(tmp_path).index()) == [(0, 3)]  # the cut line counts for nothing

    again = Scripted()
    with caplog.at_level("INFO", logger="r1kit"):
        assert job(tmp_path).sample(Items(), lambda: again) == 2
    assert [seed for _, seed in again.calls] == [103, 106]  # chunks 1 and 2, seeded as in one run
    assert "dropping a partial last line" in caplog.text and "resuming, 1 of 3 chunks already done" in caplog.text
    assert [j.get("chunk") for j in lines(path)] == [None, 0, 1, 2]  # every line whole, none twice
    assert list(job(tmp_path).records()) == expected()


def test_a_longer_job_samples_only_its_new_and_changed_chunks(tmp_path):
    """A chunk is known by its items: 7 items grown to 10 keep chunks 0 and 1; chunk 2 (items 6
    to 9 now, item 6 before) is sampled again whole, and the old line no longer counts."""
    job(tmp_path).sample(Items(), Scripted)
    grown = Scripted()
    job(tmp_path, items=10).sample(Items(), lambda: grown)
    assert grown.calls == [(["item 6", "item 7", "item 8"], 106), (["item 9"], 109)]
    assert list(job(tmp_path, items=10).records()) == expected(10)


def test_two_shards_cover_every_chunk_once_and_merge_in_item_order(tmp_path):
    one, two = Scripted(), Scripted()
    assert job(tmp_path, items=20).sample(Items(), lambda: two, shard=1, shards=2) == 3  # shard 1 first
    assert job(tmp_path, items=20).sample(Items(), lambda: one, shard=0, shards=2) == 4
    shard0, shard1 = lines(tmp_path / JOURNAL), lines(tmp_path / "journal.shard1.jsonl")
    assert [j.get("chunk") for j in shard0] == [None, 0, 2, 4, 6] and [j.get("chunk") for j in shard1] == [None, 1, 3, 5]
    assert sorted(seed for _, seed in one.calls + two.calls) == [100 + 3 * i for i in range(7)]  # each chunk sampled once
    assert job(tmp_path, items=20).sample(Items(), Scripted, leftover=True) == 0
    single = tmp_path / "single"
    job(single, items=20).sample(Items(), Scripted)
    assert list(job(tmp_path, items=20).records()) == list(job(single, items=20).records()) == expected(20)


def test_a_dead_shard_is_sampled_by_the_main_process_and_first_offsets_the_shards(tmp_path, caplog):
    job(tmp_path, first=1).sample(Items(), Scripted, shard=1, shards=2)  # chunks 0 and 2: (1 + i) mod 2 == 1
    assert [j.get("chunk") for j in lines(tmp_path / "journal.shard1.jsonl")] == [None, 0, 2]
    late = Scripted()
    with caplog.at_level("WARNING", logger="r1kit"):
        assert job(tmp_path, first=1).sample(Items(), lambda: late, leftover=True) == 1
    assert "1 chunks of other processes are not journaled" in caplog.text
    assert late.calls == [(["item 3", "item 4", "item 5"], 103)]
    assert list(job(tmp_path).records()) == expected()
