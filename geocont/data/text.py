"""Language-model data: a corpus -> tokens (bytes or a local BPE) -> in-memory blocks of `seq_len`.

Corpora (`data.name`):
- `stdlib`: the embedded default, no network. The running Python's standard-library `.py` files,
  read in sorted path order, skipping tests, site-packages and generated codec tables
  (`encodings/`), capped at the first STDLIB_MAX_BYTES (8 MiB: a real, varied corpus on every
  machine that loads and tokenizes in about a second, and stays about the same size across Python
  versions).
- `text`: every non-hidden file under `data.path` (UTF-8, undecodable bytes replaced), sorted.
- `wikitext103`: see wikitext.py (official train / validation splits).

stdlib and text are split train/val by file with a fixed seed (SPLIT_SEED), val taking files up to
`data.val_fraction` of the bytes: every run sees the same val set, so val/ppl compares across
seeds and configs, and a BPE is trained once per corpus; `train.seed` sets the batch order.

Tokenizers (`data.tokenizer`): `bytes` (vocab 256) or `bpe`, a byte-level BPE of
`data.vocab_size` trained with the `tokenizers` package on the train split only, with an
end-of-text token between files.

Tokenized corpora are cached under <cache>/text/<entry>, where <cache> is $GEOCONT_CACHE if set, else
the results store's `.cache` folder (shared storage on a cluster: every node reuses one BPE), else
~/.cache/geocont. Entries are keyed
by a hash of the source files (path, size, mtime), the split and the tokenizer settings; entries are
written to a temporary folder and renamed into place, so concurrent runs never read a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor

from geocont.config import ConfigError, DataConfig
from geocont.data import wikitext
from geocont.data.batches import TensorBatches, trainer_device

STDLIB_MAX_BYTES = 8 * 2**20
STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings"}
SPLIT_SEED = 0
EOT = "<|endoftext|>"
BYTE_VOCAB = 256
CACHE_VERSION = 1  # bump when the tokenized format changes


def cache_root(default: Path | None = None) -> Path:
    """Where tokenized corpora live: $GEOCONT_CACHE, else `default` (the store's cache), else ~/.cache/geocont."""
    return Path(os.environ.get("GEOCONT_CACHE") or default or Path.home() / ".cache" / "geocont")


# ---------------------------------------------------------------------------------------------
# Corpora: where the text comes from and how it splits


@dataclass(frozen=True)
class Corpus:
    """A source of train and val text. `identity` is what the cache key hashes (never the text)."""

    name: str
    identity: dict
    train: Callable[[], Iterator[str]]
    val: Callable[[], Iterator[str]]
    documents: bool = True  # pieces are whole documents (files): BPE separates them with EOT


def _read(files: list[Path]) -> Iterator[str]:
    for f in files:
        yield f.read_text(encoding="utf-8", errors="replace")


def _file_identity(root: Path, files: list[Path]) -> list[tuple[str, int, int]]:
    return [(f.relative_to(root).as_posix(), (st := f.stat()).st_size, st.st_mtime_ns) for f in files]


def split_by_file(files: list[Path], val_fraction: float) -> tuple[list[Path], list[Path]]:
    """(train, val) file lists, each in the input order. Val takes the files, in a fixed shuffled order,
    that fit in `val_fraction` of the bytes (so one large file cannot swell it); with none that fit,
    the smallest file. Both sides get at least one file when there are two."""
    sizes = [f.stat().st_size for f in files]
    order = list(range(len(files)))
    random.Random(SPLIT_SEED).shuffle(order)
    target, held, val = val_fraction * sum(sizes), 0, set()
    for i in order:
        if held + sizes[i] <= target:
            val.add(i)
            held += sizes[i]
    if not val:
        val.add(min(order, key=lambda i: sizes[i]))
    return [f for i, f in enumerate(files) if i not in val], [f for i, f in enumerate(files) if i in val]


def _file_corpus(name: str, root: Path, files: list[Path], val_fraction: float) -> Corpus:
    train, val = split_by_file(files, val_fraction)
    identity = {"train": _file_identity(root, train), "val": _file_identity(root, val)}  # the split itself
    return Corpus(name, identity, lambda: _read(train), lambda: _read(val))


def stdlib_files(root: Path | None = None, max_bytes: int | None = None) -> list[Path]:
    """The stdlib's .py files in sorted order, minus STDLIB_SKIP folders, up to max_bytes (STDLIB_MAX_BYTES)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    max_bytes = STDLIB_MAX_BYTES if max_bytes is None else max_bytes
    candidates = sorted(
        (f for f in root.rglob("*.py") if not STDLIB_SKIP & set(f.relative_to(root).parts[:-1])),
        key=lambda f: f.relative_to(root).as_posix(),
    )
    files, total = [], 0
    for f in candidates:
        size = f.stat().st_size
        if total + size > max_bytes:
            break
        files.append(f)
        total += size
    return files


def folder_files(root: Path) -> list[Path]:
    """Every regular, non-hidden file under root, in sorted path order."""
    files = [
        f for f in root.rglob("*") if f.is_file() and not any(p.startswith(".") for p in f.relative_to(root).parts)
    ]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def check_source(data: DataConfig) -> None:
    """Cheap checks of user input, before anything is read or written (ConfigError, one line each)."""
    problems = []
    if data.tokenizer == "bpe" and data.vocab_size <= BYTE_VOCAB + 1:
        problems.append(
            f"data.vocab_size: {data.vocab_size} is too small for bpe; it must exceed {BYTE_VOCAB + 1} "
            "(256 byte tokens + end-of-text)"
        )
    if data.name == "text":
        root = Path(data.path)
        if not root.is_dir():
            problems.append(f"data.path: {root} is not a folder (data.name 'text' reads a folder of text files)")
        elif len(folder_files(root)) < 2:
            problems.append(f"data.path: {root} needs at least 2 files (train and val are split by file)")
    if data.name == "wikitext103" and data.path is not None:
        wikitext.local_files(data.path)  # raises its own ConfigError
    if data.name not in ("stdlib", "text", "wikitext103"):
        problems.append(f"data.name: '{data.name}' is not a text corpus; allowed: stdlib, text, wikitext103")
    if problems:
        raise ConfigError(problems)


def make_corpus(data: DataConfig, cache: Path | None = None) -> Corpus:
    if data.name == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return _file_corpus("stdlib", root, stdlib_files(root), data.val_fraction)
    if data.name == "text":
        root = Path(data.path).resolve()
        return _file_corpus("text", root, folder_files(root), data.val_fraction)
    return _wikitext_corpus(data.path, cache)


def _wikitext_corpus(path: str | None, cache: Path | None) -> Corpus:
    if path is None:
        identity = {"hub": f"{wikitext.HUB_NAME}/{wikitext.HUB_CONFIG}"}
    else:
        root = Path(path).resolve()
        _, files = wikitext.local_files(root)
        identity = {"files": _file_identity(root, [f for split in files.values() for f in split])}
    splits: dict = {}

    def split(name: str) -> Iterator[str]:
        if not splits:  # load once, only on a cache miss
            splits.update(wikitext.load_splits(path, cache_root(cache) / "hf-datasets"))
        return wikitext.iter_text(splits[name])

    return Corpus("wikitext103", identity, lambda: split("train"), lambda: split("validation"), documents=False)


# ---------------------------------------------------------------------------------------------
# Tokenizers: text pieces -> one flat token array per split


def encode_bytes(pieces: Iterable[str]) -> np.ndarray:
    return np.frombuffer(b"".join(p.encode("utf-8") for p in pieces), dtype=np.uint8)


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(["data.tokenizer: bpe needs the `tokenizers` package: pip install 'geocont[text]'"]) from None
    return tokenizers


def train_bpe(pieces: Iterable[str], vocab_size: int):
    """A byte-level BPE (GPT-2 style pre-tokenizer) with one special token, EOT, trained on `pieces`."""
    tok = _tokenizers().ByteLevelBPETokenizer()
    tok.train_from_iterator(pieces, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT], show_progress=False)
    return tok


def encode_bpe(tok, pieces: Iterable[str], documents: bool, chunk: int = 256) -> np.ndarray:
    """int32 token ids of all pieces in order; EOT after each piece when pieces are whole documents."""
    eot = tok.token_to_id(EOT)
    parts, batch = [], []

    def flush():
        for enc in tok.encode_batch(batch):
            parts.append(np.asarray(enc.ids + ([eot] if documents else []), dtype=np.int32))
        batch.clear()

    for piece in pieces:
        batch.append(piece)
        if len(batch) == chunk:
            flush()
    flush()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


# ---------------------------------------------------------------------------------------------
# The cache: one folder per (corpus, split, tokenizer)


@dataclass(frozen=True)
class Tokens:
    train: np.ndarray  # flat token ids: uint8 for bytes, int32 for bpe (compact; batches become int64)
    val: np.ndarray
    vocab_size: int


def cache_entry(corpus: Corpus, data: DataConfig, cache: Path | None = None) -> Path:
    key = {
        "version": CACHE_VERSION,
        "corpus": corpus.name,
        "identity": corpus.identity,
        "tokenizer": data.tokenizer,
        "vocab_size": data.vocab_size if data.tokenizer == "bpe" else BYTE_VOCAB,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root(cache) / "text" / f"{corpus.name}-{data.tokenizer}-{digest}"


def _build(corpus: Corpus, data: DataConfig, out: Path) -> None:
    if data.tokenizer == "bytes":
        train, val, vocab = encode_bytes(corpus.train()), encode_bytes(corpus.val()), BYTE_VOCAB
    else:
        tok = train_bpe(corpus.train(), data.vocab_size)
        tok.save(str(out / "tokenizer.json"))
        train = encode_bpe(tok, corpus.train(), corpus.documents)
        val = encode_bpe(tok, corpus.val(), corpus.documents)
        vocab = tok.get_vocab_size()
    np.save(out / "train.npy", train)
    np.save(out / "val.npy", val)
    meta = {"vocab_size": vocab, "train_tokens": len(train), "val_tokens": len(val), "corpus": corpus.name}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def load_tokens(data: DataConfig, cache: Path | None = None) -> Tokens:
    """The corpus's tokens from the cache, tokenizing (and training a BPE) on a miss."""
    check_source(data)
    corpus = make_corpus(data, cache)
    entry = cache_entry(corpus, data, cache)
    if not (entry / "meta.json").is_file():
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        try:
            _build(corpus, data, tmp)
            os.replace(tmp, entry)
        except OSError:
            if not (entry / "meta.json").is_file():  # not a lost race with another run: a real failure
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((entry / "meta.json").read_text())
    return Tokens(np.load(entry / "train.npy"), np.load(entry / "val.npy"), meta["vocab_size"])


def load_tokenizer(data: DataConfig, cache: Path | None = None):
    """The cached BPE of this corpus and config (None for bytes): for decoding samples."""
    if data.tokenizer == "bytes":
        return None
    load_tokens(data, cache)
    entry = cache_entry(make_corpus(data, cache), data, cache)
    return _tokenizers().Tokenizer.from_file(str(entry / "tokenizer.json"))


# ---------------------------------------------------------------------------------------------
# Blocks and the data module


def blocks(tokens: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """(x, y), both (N, seq_len) views of one flat tensor: N non-overlapping blocks, y = x shifted by one."""
    n = (len(tokens) - 1) // seq_len
    x = tokens[: n * seq_len].view(n, seq_len)
    y = tokens[1 : n * seq_len + 1].view(n, seq_len)
    return x, y


class LongBatches(TensorBatches):
    """TensorBatches over compact token storage (uint8 / int32), handing out int64 batches."""

    def __iter__(self):
        for x, y in super().__iter__():
            yield x.long(), y.long()


class TextDataModule(pl.LightningDataModule):
    """(x, y) LongTensor batches of shape (batch_size, seq_len) with y = x shifted by one token."""

    def __init__(self, data: DataConfig, batch_size: int, seed: int, cache: Path | None = None):
        super().__init__()
        check_source(data)
        self.data, self.batch_size, self.seed, self.cache = data, batch_size, seed, cache
        self.tokens: Tokens | None = None
        self.train_xy = self.val_xy = None

    @property
    def vocab_size(self) -> int:
        if self.data.tokenizer == "bytes":
            return BYTE_VOCAB
        self.setup()
        return self.tokens.vocab_size

    def prepare_data(self) -> None:
        if self.tokens is None:  # tokenizes into the cache once (Lightning calls this on one process)
            load_tokens(self.data, self.cache)

    def setup(self, stage: str | None = None) -> None:
        if self.tokens is not None:
            return
        tokens = load_tokens(self.data, self.cache)
        T = self.data.seq_len
        train_xy = blocks(torch.from_numpy(tokens.train), T)
        val_xy = blocks(torch.from_numpy(tokens.val), T)
        problems = []
        if len(train_xy[0]) < self.batch_size:
            problems.append(
                f"data.seq_len: the train split ({len(tokens.train)} tokens) holds {len(train_xy[0])} blocks of "
                f"{T}, fewer than one batch (train.batch_size {self.batch_size}); use a shorter seq_len, a smaller "
                "batch or more text"
            )
        if len(val_xy[0]) == 0:
            problems.append(
                f"data.seq_len: the val split ({len(tokens.val)} tokens) is shorter than one block of {T}; "
                "raise data.val_fraction or shorten data.seq_len"
            )
        if problems:
            raise ConfigError(problems)
        self.tokens, self.train_xy, self.val_xy = tokens, train_xy, val_xy

    def train_dataloader(self) -> LongBatches:
        self.setup()
        device = trainer_device(self)
        return LongBatches(*self.train_xy, self.batch_size, shuffle=True, seed=self.seed, drop_last=True, device=device)

    def val_dataloader(self) -> LongBatches:
        self.setup()
        return LongBatches(*self.val_xy, self.batch_size, shuffle=False, device=trainer_device(self))
