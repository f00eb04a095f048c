"""A corpus of malformed input across train, sweep, results, analyze and report (issue 11).

Each case must be answered as the contract says (docs/contracts.md): exit code 2, one line on stderr that
names what is wrong, no traceback, and nothing written anywhere (the test folder is compared before
and after). The commands run in-process through the console script's own entry (`geocont.entry.run`),
which is what turns ConfigError into the one-line message; a few cases also run as real processes.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import tiny_run

SMOKE = ["smoke", "--no-progress", "--set", "tracking.wandb.mode=disabled", "--set", "tracking.tensorboard=false"]
NOT_WRITABLE = "/proc/geocont-store"  # the nearest existing folder (/proc) takes no files, even for root


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)


def write_mnist(folder: Path, n_train: int = 40, n_val: int = 20, labels: int = 10) -> Path:
    """A small MNIST-shaped IDX folder (random pixels) that loads cleanly."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_val)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", rng.integers(0, labels, (n,)))
    return folder


def _damage(folder: Path, how: str) -> None:
    images, labels = folder / "train-images-idx3-ubyte", folder / "train-labels-idx1-ubyte"
    if how == "truncated-header":
        images.write_bytes(images.read_bytes()[:7])
    elif how == "truncated-body":
        images.write_bytes(images.read_bytes()[:500])
    elif how == "corrupt-gz":
        images.unlink()
        (folder / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    elif how == "no-images":
        write_idx(images, np.zeros((0, 28, 28)))
        write_idx(labels, np.zeros((0,)))
    elif how == "labels-12":
        write_idx(labels, np.full((40,), 12))
    elif how == "missing-labels":
        labels.unlink()
    elif how == "count-mismatch":
        write_idx(labels, np.zeros((39,)))
    elif how == "bad-magic":
        images.write_bytes(b"\x08\x03\x00\x00" + images.read_bytes()[4:])


def _sweep(tmp: Path, name: str = "bad", text: str | None = None, **fields) -> str:
    path = tmp / "sweep-file.yaml"
    if text is not None:
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        return str(path)
    body = {"name": name, "base": tiny_run(), "grid": {"model.activation": ["relu", "gelu"]}, "seeds": [0], **fields}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return str(path)


def _config(tmp: Path, text: str | bytes) -> str:
    path = tmp / "run.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


def _store_with_run(tmp: Path) -> str:
    """A store holding one finished synthetic run of sweep `s` and its sweep.yaml."""
    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_store import write_run

    from geocont import store

    root = tmp / "store"
    write_run(root, "s", tiny_run())
    store.record_spec(root, "s", yaml.safe_dump({"name": "s", "base": tiny_run(), "seeds": [0]}))
    return str(root)


def _mnist_case(how: str):
    def setup(tmp: Path) -> list[str]:
        folder = write_mnist(tmp / "mnist")
        _damage(folder, how)
        return ["train", *SMOKE, "--set", "data.name=mnist", "--set", f"data.path={folder}"]

    return setup


def _sweep_mnist_case(how: str):
    def setup(tmp: Path) -> list[str]:
        folder = write_mnist(tmp / "mnist")
        _damage(folder, how)
        base = tiny_run(data={"name": "mnist", "path": str(folder)})
        return ["sweep", "launch", _sweep(tmp, base=base)]

    return setup


def _train(*sets: str):
    return lambda tmp: ["train", *SMOKE, *[x for s in sets for x in ("--set", s)]]


def _relaunch_other_grid(tmp: Path) -> list[str]:
    from geocont import store

    store_dir = _store_with_run(tmp)
    store.record_spec(store_dir, "s", Path(_sweep(tmp, name="s")).read_text())  # as launched: relu, gelu
    other = _sweep(tmp, name="s", grid={"model.activation": ["relu", "gelu", "silu"]})
    return ["sweep", "launch", other, "--store", store_dir]


# (id, setup(tmp) -> argv, substring the one error line must contain). `--store <tmp>/store` is added
# when the argv names no store of its own.
# fmt: off
CASES = [
    # geocont train: the config
    ("train-no-such-config", lambda t: ["train", "missing.yaml"], "CONFIG: 'missing.yaml' is neither a file nor"),
    ("train-bad-activation", _train("model.activation=swish"), "model.activation: got 'swish'; allowed:"),
    ("train-depth-1", _train("model.depth=1"), "model.depth: input should be greater than or equal to 2"),
    ("train-depth-true", _train("model.depth=true"), "model.depth: got True, a bool; allowed: a number"),
    ("train-depth-negative", _train("model.depth=-2"), "model.depth: input should be greater than or equal to 2"),
    ("train-width-1e11", _train("model.width=1e11"), "allowed: a model that fits in memory"),
    ("train-unknown-key", _train("model.colour=red"), "model.colour: unknown key; allowed under model: kind, depth"),
    ("train-unknown-section", _train("modle.depth=3"), "modle: unknown key; allowed under the top level: model, data"),
    ("train-lr-text", _train("optim.lr=fast"), "optim.lr: input should be a valid number"),
    ("train-lr-inf", _train("optim.lr=.inf"), "optim.lr: input should be a finite number"),
    ("train-lr-nan", _train("optim.lr=.nan"), "optim.lr: input should be a finite number"),
    ("train-lr-bool", _train("optim.lr=true"), "optim.lr: got True, a bool"),
    ("train-wd-inf", _train("optim.weight_decay=.inf"), "optim.weight_decay: input should be a finite number"),
    ("train-beta-above-1", _train("optim.beta2=1.5"), "optim.beta2: input should be less than 1"),
    ("train-seed-bool", _train("train.seed=true"), "train.seed: got True, a bool"),
    ("train-epochs-zero", _train("train.epochs=0"), "train.epochs: input should be greater than 0"),
    ("train-init-std-negative", _train("model.init_std=-1"), "model.init_std: input should be greater than 0"),
    ("train-precision", _train("train.precision=8"), "train.precision: got '8'"),
    ("train-wandb-mode", _train("tracking.wandb.mode=loud"), "tracking.wandb.mode: got 'loud'"),
    ("train-unknown-kind", _train("model.kind=cnn"), "model: unknown kind 'cnn'"),
    ("train-unknown-preset", _train("preset=nope"), "preset: unknown preset 'nope'; allowed:"),
    ("train-text-for-mlp", _train("data.name=stdlib"), "model.kind 'mlp' needs digits or mnist"),
    ("train-val-fraction-1.5", _train("data.val_fraction=1.5"), "data.val_fraction: input should be less than 1"),
    ("train-val-fraction-empty-train", _train("data.val_fraction=0.9999"), "data.val_fraction: 0.9999 leaves no"),
    ("train-value-not-section", _train("model.depth=3", "model.depth.x=1"), "'depth' is a value, not a section"),
    ("train-set-syntax", lambda t: ["train", *SMOKE, "--set", "model.depth"], "expected dotted.path=value"),
    # geocont train: the data
    ("train-mnist-no-folder", _train("data.name=mnist", "data.path=/nowhere"), "data.path: /nowhere is not a folder"),
    ("train-mnist-truncated-header", _mnist_case("truncated-header"), "is truncated inside its header"),
    ("train-mnist-truncated-body", _mnist_case("truncated-body"), "is truncated: header says"),
    ("train-mnist-corrupt-gz", _mnist_case("corrupt-gz"), "cannot be read as gzip"),
    ("train-mnist-no-images", _mnist_case("no-images"), "holds no data"),
    ("train-mnist-label-12", _mnist_case("labels-12"), "has label 12; allowed: 0 to 9"),
    ("train-mnist-missing-file", _mnist_case("missing-labels"), "has no train-labels-idx1-ubyte"),
    ("train-mnist-count-mismatch", _mnist_case("count-mismatch"), "has 40 images but train-labels-idx1-ubyte has 39"),
    ("train-mnist-bad-magic", _mnist_case("bad-magic"), "bad magic number"),
    # geocont train: the YAML file and the store
    ("train-yaml-not-utf8", lambda t: ["train", _config(t, b"model: {activation: r\xe9lu}\n")], "not UTF-8 text"),
    ("train-yaml-duplicate-key", lambda t: ["train", _config(t, "model:\n  depth: 3\n  depth: 4\n")],
     "duplicate key 'depth' (lines 2 and 3)"),
    ("train-yaml-syntax", lambda t: ["train", _config(t, "model: {depth: [\n")], "not valid YAML"),
    ("train-yaml-list", lambda t: ["train", _config(t, "- 1\n- 2\n")], "expected a mapping"),
    ("train-yaml-unknown-top", lambda t: ["train", _config(t, "optimiser: {lr: 1}\n")],
     "optimiser: unknown key; allowed under the top level"),
    ("train-store-is-file", lambda t: ["train", *SMOKE, "--store", _file(t)], "is a file; expected a folder"),
    ("train-store-under-file", lambda t: ["train", *SMOKE, "--store", _file(t) + "/sub"], "cannot be made"),
    ("train-store-not-writable", lambda t: ["train", *SMOKE, "--store", NOT_WRITABLE], "not writable"),
    ("train-store-empty", lambda t: ["train", *SMOKE, "--store", ""], "--store: empty; give a folder"),
    # geocont sweep launch
    ("sweep-no-file", lambda t: ["sweep", "launch", str(t / "none.yaml")], "no such file"),
    ("sweep-unknown-top-key", lambda t: ["sweep", "launch", _sweep(t, grids={})], "grids: unknown key; allowed:"),
    ("sweep-name-space", lambda t: ["sweep", "launch", _sweep(t, name="my sweep")], "allowed: ASCII letters"),
    ("sweep-name-unicode", lambda t: ["sweep", "launch", _sweep(t, name="café")], "allowed: ASCII letters"),
    ("sweep-name-300", lambda t: ["sweep", "launch", _sweep(t, name="a" * 300)], "300 characters long; allowed"),
    ("sweep-name-dots-up", lambda t: ["sweep", "launch", _sweep(t, name="../x")], "not usable as a folder name"),
    ("sweep-duplicate-axis", lambda t: ["sweep", "launch", _sweep(t, text=(
        "name: dup\nbase: {model: {depth: 3, width: 16}}\ngrid:\n  model.activation: [relu]\n"
        "  model.activation: [gelu]\n"))], "duplicate key 'model.activation' (lines 4 and 5)"),
    ("sweep-not-utf8", lambda t: ["sweep", "launch", _sweep(t, text=b"name: caf\xe9\n")], "not UTF-8 text"),
    ("sweep-bad-grid-value", lambda t: ["sweep", "launch", _sweep(t, grid={"model.activation": ["swish"]})],
     "grid.model.activation: got 'swish'"),
    ("sweep-grid-depth-1", lambda t: ["sweep", "launch", _sweep(t, grid={"model.depth": [1, 2]})],
     "grid.model.depth: input should be greater than or equal to 2"),
    ("sweep-base-depth-true", lambda t: ["sweep", "launch", _sweep(t, base=tiny_run(model={"depth": True}))],
     "base.model.depth: got True, a bool"),
    ("sweep-base-width-1e11", lambda t: ["sweep", "launch", _sweep(t, base=tiny_run(model={"width": 10**11}))],
     "allowed: a model that fits in memory"),
    ("sweep-val-fraction", lambda t: ["sweep", "launch", _sweep(t, base=tiny_run(data={"val_fraction": 0.9999}))],
     "leaves no training samples"),
    ("sweep-mnist-missing-path", lambda t: ["sweep", "launch", _sweep(
        t, base=tiny_run(data={"name": "mnist", "path": str(t / "nowhere")}))], "is not a folder"),
    ("sweep-mnist-label-12", _sweep_mnist_case("labels-12"), "has label 12; allowed: 0 to 9"),
    ("sweep-mnist-truncated", _sweep_mnist_case("truncated-header"), "truncated inside its header"),
    ("sweep-cpu-inf", lambda t: ["sweep", "launch", _sweep(t, resources={"cpu": float("inf")})],
     "resources.cpu: input should be a finite number"),
    ("sweep-empty-axis", lambda t: ["sweep", "launch", _sweep(t, grid={"model.activation": []})], "empty axis"),
    ("sweep-seed-twice", lambda t: ["sweep", "launch", _sweep(t, seeds=[0, 0])], "listed more than once"),
    ("sweep-store-is-file", lambda t: ["sweep", "launch", _sweep(t), "--store", _file(t)], "is a file"),
    ("sweep-store-not-writable", lambda t: ["sweep", "launch", _sweep(t), "--store", NOT_WRITABLE], "not writable"),
    ("sweep-store-empty", lambda t: ["sweep", "launch", _sweep(t), "--store", ""], "--store: empty"),
    ("sweep-address-nothing-listening", lambda t: ["sweep", "launch", _sweep(t), "--address", "127.0.0.1:1"],
     "--address 127.0.0.1:1: nothing answers"),
    ("sweep-address-malformed", lambda t: ["sweep", "launch", _sweep(t), "--address", "nohost"],
     "expected auto, host:port"),
    ("sweep-relaunch-other-grid", _relaunch_other_grid, "grid.model.activation: stored [\"relu\",\"gelu\"]"),
    # geocont sweep status / resume
    ("status-outside-store", lambda t: ["sweep", "status", "../other", "--store", _store_with_run(t)],
     "SWEEP_NAME: '../other' is not usable"),
    ("resume-outside-store", lambda t: ["sweep", "resume", "../other/x", "--store", _store_with_run(t)],
     "SWEEP_NAME: '../other/x' is not usable"),
    ("status-unknown-sweep", lambda t: ["sweep", "status", "nope", "--store", _store_with_run(t)],
     "nope: no sweep of that name"),
    ("status-no-store", lambda t: ["sweep", "status", "s", "--store", str(t / "nowhere")], "no such folder"),
    ("resume-store-empty", lambda t: ["sweep", "resume", "s", "--store", ""], "--store: empty"),
    ("resume-junk-sweep-yaml", lambda t: ["sweep", "resume", "s", "--store", _junk_sweep_yaml(t)], "sweep.yaml"),
    # geocont results
    ("results-no-store", lambda t: ["results", "runs", "--store", str(t / "nowhere")], "is not a results store"),
    ("results-outside-store", lambda t: ["results", "runs", "--store", _store_with_run(t), "--sweep", "../x"],
     "--sweep: '../x' is not usable"),
    ("results-unknown-sweep", lambda t: ["results", "table", "--store", _store_with_run(t), "--sweep", "nope"],
     "--sweep: no sweep 'nope'"),
    ("results-store-empty", lambda t: ["results", "runs", "--store", ""], "--store: empty"),
    ("results-bad-format", lambda t: ["results", "runs", "--store", _store_with_run(t), "--format", "xml"],
     "'xml' is not one of 'md', 'csv', 'json'. (see geocont results runs --help)"),
    ("results-unknown-option", lambda t: ["results", "runs", "--stor", "x"], "No such option: --stor"),
    # geocont report
    ("report-no-store", lambda t: ["report", "--store", str(t / "nowhere"), "-o", str(t / "r.html")], "no such folder"),
    ("report-empty-store", lambda t: ["report", "--store", "", "-o", str(t / "r.html")], "--store: empty"),
    ("report-not-html", lambda t: ["report", "--store", _store_with_run(t), "-o", str(t / "r.txt")], "an .html file"),
    ("report-output-folder", lambda t: ["report", "--store", _store_with_run(t), "-o", _folder(t, "r.html")],
     "is a folder"),
    ("report-output-not-writable", lambda t: ["report", "--store", _store_with_run(t), "-o", "/proc/geocont.html"],
     "not writable"),
    ("report-output-under-file", lambda t: ["report", "--store", _store_with_run(t), "-o", _file(t) + "/r.html"],
     "is a file; expected a folder"),
    ("report-outside-store", lambda t: ["report", "--store", _store_with_run(t), "--sweep", "../x", "-o",
                                        str(t / "r.html")], "--sweep: '../x' is not usable"),
    # geocont analyze (bad checkpoint files; zero matrices and --out are tested with analyze)
    ("analyze-no-file", lambda t: ["analyze", str(t / "none.safetensors")], "no such file"),
    ("analyze-not-safetensors", lambda t: ["analyze", _file(t, "x.safetensors")], "not a readable safetensors file"),
]
# fmt: on


def _file(tmp: Path, name: str = "a-file") -> str:
    path = tmp / name
    path.write_text("not a folder\n")
    return str(path)


def _folder(tmp: Path, name: str) -> str:
    (tmp / name).mkdir()
    return str(tmp / name)


def _junk_sweep_yaml(tmp: Path) -> str:
    store = Path(_store_with_run(tmp))
    (store / "s" / "sweep.yaml").write_text("name: [unclosed\n")
    return str(store)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def run_cli(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """The console script's entry in this process: exit code, stdout, stderr."""
    from geocont.cli import app
    from geocont.entry import run

    monkeypatch.setattr(sys, "argv", ["geocont", *argv])
    with pytest.raises(SystemExit) as done:
        run(app)
    out, err = capsys.readouterr()
    return done.value.code, out, err


@pytest.mark.parametrize(("setup", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, setup, message):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in setup(tmp_path)]
    if "--store" not in argv and argv[0] in ("train", "sweep", "results"):
        argv += ["--store", str(tmp_path / "store")]
    before = snapshot(tmp_path)
    code, out, err = run_cli(argv, monkeypatch, capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before  # nothing written, not even an empty store folder


def test_the_corpus_is_large_and_covers_every_command():
    commands = {c[0].split("-")[0] for c in CASES}
    assert len(CASES) >= 60 and {"train", "sweep", "status", "resume", "results", "report", "analyze"} <= commands


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "launch", "{sweep}", "--address", "127.0.0.1:1"], "--address 127.0.0.1:1: nothing answers"),
        (["train", "{config}", "--set", "model.depth=1"], "model.depth: input should be greater than or equal to 2"),
    ],
    ids=["unreachable-address", "train-depth-1"],
)
def test_as_a_process_too_within_seconds(tmp_path, argv, message):
    """The real console script: one line, exit 2, nothing written; an unreachable address does not hang."""
    config = _config(tmp_path, yaml.safe_dump(tiny_run()))
    values = {"{sweep}": _sweep(tmp_path), "{config}": config}
    argv = [values.get(a, a) for a in argv] + ["--store", str(tmp_path / "store")]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "geocont.cli", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [f"error: {done.stderr.strip().removeprefix('error: ')}"]
    assert message in done.stderr and not (tmp_path / "store").exists()


