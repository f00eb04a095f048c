"""WikiText-103 (raw) through the `datasets` package: from the Hugging Face hub, or from local files.

Online, `datasets.load_dataset("Salesforce/wikitext", "wikitext-103-raw-v1")` downloads the parquet
files into the Hugging Face cache (HF_HOME). Offline, `data.path` names a folder holding the same
data in one of two layouts, which go through the same `datasets` code path:
- the hub's parquet files: `train-*.parquet` and `validation-*.parquet` (one `text` column, one row
  per line of the articles, line breaks kept), at any depth, e.g. `wikitext-103-raw-v1/...`;
- the original release: `wiki.train.raw` and `wiki.valid.raw`.
The official validation split is the val set, so `data.val_fraction` does not apply here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from geocont.config import ConfigError

HUB_NAME, HUB_CONFIG = "Salesforce/wikitext", "wikitext-103-raw-v1"
RAW_NAMES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw"}
LINES_PER_PIECE = 10_000  # rows joined per yielded piece: large enough to amortise, small enough for RAM


def local_files(path: str | Path) -> tuple[str, dict[str, list[Path]]]:
    """('parquet' | 'text', split -> files) found under `path`; ConfigError when neither layout is there."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError([f"data.path: {root} is not a folder (expected WikiText-103 parquet or raw files)"])
    parquet = {split: sorted(root.rglob(f"{split}-*.parquet")) for split in RAW_NAMES}
    if all(parquet.values()):
        return "parquet", parquet
    raw = {split: sorted(root.rglob(name)) for split, name in RAW_NAMES.items()}
    if all(raw.values()):
        return "text", raw
    raise ConfigError(
        [
            f"data.path: no WikiText-103 files under {root}; expected train-*.parquet and validation-*.parquet "
            "(the Hugging Face layout) or wiki.train.raw and wiki.valid.raw (the original release)"
        ]
    )


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            ["data.name: wikitext103 needs the `datasets` package: pip install 'geocont[text]'"]
        ) from None
    datasets.disable_progress_bars()
    return datasets


def load_splits(path: str | Path | None, cache_dir: Path):
    """The DatasetDict with `train` and `validation` splits of one `text` column each.

    Local files are converted to Arrow under `cache_dir`; the hub download stays in the Hugging Face
    cache, where other tools find it too.
    """
    datasets = _datasets()
    if path is None:
        try:
            return datasets.load_dataset(HUB_NAME, HUB_CONFIG)
        except Exception as err:  # no network, hub down, gated: say what to do instead
            raise RuntimeError(
                f"could not load {HUB_NAME}/{HUB_CONFIG} from the Hugging Face hub ({type(err).__name__}: {err}); "
                "download its parquet files and set data.path to their folder"
            ) from err
    kind, files = local_files(path)
    data_files = {split: [str(f) for f in paths] for split, paths in files.items()}
    extra = {"keep_linebreaks": True} if kind == "text" else {}
    return datasets.load_dataset(kind, data_files=data_files, cache_dir=str(cache_dir), **extra)


def iter_text(split) -> Iterator[str]:
    """The split's text in order, as pieces of LINES_PER_PIECE rows (rows keep their own line breaks)."""
    for batch in split.iter(batch_size=LINES_PER_PIECE):
        yield "".join(batch["text"])
