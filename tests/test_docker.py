"""Static checks of docker/ (Docker cannot run here): the files parse, every path and command they name exists,
and every `geocont` command in them (and in the docs) parses with the real CLI."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import ray
import typer
import yaml

from geocont.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
IMAGE_WORKDIR = "/home/ray/geocont"  # the Dockerfile's WORKDIR: the repository root inside the image
STORE_MOUNT = "/mnt/geocont"
# The CUDA that torch's PyPI wheel for Linux bundles, and that CUDA's minimum driver branch. Read, not assumed:
# torch 2.13.0's wheel metadata requires cuda-toolkit==13.0.3 and nvidia-*-cu13 packages; NVIDIA's CUDA
# compatibility guide gives ">= 580" for CUDA 13.x. A new torch pin fails here until its CUDA is looked up.
TORCH_CUDA = {"2.13.0": ("13.0", "580")}


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            steps.append((word.upper(), rest.strip()))
    return steps


def command_text(path: Path) -> str:
    """The parts of a file that are shell commands: Dockerfile RUN/CMD, YAML command and entrypoint strings,
    markdown code blocks, and indented usage examples in comments ("#   ray up ...")."""
    text = path.read_text()
    examples = [line.split("#", 1)[1] for line in text.splitlines() if re.match(r"\s*#\s{2,}\S", line)]
    if path.suffix == ".md":
        return "\n".join(shell_blocks(text))
    if path.suffix in (".yaml", ".yml"):
        return "\n".join(examples + list(_command_strings(yaml.safe_load(text))))
    steps = [(w, a) for w, a in dockerfile() if w in ("RUN", "CMD", "ENTRYPOINT")]
    return "\n".join(examples + [" ".join(json.loads(a)) if a.startswith("[") else a for _, a in steps])


def shell_blocks(markdown: str) -> list[str]:
    """The bodies of fenced code blocks in bash, sh, console or no language, pairing each fence with its close
    (a regex over the whole file would take the prose between a yaml block's close and the next fence)."""
    blocks, body, language = [], None, ""
    for line in markdown.splitlines():
        fence = re.match(r"\s*```(\w*)", line)
        if fence and body is None:
            body, language = [], fence.group(1)
        elif fence:
            if language in ("", "bash", "sh", "console"):
                blocks.append("\n".join(body))
            body = None
        elif body is not None:
            body.append(line)
    return blocks


def _command_strings(node, key: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _command_strings(v, str(k))
    elif isinstance(node, list):
        for item in node:
            yield from _command_strings(item, key)
    elif isinstance(node, str) and ("command" in key or key == "entrypoint"):
        yield node


def geocont_commands(text: str) -> list[list[str]]:
    """Every `geocont ...` invocation at a command position (line start, after &&, ;, |, a quote or `--`),
    up to the next shell separator; lines with placeholders like [--set ...] or <DIR> are skipped."""
    commands = []
    for match in re.finditer(r"(?:^|&&|;|\||\$\(|\"|--\s)\s*geocont(?=\s|$)(?P<rest>.*)$", text, flags=re.M):
        rest = match["rest"].removesuffix("\\")  # a trailing backslash continues the line: check the first line
        try:
            words = shell_words(rest)
        except ValueError:  # inside bash -c "...": the command ends at the closing quote
            words = shell_words(rest.split('"', 1)[0])
        if not any(w in ("...", "[", "]") or w.startswith(("[", "<")) for w in words):
            commands.append(words)
    return commands


def shell_words(line: str) -> list[str]:
    """The words of one command, up to the first shell operator (quotes respected, comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    for token in lexer:
        if set(token) <= set("();<>|&"):
            break
        words.append(token)
    return words


def check_cli(args: list[str]) -> None:
    """Parse args with geocont's command tree (typer's vendored click), as the shell would run them, running nothing:
    an unknown command or option, a missing value or argument raises."""

    def rest(ctx) -> list[str]:  # a group's unparsed words: the subcommand name, then its arguments
        return [*ctx._protected_args, *ctx.args]

    command = typer.main.get_command(app)
    try:
        ctx = command.make_context("geocont", list(args), resilient_parsing=False)
        while hasattr(command, "resolve_command") and rest(ctx):
            name, command, words = command.resolve_command(ctx, rest(ctx))
            ctx = command.make_context(name, words, parent=ctx, resilient_parsing=False)
    except Exception as done:  # --help prints, then exits 0: a valid command
        if getattr(done, "exit_code", None) != 0 or type(done).__name__ != "Exit":
            raise


def in_image(path: str) -> Path:
    """Where a path used inside the image comes from in this repository."""
    return ROOT / path.removeprefix(IMAGE_WORKDIR).lstrip("/")


def test_dockerfile_base_user_and_pins():
    steps = dockerfile()
    base = next(arg for word, arg in steps if word == "FROM")
    assert re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py311-gpu", base)
    pyproject = (ROOT / "pyproject.toml").read_text()
    ray_pin = re.search(r'"ray\[tune\]==([\d.]+)"', pyproject).group(1)
    assert base.split(":")[1].split("-")[0] == ray_pin == ray.__version__  # one Ray everywhere
    assert '"torch==2.13.0"' in pyproject  # the pin that gives the CUDA build on a CUDA machine
    users = [arg for word, arg in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")  # runs as the image's non-root `ray` user
    assert ("WORKDIR", IMAGE_WORKDIR) in steps


def test_dockerfile_installs_the_text_extras():
    """WikiText-103 and the BPE tokenizer need the `text` extra: the image installs it and imports its packages."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras_declared = {
        name: re.findall(r'"([^"]+)"', body) for name, body in re.findall(r"(?ms)^(\w+) = \[(.*?)\]", section)
    }
    runs = " ".join(arg for word, arg in dockerfile() if word == "RUN")
    installed = re.search(r'pip install "\.\[([\w,]+)\]"', runs)
    assert installed, "the image must pip install the repository with its extras"
    extras = installed.group(1).split(",")
    assert "text" in extras and set(extras) <= set(extras_declared), extras
    imports = re.search(r'python -c "import ([\w., ]+);', runs).group(1).replace(" ", "").split(",")
    for requirement in extras_declared["text"]:  # e.g. "datasets>=3": the image checks each one imports
        assert re.match(r"[\w-]+", requirement).group(0) in imports, requirement


