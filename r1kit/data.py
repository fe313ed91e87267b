"""Loading stage data: hub datasets or local .jsonl / .json / .parquet files, checked up front.

`load_rows(data, ctx)` returns a `datasets.Dataset`, after resolving an earlier stage's name to
the dataset it wrote and keeping the first ``limit`` rows. `require_columns` turns a missing
column into one line naming the source, the column and the columns that exist.

Not here: prompt formatting (r1kit.templates) and stage-specific column logic (each stage).
"""

from __future__ import annotations

import json
from pathlib import Path

from r1kit.config import DataConfig
from r1kit.errors import DataError

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def is_local(source: str) -> bool:
    return source.endswith(LOCAL_SUFFIXES) or source.startswith(("/", "./", "../"))


def parse_jsonl(lines, source) -> list[dict]:
    """Rows of JSON-lines text; a bad line is an error naming the source and the line."""
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{source}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{source}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
        rows.append(row)
    return rows


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file."""
    with open(path) as f:
        return parse_jsonl(f, path)


def load_source(source: str, split: str = "train", subset: str | None = None):
    """A `datasets.Dataset` from a local file or a hub dataset id."""
    import datasets

    if is_local(source):
        path = Path(source)
        if not path.is_file():
            raise DataError(f"{source}: no such data file")
        if path.suffix == ".parquet":
            return datasets.Dataset.from_parquet(str(path))
        if path.suffix == ".json":
            rows = json.loads(path.read_text())
            if not isinstance(rows, list):
                raise DataError(f"{source}: a .json data file holds a list of objects")
            return datasets.Dataset.from_list(rows)
        rows = read_jsonl(path)
        if not rows:
            raise DataError(f"{source}: the file has no rows")
        return datasets.Dataset.from_list(rows)
    return datasets.load_dataset(source, subset, split=split)


def load_rows(data: DataConfig, ctx):
    """The stage's rows: an earlier stage's dataset or the configured source, limited if asked."""
    import datasets

    if data.source.startswith("task:"):
        from r1kit.tasks import generate

        ds = datasets.Dataset.from_list(generate(data.source[5:], data.split, {"seed": ctx.recipe.seed, **data.task}))
    else:
        ds = load_source(ctx.resolve_data_source(data.source), data.split, data.subset)
    if data.limit is not None:
        ds = ds.select(range(min(data.limit, len(ds))))
    return ds


def require_columns(ds, columns: list[str], source: str, what: str) -> None:
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise DataError(
            f"{source}: {what} needs column {missing[0]!r}; the data has {', '.join(ds.column_names)} "
            f"(rename it in the data: section, e.g. prompt: <column>)"
        )