@contextlib.contextmanager
def not_ray(kind: str) -> Iterator[int]:
    """A port on loopback that takes TCP connections but is no Ray: silent, or a plain HTTP server."""
    if kind == "http":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            server.server_close()
        return
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []  # accepted and never answered

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize("kind", ["silent", "http"])
def test_an_address_that_is_not_ray_is_refused_within_seconds(tmp_path, kind):
    """The TCP connect succeeds, yet no Ray answers there: ray.init would wait for minutes (issue 11)."""
    store = tmp_path / "store"
    # The console script's main, with the wait for an answer cut to 1 s so the test stays short.
    code = "from geocont.sweep import checks; checks.CONNECT_TIMEOUT_S = 1.0; from geocont.cli import main; main()"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    with not_ray(kind) as port:
        address = f"127.0.0.1:{port}"
        argv = ["sweep", "launch", _sweep(tmp_path), "--address", address, "--store", str(store)]
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
        )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: --address {address}: ") and "not a Ray cluster" in lines[0]
    assert "allowed:" in lines[0] and not store.exists()


def test_every_problem_of_a_file_at_once(tmp_path, monkeypatch, capsys):
    """Fix one, see the next was the old way: a file's problems come together, one line each."""
    config = _config(tmp_path, "model:\n  depth: 3\n  depth: 4\n  activation: swish\noptim: {lr: .inf, rate: 1}\n")
    code, _, err = run_cli(["train", config, "--store", str(tmp_path / "store")], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 4, err
    assert ["duplicate key 'depth'" in lines[0], "model.activation" in lines[1]] == [True, True]
    assert {"optim.lr", "optim.rate"} == {line.split(": ")[1] for line in lines[2:]}
    sweep = _sweep(tmp_path, name="my sweep", grid={"model.activation": ["swish"]}, seeds=[0, 0])
    code, _, err = run_cli(["sweep", "launch", sweep, "--store", str(tmp_path / "store")], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 3, err
    assert [("name:" in lines[0]), ("seeds:" in lines[1]), ("grid.model.activation" in lines[2])] == [True] * 3
    assert not (tmp_path / "store").exists()
