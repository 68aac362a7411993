"""Document sources: where the text comes from, split into train/val and into data streams.

A run reads ``n_streams`` disjoint data streams (one per rank of the run that started the
lineage; see ``nsa/train/data.py`` for why streams outlive world-size changes). A source
yields the documents of one stream and one split, from a given document count on, so a
resume re-opens the stream exactly where a checkpoint says.

- ``stdlib``: the Python standard library's ``.py`` files, sorted, then trained in a seeded
  order per epoch: real text on every machine.
- ``synthetic``: a seeded Markov chain over 64 byte values: learnable, not uniform noise.
- ``files`` and ``fineweb-edu``: one code path through ``datasets`` streaming and
  ``split_dataset_by_node``; fineweb-edu passes the Hub id, files pass local data files.

Validation is every ``val_every_n_docs``-th document (index ``n-1, 2n-1, ...``), never trained on.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nsa.config import DataConfig

Doc = str | np.ndarray  # text to tokenize, or ready token ids (synthetic)
FINEWEB_EDU_HUB_ID = "HuggingFaceFW/fineweb-edu"


class DataSourceError(RuntimeError):
    """The configured data cannot be read (no files, missing text column, empty split)."""


class DocSource(Protocol):
    description: str

    def docs(self, stream: int, n_streams: int, split: str, start: int, epoch: int) -> Iterator[Doc]:
        """Documents of ``split`` in ``stream`` (of ``n_streams``), skipping the first ``start``."""
        ...


def _is_val(index: int, every: int) -> bool:
    return index % every == every - 1


class IndexedSource:
    """A source whose documents have a global index: stdlib files, synthetic documents."""

    def __init__(self, description: str, n_docs: int, val_every: int, load: Callable[[int], Doc],
                 shuffle_seed: int | None = None) -> None:
        self.description = description
        self.n_docs = n_docs
        self.val_every = val_every
        self._load = load
        self.shuffle_seed = shuffle_seed  # None: file order; else a seeded order per epoch

    def split_size(self, split: str) -> int:
        n_val = self.n_docs // self.val_every
        return n_val if split == "val" else self.n_docs - n_val

    def global_index(self, split: str, m: int) -> int:
        """Index of the ``m``-th document of ``split`` (val: n-1, 2n-1, ...; train: the rest)."""
        n = self.val_every
        return m * n + n - 1 if split == "val" else m + m // (n - 1)

    def order(self, split: str, epoch: int) -> np.ndarray | range:
        """The training split in a seeded order, fresh each epoch (sorted files would feed one
        package after another); validation always in index order (the same batches each eval)."""
        size = self.split_size(split)
        if self.shuffle_seed is None or split == "val":
            return range(size)
        return np.random.default_rng([self.shuffle_seed, epoch]).permutation(size)

    def docs(self, stream: int, n_streams: int, split: str, start: int, epoch: int) -> Iterator[Doc]:
        order = self.order(split, epoch)
        for j in range(stream + start * n_streams, len(order), n_streams):
            yield self._load(self.global_index(split, int(order[j])))


def stdlib_files() -> list[Path]:
    """The standard library's own ``.py`` files (no site-packages), sorted for determinism."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        skip = ("site-packages", "dist-packages", "__pycache__")
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        out.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(out, key=lambda p: str(p.relative_to(root)))


def stdlib_source(val_every: int, seed: int = 0) -> IndexedSource:
    files = stdlib_files()
    if not files:
        raise DataSourceError(f"no .py files under {sysconfig.get_paths()['stdlib']}")

    def load(i: int) -> str:
        return files[i].read_text(encoding="utf-8", errors="replace")

    return IndexedSource(f"stdlib ({len(files)} files under {sysconfig.get_paths()['stdlib']})",
                         len(files), val_every, load, shuffle_seed=seed)