def test_dockerfile_states_and_enforces_the_driver_torchs_cuda_needs():
    pin = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert pin in TORCH_CUDA, f"torch {pin}: look up the CUDA its wheel bundles and the driver it needs"
    cuda, driver = TORCH_CUDA[pin]
    env = " ".join(arg for word, arg in dockerfile() if word == "ENV")
    assert f'NVIDIA_REQUIRE_CUDA="cuda>={cuda}"' in env  # the NVIDIA runtime refuses older drivers
    text = (DOCKER / "Dockerfile").read_text()
    assert f"CUDA {cuda}" in text and f"branch {driver} or newer" in text
    for doc in (DOCKER / "README.md", DOCKER / "kuberay-rayjob.yaml"):
        assert f"driver {driver} or newer" in doc.read_text(), doc.name


def test_dockerfile_copies_exist_and_pass_the_dockerignore():
    ignore = [line.strip() for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()]
    rules = [line for line in ignore if line and not line.startswith("#")]

    def included(path: str) -> bool:  # Docker's rule: the last matching pattern wins
        keep = True
        for rule in rules:
            negate, pattern = rule.startswith("!"), rule.lstrip("!")
            if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.removesuffix("/**")):
                keep = negate
        return keep

    copies = [arg for word, arg in dockerfile() if word == "COPY"]
    assert copies
    for arg in copies:
        *sources, _dest = [w for w in shlex.split(arg) if not w.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: missing from the repository"
            assert included(source), f"COPY {source}: excluded by Dockerfile.dockerignore"
    for secret_or_bulk in (".venv", "geocont-results", "wandb", ".git", "tests/conftest.py"):
        assert not included(secret_or_bulk), secret_or_bulk


def test_ray_cluster_config_validates_with_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((DOCKER / "ray-cluster.yaml").read_text())
    validate_config(prepare_config(config))  # Ray's own schema and checks (raises on any mistake)
    broken = {**config, "worker_nodes_typo": {}}
    with pytest.raises(Exception):
        validate_config(prepare_config(broken))

    nodes = config["available_node_types"]
    assert config["head_node_type"] in nodes
    assert any(node["resources"].get("GPU", 0) >= 1 for node in nodes.values())
    options = " ".join(config["docker"]["run_options"])
    assert re.search(r"--shm-size=\d+g", options)
    assert f"--volume {STORE_MOUNT}:{STORE_MOUNT}" in options
    assert "RAY_AUTH_MODE=token" in options
    assert any(STORE_MOUNT in cmd and "mount" in cmd for cmd in config["initialization_commands"])


def launcher_commands(config: dict) -> list[str]:
    keys = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
            "head_start_ray_commands", "worker_start_ray_commands")  # fmt: skip
    return [cmd for key in keys for cmd in config.get(key, [])]


