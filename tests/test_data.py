"""Stage data: several sources in one stage, renamed columns, row filters, assigned columns, and
local files whose rows have different keys."""

from __future__ import annotations

import json
import types

import pytest

from r1kit.config import DataConfig, from_dict
from r1kit.data import load_rows, load_source
from r1kit.errors import DataError, RecipeError

CTX = types.SimpleNamespace(resolve_data_source=lambda source: source, recipe=types.SimpleNamespace(seed=0))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_rows_with_different_keys_keep_every_column(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"id": 1, "answer": "2"}, {"id": 2, "tests": "assert True"}])
    assert load_source(path).to_list() == [{"id": 1, "answer": "2", "tests": None}, {"id": 2, "answer": None, "tests": "assert True"}]


def test_data_files_read_as_written_or_refused_in_one_line(tmp_path):
    """A byte-order mark is no data; broken JSON, a corrupt parquet file, an empty list and a
    column of several types are one-line errors naming the file (they were tracebacks)."""
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "p"}\n')
    (tmp_path / "bom.json").write_bytes(b'\xef\xbb\xbf[{"prompt": "p"}]')
    assert load_source(str(tmp_path / "bom.jsonl")).to_list() == load_source(str(tmp_path / "bom.json")).to_list() == [{"prompt": "p"}]
    (tmp_path / "comma.json").write_text('[{"prompt": "p"},]')
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    write_jsonl(tmp_path / "mixed.jsonl", [{"prompt": "p", "answer": "7"}, {"prompt": "q", "answer": 7}])
    for name, message in [("comma.json", "not valid JSON"), ("empty.json", "the file has no rows"), ("bad.parquet", "not a readable parquet file"),
                          ("mixed.jsonl", "column 'answer' holds values of different types across rows")]:
        with pytest.raises(DataError, match=f"{tmp_path / name}: {message}"):
            load_source(str(tmp_path / name))


def test_math_and_code_sources_join_with_renamed_filtered_and_assigned_columns(tmp_path):
    math = write_jsonl(tmp_path / "math.jsonl", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}])
    code = write_jsonl(tmp_path / "code.jsonl", [
        {"prompt": "Sum a and b.", "official_tests": [{"input": "1 2", "output": "3"}], "language": "python", "checker": None},
        {"prompt": "Sum in C++.", "official_tests": [{"input": "1 2", "output": "3"}], "language": "cpp", "checker": None},
        {"prompt": "Any order.", "official_tests": [{"input": "1 2", "output": "3"}], "language": "python", "checker": "x"},
    ])
    section = {
        "source": math, "prompt": "problem", "assign": {"task": "math"},
        "also": [{"source": code, "prompt": "prompt", "columns": {"test_cases": "official_tests"},
                  "where": {"language": "python", "checker": [None, ""]}, "assign": {"task": "code"}}],
    }
    rows = load_rows(from_dict(DataConfig, section, "rl.data"), CTX).to_list()
    assert [(r["problem"], r["task"], r["answer"]) for r in rows] == [("1+1?", "math", "2"), ("2+2?", "math", "4"), ("Sum a and b.", "code", None)]
    assert rows[2]["test_cases"] == [{"input": "1 2", "output": "3"}] and rows[0]["test_cases"] is None
    assert "official_tests" not in rows[0] and "prompt" not in rows[0]


def test_bad_data_sections_name_the_field(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "p", "language": "cpp"}])
    with pytest.raises(DataError, match=r"data.where needs column 'lang'; the data has prompt, language"):
        load_rows(DataConfig(source=path, where={"lang": "python"}), CTX)
    with pytest.raises(DataError, match=r"no rows match data.where \{'language': 'python'\}"):
        load_rows(DataConfig(source=path, where={"language": "python"}), CTX)
    with pytest.raises(DataError, match="data.columns needs column 'official_tests'"):
        load_rows(DataConfig(source=path, columns={"test_cases": "official_tests"}), CTX)
    with pytest.raises(RecipeError, match=r"rl.data.also\[0\]: unknown key 'sorce'"):
        from_dict(DataConfig, {"source": path, "also": [{"sorce": path}]}, "rl.data")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"data": {"source": "rejecton"}}, "sft.data.source: no stage named 'rejecton' (did you mean 'rejection'?); a hub dataset id has the form org/name"),
        ({"data": {"source": "data/missing.jsonl"}}, "sft.data.source: no such file 'data/missing.jsonl'"),
        ({"data": {"source": "task:last_digits"}}, "sft.data: task:last_digits: unknown task (did you mean 'last_digit'?)"),
        ({"data": {"source": "task:last_digit", "task": {"term": 3}}}, "sft.data: task:last_digit: got an unexpected keyword argument 'term'; it takes n, terms, seed, direct"),
        ({"data": {"source": "task:mix", "task": {"functions": {"n": 5}, "chains": {"n": 5}}}}, "task:mix: 'chains' is not a task to mix"),
        ({"data": {"source": "task:chain", "also": [{"source": "task:functions", "task": {"digits": 2}}]}}, "sft.data.also[0]: task:functions: got an unexpected keyword argument 'digits'"),
        ({"model": "./no/such/model"}, "sft.model: no such model folder or file './no/such/model'"),
        ({"data": {"source": "task:addition", "task": {"n": 0}}}, "sft.data: task:addition: n must be a whole number of at least 1, got 0"),
        ({"data": {"source": "task:chain", "task": {"terms": 0}}}, "sft.data: task:chain: terms must be a whole number of at least 1, got 0"),
    ],
)
def test_validate_refuses_what_can_be_known_without_loading(write_recipe, capsys, change, message):
    from r1kit.cli import main

    rejection = {"name": "rejection", "kind": "rejection", "data": {"source": "task:chain"}, "rewards": [{"name": "math_accuracy"}]}
    sft = {"name": "sft", "kind": "sft", "data": {"source": "rejection"}, **change}
    assert main(["validate", str(write_recipe({"model": "tiny", "stages": [rejection, sft]}))]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
