"""Loading stage data: hub datasets or local .jsonl / .json / .parquet files, checked up front.

`load_rows(data, ctx)` returns a `datasets.Dataset`, after resolving an earlier stage's name to
the dataset it wrote, renaming ``columns``, keeping the rows that match ``where`` and then the
first ``limit``, setting the ``assign`` columns, and joining the rows of the ``also`` sources. `require_columns` turns a missing
column into one line naming the source, the column and the columns that exist; `columns_lacking` tells, before a run and
without loading a dataset, a column that local .jsonl rows will lack.

Not here: prompt formatting (r1kit.templates) and stage-specific column logic (each stage).
"""

from __future__ import annotations

import json
from pathlib import Path

from r1kit.config import DataConfig
from r1kit.errors import DataError, from_hub

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


def _table(rows: list[dict], source):
    """A `datasets.Dataset` of rows whose keys may differ: every key is a column, null where a
    row lacks it (``Dataset.from_list`` would keep the first row's keys only)."""
    import datasets
    import pyarrow

    keys = list(dict.fromkeys(k for row in rows for k in row))
    try:
        return datasets.Dataset.from_list([{k: row.get(k) for k in keys} for row in rows])
    except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError, pyarrow.ArrowNotImplementedError) as exc:
        column = next((k for k in keys if len({type(r.get(k)) for r in rows if r.get(k) is not None}) > 1), None)
        where = f"column {column!r} holds values of different types across rows" if column else str(exc).splitlines()[0]
        raise DataError(f"{source}: {where}; give each column one type (e.g. quote every answer)") from None


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file."""
    with open(path, encoding="utf-8-sig") as f:  # a byte-order mark, as some editors write, is no data
        return parse_jsonl(f, path)


def load_source(source: str, split: str = "train", subset: str | None = None):
    """A `datasets.Dataset` from a local file or a hub dataset id."""
    import datasets

    if is_local(source):
        path = Path(source)
        if not path.is_file():
            raise DataError(f"{source}: no such data file")
        if path.suffix == ".parquet":
            import pyarrow

            try:
                return datasets.Dataset.from_parquet(str(path))
            except (pyarrow.ArrowException, OSError) as exc:
                raise DataError(f"{source}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
        if path.suffix == ".json":
            try:
                rows = json.loads(path.read_text(encoding="utf-8-sig"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"{source}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise DataError(f"{source}: a .json data file holds a list of objects")
            if not rows:
                raise DataError(f"{source}: the file has no rows")
            return _table(rows, source)
        rows = read_jsonl(path)
        if not rows:
            raise DataError(f"{source}: the file has no rows")
        return _table(rows, source)
    with from_hub(f"dataset {source}", "offline, give a local copy: a .jsonl, .json or .parquet file as the data source "
                  "(r1kit eval: --data-file FILE, or --data NAME=FILE with --suite)"):
        return datasets.load_dataset(source, subset, split=split)


def load_rows(data: DataConfig, ctx):
    """The stage's rows: those of the configured source and of every `also` source after it."""
    import datasets

    parts = [_source_rows(data, ctx)]
    for i, extra in enumerate(data.also):
        if extra.also:
            raise DataError(f"{extra.source}: data.also[{i}] has an `also` of its own; list every source in the first one")
        ds = _source_rows(extra, ctx)
        names = {getattr(extra, c): getattr(data, c) for c in ("prompt", "completion", "messages")}
        ds = ds.rename_columns({old: new for old, new in names.items() if old in ds.column_names and old != new})
        parts.append(ds)
    if len(parts) == 1:
        return parts[0]
    columns = list(dict.fromkeys(c for ds in parts for c in ds.column_names))
    for i, ds in enumerate(parts):
        for c in columns:
            if c not in ds.column_names:
                ds = ds.add_column(c, [None] * len(ds))
        parts[i] = ds.select_columns(columns)
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError as exc:  # a column typed differently in two sources
        sources = ", ".join([data.source, *(e.source for e in data.also)])
        raise DataError(f"{sources}: data.also: a column has different types in these sources ({' '.join(str(exc).split())[:300]})") from None


def _source_rows(data: DataConfig, ctx):
    """One source's rows: an earlier stage's dataset, a task or a dataset; renamed, filtered,
    assigned and limited as its section says."""

    if data.source.startswith("task:"):
        from r1kit.offline.tasks import generate

        ds = _table(generate(data.source[5:], data.split, {"seed": ctx.recipe.seed, **data.task}), data.source)
    elif data.source.startswith("reasoning_gym:"):
        from r1kit.environments import reasoning_gym

        ds = _table(reasoning_gym.rows(data.source.removeprefix("reasoning_gym:"), data.task, seed=ctx.recipe.seed), data.source)
    else:
        ds = load_source(ctx.resolve_data_source(data.source), data.split, data.subset)
    if data.columns:
        require_columns(ds, list(data.columns.values()), data.source, "data.columns")
        taken = [new for new, old in data.columns.items() if new in ds.column_names and new not in data.columns.values()]
        ds = ds.remove_columns(taken).rename_columns({old: new for new, old in data.columns.items() if old != new})
    if data.where:
        require_columns(ds, list(data.where), data.source, "data.where")
        allowed = {k: v if isinstance(v, list) else [v] for k, v in data.where.items()}
        keys = list(allowed)  # read only these columns: others may be large (tests)
        ds = ds.filter(lambda *values: all(v in allowed[k] for k, v in zip(keys, values)), input_columns=keys)
        if not len(ds):
            raise DataError(f"{data.source}: no rows match data.where {data.where}")
    if data.limit is not None:
        ds = ds.select(range(min(data.limit, len(ds))))
    for column, value in data.assign.items():
        if column in ds.column_names:
            ds = ds.remove_columns(column)
        ds = ds.add_column(column, [value] * len(ds))
    return ds


def columns_lacking(data: DataConfig, columns: list[str]) -> tuple[str, list[str]] | None:
    """The first of `columns` that the rows of `data` will lack, with the columns they will have
    (renamed, assigned, joined as the section says), where that is known without loading a dataset:
    every source a local .jsonl file, read until each column is seen. None when none is lacking,
    or when it cannot be told before the run (a hub dataset, a task, an earlier stage's rows)."""
    have: set[str] = set()
    for part in [data, *data.also]:
        path = Path(part.source)
        if path.suffix != ".jsonl" or not path.is_file():
            return None
        keys = _jsonl_keys(path, {part.columns.get(c, c) for c in columns})
        if keys is None:
            return None
        keys = (keys - set(part.columns.values()) - set(part.columns)) | {new for new, old in part.columns.items() if old in keys}
        names = {getattr(part, c): getattr(data, c) for c in ("prompt", "completion", "messages")}  # an also source's take the first's
        have |= {names.get(k, k) for k in keys} | set(part.assign)
    missing = [c for c in columns if c not in have]
    return (missing[0], sorted(have)) if missing else None


def _jsonl_keys(path: Path, wanted: set[str]) -> set[str] | None:
    """The keys of the rows of `path`, read until every `wanted` one is seen; None for a file the run will refuse."""
    keys: set[str] = set()
    try:
        with open(path, encoding="utf-8-sig") as f:
            for line in f:
                row = json.loads(line) if line.strip() else {}
                if not isinstance(row, dict):
                    return None
                keys |= row.keys()
                if wanted <= keys:
                    break
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    return keys


def require_columns(ds, columns: list[str], source: str, what: str) -> None:
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise DataError(
            f"{source}: {what} needs column {missing[0]!r}; the data has {', '.join(ds.column_names)} "
            f"(rename it in the data: section, e.g. prompt: <column>)"
        )
