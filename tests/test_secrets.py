"""No API key or token ever lands in a file geocont writes: store, config dumps, logs, wandb offline files,
TensorBoard events, the HTML report and its exported figures."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from geocont.config import resolve
from geocont.report import build_report, write_report


def _needles(value: str) -> list[bytes]:
    """The secret as bytes, as UTF-16 (Windows-style dumps), and base64 at each alignment (encoded blobs)."""
    raw = value.encode()
    out = [raw, value.encode("utf-16-le")]
    for shift in range(3):
        chunk = base64.b64encode(b"\0" * shift + raw)[4:-4]  # drop the edges that depend on the neighbours
        out.append(chunk)
    return out


def _scan(folders: list[Path], needles: dict[str, list[bytes]]) -> tuple[int, list[str]]:
    files, leaks = 0, []
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                files += 1
                data = path.read_bytes()
                leaks += [f"{name} in {path}" for name, forms in needles.items() if any(f in data for f in forms)]
    return files, leaks


@pytest.mark.slow
def test_no_key_or_token_in_any_written_file(tmp_path, monkeypatch):
    from geocont.train import train

    fakes = {
        "WANDB_API_KEY": "fakewandbkey" + secrets.token_hex(14),  # 40 characters, like a real key
        "RAY_AUTH_TOKEN": "fakeraytoken" + secrets.token_hex(16),
        "HF_TOKEN": "hf_fake" + secrets.token_hex(12),
    }
    for name, value in fakes.items():
        monkeypatch.setenv(name, value)
    wandb_dir = tmp_path / "wandb-home"
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(wandb_dir / "cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(wandb_dir / "config"))

    root = tmp_path / "store"
    cfg = resolve({
        "model": {"kind": "mlp", "depth": 3, "width": 16}, "data": {"name": "digits"},
        "train": {"epochs": 2, "batch_size": 64},
        "tracking": {"wandb": {"mode": "offline", "project": "geocont-secrets"}, "tensorboard": True},
    })  # fmt: skip
    result = train(cfg, root, "secrets", progress=False, run_name="secret-scan")
    assert result.status == "completed", result.error
    run = result.run_dir
    assert list(run.glob("wandb/offline-run-*/run-*.wandb")), "the run wrote no wandb offline files"
    assert list(run.rglob("events.out.tfevents.*")), "the run wrote no TensorBoard events"

    report_dir = tmp_path / "report"
    write_report(build_report(root), report_dir / "report.html")  # figures export the same specs as the page

    needles = {name: _needles(value) for name, value in fakes.items()}
    files, leaks = _scan([root, report_dir, wandb_dir], needles)
    assert files >= 10 and leaks == []

    # The scanner finds a planted secret: the check above could have failed.
    (root / "planted.txt").write_text(f"token={fakes['RAY_AUTH_TOKEN']}")
    assert _scan([root], needles)[1] == [f"RAY_AUTH_TOKEN in {root / 'planted.txt'}"]