def test_ray_cluster_needs_only_rays_default_cloud_permissions():
    """No instance profile of our own (Ray's default: the head may launch EC2 workers and use S3, workers have no
    role) and no command that calls an AWS API (a parameter-store or secrets-manager read would fail there)."""
    config = yaml.safe_load((DOCKER / "ray-cluster.yaml").read_text())
    for name, node in config["available_node_types"].items():
        assert "IamInstanceProfile" not in node["node_config"], name
    for cmd in launcher_commands(config):
        assert not re.search(r"\baws\s+\w+|\bssm\b|secretsmanager|get-parameter", cmd), cmd
    # The token reaches every node as a file mount from the machine that runs `ray up` (~/.ray/auth_token).
    assert config["file_mounts"]["~/.ray"] == "~/.ray"


@pytest.mark.parametrize("node", ["head", "worker"])
@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_ray_cluster_start_commands_pass_wandb_api_key_to_ray(tmp_path, node, with_key):
    """Run the node's start commands in bash with a stand-in `ray` that prints the WANDB_API_KEY it was started
    with: every Ray worker (so every trial) inherits `ray start`'s environment."""
    config = yaml.safe_load((DOCKER / "ray-cluster.yaml").read_text())
    secrets_local, secrets_remote = next((k, v) for k, v in config["file_mounts"].items() if "secrets" in k)
    assert secrets_local == secrets_remote  # the same path on every node as on the launching machine
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    secrets = home / secrets_remote.removeprefix("~/")
    secrets.mkdir(parents=True)
    if with_key:
        (secrets / "wandb_api_key").write_text("fake-wandb-key-0123")
    bin_dir.mkdir()
    (bin_dir / "ray").write_text('#!/bin/sh\necho "ray $1 WANDB_API_KEY=${WANDB_API_KEY:-unset}"\n')
    (bin_dir / "ray").chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "RAY_HEAD_IP": "10.0.0.1"}
    for cmd in config[f"{node}_start_ray_commands"]:
        out = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, check=True).stdout
        if "ray start" in cmd:
            expected = "fake-wandb-key-0123" if with_key else "unset"
            assert out.strip() == f"ray start WANDB_API_KEY={expected}", (cmd, out)
    assert "fake-wandb-key" not in (DOCKER / "ray-cluster.yaml").read_text()


