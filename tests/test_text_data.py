"""Text data: folder and stdlib corpora, the by-file split, byte and BPE tokens, the cache, WikiText files."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from geocont.config import ConfigError, DataConfig
from geocont.data import text
from geocont.data.text import EOT, TextDataModule, blocks, load_tokenizer, split_by_file, stdlib_files

LETTERS = "abcdefgh"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GEOCONT_CACHE", str(root))
    return root


@pytest.fixture
def folder(tmp_path) -> Path:
    """Eight files, each one letter repeated (so every token tells its file), of different sizes."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for i, letter in enumerate(LETTERS):
        where = root / "sub" if i % 2 else root
        (where / f"{letter}.txt").write_text(letter * (300 + 50 * i))
    (root / ".hidden").write_text("Z" * 1000)  # hidden files are not corpus text
    return root


def dm(path: Path, **kw) -> TextDataModule:
    batch = kw.pop("batch_size", 4)
    seed = kw.pop("seed", 0)
    return TextDataModule(
        DataConfig(name="text", path=str(path), **{"seq_len": 16, "val_fraction": 0.3, **kw}), batch, seed
    )


def letters_in(tokens: np.ndarray) -> set[str]:
    return set(bytes(tokens.astype(np.uint8)).decode())


def test_folder_batches_are_shifted_long_blocks(folder):
    data = dm(folder)
    data.prepare_data()
    data.setup()
    assert data.vocab_size == 256
    loader = data.train_dataloader()
    assert len(loader) == len(data.train_xy[0]) // 4
    for x, y in loader:
        assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (4, 16)
        torch.testing.assert_close(x[:, 1:], y[:, :-1])
    xv, yv = next(iter(data.val_dataloader()))
    assert xv.dtype == torch.long and xv.shape[1] == 16


def test_blocks_are_views_with_targets_shifted_by_one():
    tokens = torch.arange(23, dtype=torch.uint8)
    x, y = blocks(tokens, 5)
    assert x.shape == y.shape == (4, 5)
    assert x.data_ptr() == tokens.data_ptr()  # no copy of the corpus
    torch.testing.assert_close(y, x + 1)
    assert x[1, 0].item() == 5


def test_split_is_by_file_fixed_and_near_the_fraction(folder):
    a, b = dm(folder, seed=0), dm(folder, seed=7)
    a.setup()
    b.setup()
    train, val = letters_in(a.tokens.train), letters_in(a.tokens.val)
    assert train and val and not train & val  # no file on both sides
    assert train | val == set(LETTERS)  # hidden file skipped, nested files read
    np.testing.assert_array_equal(a.tokens.val, b.tokens.val)  # the split does not follow train.seed ...
    first = next(iter(a.train_dataloader()))[0]
    assert not torch.equal(first, next(iter(b.train_dataloader()))[0])  # ... the batch order does
    torch.testing.assert_close(first, next(iter(dm(folder, seed=0).train_dataloader()))[0])
    fraction = len(a.tokens.val) / (len(a.tokens.val) + len(a.tokens.train))
    assert 0.3 - 650 / 3800 < fraction <= 0.3  # short of the target by less than one file


def test_split_by_file_keeps_both_sides_non_empty(tmp_path):
    files = []
    for i in range(3):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_text("x" * 10)
    for fraction in (0.01, 0.99):
        train, val = split_by_file(files, fraction)
        assert train and val and sorted(train + val) == files


def test_cache_is_reused_and_keyed_by_the_files(folder, cache):
    data = dm(folder)
    data.setup()
    (entry,) = (cache / "text").iterdir()
    stamp = (entry / "meta.json").stat().st_mtime_ns
    dm(folder).setup()
    assert (entry / "meta.json").stat().st_mtime_ns == stamp  # a hit: nothing rebuilt
    (folder / "a.txt").write_text("a" * 999)
    changed = dm(folder)
    changed.setup()
    assert len(list((cache / "text").iterdir())) == 2  # an edited file is a new corpus
    assert len(changed.tokens.train) + len(changed.tokens.val) == len(data.tokens.train) + len(data.tokens.val) + 699
    assert not [p for p in (cache / "text").iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_bpe_round_trips_and_separates_files(tmp_path, cache):
    root = tmp_path / "prose"
    root.mkdir()
    words = "the quick brown fox jumps over the lazy dog while the cat sleeps".split()
    for i in range(6):
        (root / f"{i}.txt").write_text(" ".join(words[(i + j) % len(words)] for j in range(400)) + "\n")
    data = dm(root, tokenizer="bpe", vocab_size=300, seq_len=8, val_fraction=0.2)
    data.setup()
    assert 257 < data.vocab_size <= 300
    assert data.tokens.train.dtype == np.int32 and data.tokens.train.max() < data.vocab_size
    tok = load_tokenizer(data.data)
    eot = tok.token_to_id(EOT)
    pieces = np.split(data.tokens.train, np.flatnonzero(data.tokens.train == eot) + 1)
    decoded = [tok.decode(p[:-1].tolist()) for p in pieces if len(p)]
    assert set(decoded) <= {(root / f"{i}.txt").read_text() for i in range(6)}
    assert len(decoded) == 6 - len(np.flatnonzero(data.tokens.val == eot))
    assert len(data.tokens.train) < 0.5 * sum(len(d) for d in decoded)  # merges happened
    assert any(p.suffix == ".json" and p.name == "tokenizer.json" for p in (cache / "text").rglob("*"))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(path="/nonexistent/folder"), "is not a folder"),
        (dict(tokenizer="bpe", vocab_size=200), "data.vocab_size"),
    ],
    ids=["missing-folder", "bpe-vocab-too-small"],
)
def test_bad_input_is_a_config_error(kw, message, tmp_path):
    # a folder of its own: the checks walk it, and a shared /tmp changes under the walk (other processes)
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("x" * 100)
    with pytest.raises(ConfigError) as err:
        TextDataModule(DataConfig(**{"name": "text", "path": str(tmp_path), **kw}), 4, 0)
    assert message in str(err.value)