class MarkovChain:
    """A fixed random first-order chain over 64 byte values; each state has 4 successors
    with probabilities 0.7/0.1/0.1/0.1, so the best possible loss is ~0.94 nats, far below
    the ln(64) = 4.16 of noise."""

    ALPHABET = 64
    BASE = 32  # printable ASCII 32..95

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng([seed, 0xC0FFEE])
        self.succ = np.stack([rng.choice(self.ALPHABET, size=4, replace=False) for _ in range(self.ALPHABET)])
        self.probs = np.array([0.7, 0.1, 0.1, 0.1])
        # the walk in plain lists: numpy's per-element indexing made a document ~10x slower,
        # Python time on the loader thread that holds the GIL while the step launches kernels
        self._succ = self.succ.tolist()

    def document(self, index: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng([seed, index])
        n = int(rng.integers(64, 1024))
        picks = rng.choice(4, size=n, p=self.probs).tolist()
        state = int(rng.integers(self.ALPHABET))
        succ, out = self._succ, [0] * n
        for t, pick in enumerate(picks):
            state = succ[state][pick]
            out[t] = state
        return np.asarray(out, dtype=np.int32) + self.BASE


def synthetic_source(seed: int, val_every: int) -> IndexedSource:
    chain = MarkovChain(seed)
    return IndexedSource(f"synthetic (Markov chain, seed {seed})", 1 << 24, val_every,
                         lambda i: chain.document(i, seed))


def _builder_for(files: list[str]) -> str:
    exts = {Path(f).suffix.lower() for f in files}
    builders = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
    unknown = sorted(exts - set(builders))
    if unknown:
        raise DataSourceError(f"data.paths: unsupported file type {unknown[0]!r} (.jsonl, .parquet, .txt)")
    kinds = {builders[e] for e in exts}
    if len(kinds) != 1:
        raise DataSourceError(f"data.paths: mixed file types {sorted(exts)}; use one kind per run")
    return kinds.pop()


def expand_paths(patterns: list[str]) -> list[str]:
    """Globs to a sorted file list; a pattern that matches nothing is an error, not skipped."""
    out: list[str] = []
    for pat in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pat), recursive=True))
        if not hits:
            raise DataSourceError(f"data.paths: {pat!r} matches no file")
        out.extend(h for h in hits if os.path.isfile(h))
    return sorted(dict.fromkeys(out))


class StreamingSource:
    """``datasets`` streaming: FineWeb-Edu from the Hub or local files, one code path."""

    def __init__(self, builder: str, *, name: str | None = None, data_files: list[str] | None = None,
                 text_field: str = "text", val_every: int = 100, shuffle_buffer: int = 0,
                 seed: int = 0, description: str = "") -> None:
        self.builder, self.name, self.data_files = builder, name, data_files
        self.text_field, self.val_every = text_field, val_every
        self.shuffle_buffer, self.seed = shuffle_buffer, seed
        self.description = description or builder

    def open(self, stream: int, n_streams: int, epoch: int) -> Any:  # a datasets.IterableDataset
        """The stream's shard: every rank of a lineage reads a disjoint part."""
        import datasets
        from datasets.distributed import split_dataset_by_node

        kwargs: dict = {"split": "train", "streaming": True}
        if self.name:
            kwargs["name"] = self.name
        if self.data_files:
            kwargs["data_files"] = self.data_files
        if self.builder == "text":
            kwargs["sample_by"] = "document"  # one file, one document (not one per line)
        ds = datasets.load_dataset(self.builder, **kwargs)
        if ds.column_names is not None and self.text_field not in ds.column_names:
            raise DataSourceError(f"{self.description}: no column {self.text_field!r} (data.text_field); "
                                  f"columns: {ds.column_names}")
        ds = ds.select_columns([self.text_field])
        if self.shuffle_buffer > 0:
            ds = ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
        ds.set_epoch(epoch)
        if n_streams > 1:
            ds = split_dataset_by_node(ds, rank=stream, world_size=n_streams)
        return ds

    def docs(self, stream: int, n_streams: int, split: str, start: int, epoch: int) -> Iterator[Doc]:
        want_val = split == "val"
        seen = 0
        for k, example in enumerate(self.open(stream, n_streams, epoch)):
            if _is_val(k, self.val_every) != want_val:
                continue
            seen += 1
            if seen <= start:
                continue
            text = example[self.text_field]
            if text is None:
                raise DataSourceError(f"{self.description}: document {k} of stream {stream} has no text")
            yield text


def build_source(cfg: DataConfig) -> DocSource:
    """The source ``data.source`` names; never a silent substitute."""
    if cfg.source == "stdlib":
        return stdlib_source(cfg.val_every_n_docs, cfg.seed)
    if cfg.source == "synthetic":
        return synthetic_source(cfg.seed, cfg.val_every_n_docs)
    if cfg.source == "files":
        files = expand_paths(cfg.paths)
        return StreamingSource(_builder_for(files), data_files=files, text_field=cfg.text_field,
                               val_every=cfg.val_every_n_docs, shuffle_buffer=cfg.shuffle_buffer,
                               seed=cfg.seed, description=f"files ({len(files)}: {files[0]}, ...)")
    return StreamingSource(FINEWEB_EDU_HUB_ID, name=cfg.fineweb_name, text_field=cfg.text_field,
                           val_every=cfg.val_every_n_docs, shuffle_buffer=cfg.shuffle_buffer, seed=cfg.seed,
                           description=f"fineweb-edu ({FINEWEB_EDU_HUB_ID}, {cfg.fineweb_name})")