def test_kuberay_rayjob_runs_the_paper_sweep_on_gpus_with_shared_store_and_secrets():
    job = yaml.safe_load((DOCKER / "kuberay-rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    head = cluster["headGroupSpec"]["template"]["spec"]
    (worker_group,) = cluster["workerGroupSpecs"]
    worker = worker_group["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for pod in (head, worker):
        assert pod["securityContext"]["runAsNonRoot"] is True
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert "persistentVolumeClaim" in volumes[mounts[STORE_MOUNT]]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        key = env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"]  # from a Secret, never a literal
        assert key["optional"] is True  # offline wandb works without one
        assert all("value" not in e for name, e in env.items() if "TOKEN" in name or "KEY" in name)
    submitter = job["spec"]["submitterPodTemplate"]["spec"]
    assert submitter["securityContext"]["runAsNonRoot"] is True
    entry = job["spec"]["entrypoint"]
    assert "geocont sweep launch sweeps/paper_mlp.yaml --address auto" in entry
    assert f"--store {STORE_MOUNT}/" in entry


def test_kuberay_rayjob_uses_auth_options_not_hand_set_token_variables():
    """KubeRay >= 1.5.1: `authOptions: {mode: token}` in the cluster spec; the operator generates the token Secret and
    sets RAY_AUTH_MODE / RAY_AUTH_TOKEN on every Ray container and the submitter, so no pod sets them itself."""
    job = yaml.safe_load((DOCKER / "kuberay-rayjob.yaml").read_text())
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}
    ray_version = tuple(int(p) for p in cluster["rayVersion"].split("."))
    assert ray_version >= (2, 52, 0)  # the operator refuses authOptions below Ray 2.52.0
    pods = [cluster["headGroupSpec"]["template"]["spec"], job["spec"]["submitterPodTemplate"]["spec"]]
    pods += [group["template"]["spec"] for group in cluster["workerGroupSpecs"]]
    for pod in pods:
        for container in pod["containers"]:
            names = {e["name"] for e in container.get("env", [])}
            assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"}, container["name"]
    assert "v1.5.1 or newer" in (DOCKER / "kuberay-rayjob.yaml").read_text()


def test_paths_named_in_docker_files_exist():
    """Paths under the image's WORKDIR are this repository's files; sweep files also load as sweeps."""
    from geocont.sweep.load import load_sweep

    text = "\n".join(p.read_text() for p in sorted(DOCKER.iterdir()) if p.is_file())
    paths = set(re.findall(r"(?<![\w/])(sweeps/[\w.-]+\.yaml|docker/[\w.-]+)", text))
    paths |= {m for m in re.findall(rf"{IMAGE_WORKDIR}(/[\w./-]*)?", text) if m}
    assert "sweeps/paper_mlp.yaml" in paths
    for path in paths:
        assert in_image(path).exists(), path
        if path.startswith("sweeps/"):
            load_sweep(ROOT / path)


DOC_FILES = [DOCKER / "Dockerfile", DOCKER / "ray-cluster.yaml", DOCKER / "kuberay-rayjob.yaml", DOCKER / "README.md",
             ROOT / "dashboards" / "README.md", ROOT / "README.md"]  # fmt: skip


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_geocont_commands_in_files_parse_with_the_cli(path):
    commands = geocont_commands(command_text(path))
    if path.parent == DOCKER or path.parent.name == "dashboards":
        assert commands, f"{path.name}: expected geocont commands"
    for args in commands:
        try:
            check_cli(args)
        except Exception as err:
            raise AssertionError(f"{path.name}: `geocont {' '.join(args)}` does not parse: {err}") from None


def test_the_command_checker_rejects_bad_commands():
    check_cli(["sweep", "launch", "sweeps/paper_mlp.yaml", "--address", "auto", "--store", "/mnt/x"])
    for bad in (["sweep", "lunch", "x.yaml"], ["report", "--no-such-flag"], ["sweep", "launch", "--address"]):
        with pytest.raises(Exception):
            check_cli(bad)
    found = geocont_commands(
        'geocont --help > /dev/null && x\nbash -c "cd /x && geocont report -o r.html"\nprose geocont on'
    )
    assert found == [["--help"], ["report", "-o", "r.html"]]