def test_one_file_cannot_be_split(tmp_path):
    (tmp_path / "only.txt").write_text("x" * 1000)
    with pytest.raises(ConfigError, match="at least 2 files"):
        dm(tmp_path)


def test_blocks_longer_than_the_val_split_are_a_config_error(folder, cache):
    with pytest.raises(ConfigError, match="data.seq_len"):
        dm(folder, seq_len=2000).setup()


def test_stdlib_files_are_sorted_capped_and_skip_tests():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root, max_bytes=2**20)
    rel = [f.relative_to(root).as_posix() for f in files]
    assert rel == sorted(rel) and all(r.endswith(".py") for r in rel)
    assert not any({"test", "tests", "site-packages", "encodings"} & set(r.split("/")[:-1]) for r in rel)
    assert sum(f.stat().st_size for f in files) <= 2**20
    assert len(stdlib_files(root)) > len(files)


def test_stdlib_datamodule(monkeypatch):
    monkeypatch.setattr(text, "STDLIB_MAX_BYTES", 2**20)  # the same code path, a quarter of the reading
    data = TextDataModule(DataConfig(name="stdlib", seq_len=64), batch_size=8, seed=0)
    data.setup()
    total = len(data.tokens.train) + len(data.tokens.val)
    assert 0.9 * 2**20 < total <= 2**20
    assert 0.12 <= len(data.tokens.val) / total <= 0.15
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == (8, 64) and b"def " in bytes(data.tokens.train[:20000].tobytes())


# ---------------------------------------------------------------------------------------------
# WikiText-103 files in the Hugging Face and original layouts

WIKI = {
    "train": ["", " = Valkyria Chronicles III = \n", "", " Senjō no Valkyria 3 is a tactical game . \n", ""] * 20,
    "validation": ["", " = Homarus gammarus = \n", "", " Homarus gammarus is a lobster . \n"] * 10,
}


def test_wikitext_parquet_layout(tmp_path):
    folder = tmp_path / "wikitext-103-raw-v1"
    folder.mkdir()
    for split, rows in WIKI.items():
        pl.DataFrame({"text": rows}).write_parquet(folder / f"{split}-00000-of-00001.parquet")
    data = TextDataModule(DataConfig(name="wikitext103", path=str(tmp_path), seq_len=16), batch_size=2, seed=0)
    data.setup()
    assert bytes(data.tokens.train.tobytes()).decode() == "".join(WIKI["train"])
    assert bytes(data.tokens.val.tobytes()).decode() == "".join(WIKI["validation"])
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == (2, 16) and x.dtype == torch.long


def test_wikitext_raw_layout_with_bpe(tmp_path):
    names = {"train": "wiki.train.raw", "validation": "wiki.valid.raw"}
    for split, rows in WIKI.items():
        (tmp_path / names[split]).write_text("".join(r or " \n" for r in rows))
    cfg = DataConfig(name="wikitext103", path=str(tmp_path), seq_len=8, tokenizer="bpe", vocab_size=320)
    data = TextDataModule(cfg, batch_size=2, seed=0)
    data.setup()
    tok = load_tokenizer(cfg)
    assert tok.decode(data.tokens.val.tolist()) == "".join(r or " \n" for r in WIKI["validation"])
    assert tok.token_to_id(EOT) not in data.tokens.train  # a stream of lines, not separate documents


def test_wikitext_folder_without_its_files_is_a_config_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="wiki.train.raw"):
        TextDataModule(DataConfig(name="wikitext103", path=str(tmp_path)), batch_size=2, seed=0)


def test_a_run_caches_its_tokens_in_the_store_unless_geocont_cache_says_otherwise(folder, tmp_path, monkeypatch):
    # a cluster's nodes share the store, not their home folders: one tokenization serves every node
    from geocont.config import resolve
    from geocont.train import train

    monkeypatch.delenv("GEOCONT_CACHE")
    cfg = resolve(
        {
            "model": {"kind": "transformer", "depth": 2, "width": 16, "heads": 2, "kv_heads": 2, "mlp_width": 32},
            "data": {"name": "text", "path": str(folder), "seq_len": 16, "val_fraction": 0.3},
            "train": {"epochs": 1, "batch_size": 4, "max_steps": 2},
            "tracking": {"wandb": {"mode": "disabled"}, "tensorboard": False},
        }
    )
    store = tmp_path / "store"
    assert train(cfg, store, progress=False).status == "completed"
    assert len(list((store / ".cache" / "text").glob("text-bytes-*/meta.json"))) == 1
    from geocont.store import sweep_names

    assert sweep_names(store) == ["single"]  # the cache is not taken for a sweep
