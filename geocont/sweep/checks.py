"""What `sweep launch` and `sweep resume` check before Ray starts: bad input is exit 2 with nothing written.

- the store takes files, and `--address` is a Ray that answers (ray.init retries for minutes at an address with
  nothing listening, or with something that is not Ray);
- every trial's data reads back and its model fits in memory (geocont.preflight);
- a sweep name already in the store is launched with the same trials: a different grid is refused with
  the difference named (docs/store-safety.md), never written over the stored sweep.yaml;
- the data of every finished trial is still the data it was trained on (the fingerprint in config.yaml).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from geocont import store
from geocont.config import ConfigError, RunConfig
from geocont.datafiles import fingerprint
from geocont.preflight import CLUSTER_NODE_MAX_MEMORY, run_problems
from geocont.sweep.grid import base_raw, expand, format_value
from geocont.sweep.load import stored_sweep
from geocont.sweep.spec import SweepConfig

CONNECT_TIMEOUT_S = 5.0
# Fields that change neither which trials run nor what they compute: a re-launch may change them.
FREE_FIELDS = ("resources", "retries", "tracking")


def check_launch(sweep: SweepConfig, store_dir: str, address: str | None, relaunch: bool = True) -> None:
    """Every problem of launching `sweep` into `store_dir` through `address`, as one ConfigError."""
    problems = _collect(store.check_writable, store_dir) + address_problems(address)
    if not problems and relaunch:
        problems += _collect(same_trials, sweep, Path(store_dir))
    configs = [t.config for t in expand(sweep)] if sweep.search is None else [_search_base(sweep)]
    problems += config_problems(configs, None if address is None else CLUSTER_NODE_MAX_MEMORY)
    if not problems and sweep.search is None:
        problems += data_changed(sweep, Path(store_dir))
    if problems:
        raise ConfigError(problems)


def _collect(check, *args: Any) -> list[str]:
    try:
        check(*args)
    except ConfigError as err:
        return err.problems
    return []


def address_problems(address: str | None) -> list[str]:
    """The cluster at `address` must answer a TCP connect within seconds (Ray itself retries for minutes)."""
    if address in (None, "local"):
        return []
    target = _auto_address() if address == "auto" else address.removeprefix("ray://")
    if isinstance(target, list):
        return target
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return [f"--address {address}: expected auto, host:port or ray://host:port"]
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        return [
            f"--address {address}: nothing answers at {host}:{port} ({reason}); start the cluster with "
            "`ray start --head`, or leave --address out for a local Ray"
        ]
    if not ray_answers(target, client=address.startswith("ray://")):
        return [
            f"--address {address}: {host}:{port} takes connections but is not a Ray cluster (no Ray reply within "
            f"{CONNECT_TIMEOUT_S:g} s); allowed: auto, the host:port of a Ray head (`ray start --head`), "
            "ray://host:10001 (Ray Client), or no --address for a local Ray"
        ]
    return []


def ray_answers(target: str, client: bool) -> bool:
    """Whether the Ray head's GCS (or, for ray://, its Ray Client server) answers one call within the timeout.

    ray.init has no overall timeout: at a port that takes TCP but speaks no Ray (a web server, a silent
    socket) it retries for minutes, deaf to SIGTERM. One call with a deadline tells first. A rejected
    token still proves a Ray answered; ray.init brings the token itself.
    """
    import grpc
    from ray._private.grpc_utils import init_grpc_channel  # Ray's own channel: TLS and token as ray.init sets them

    channel = init_grpc_channel(target)
    try:
        if client:
            from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

            ping = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
            ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(ping, timeout=CONNECT_TIMEOUT_S)
        else:
            from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

            request = gcs_service_pb2.GetClusterIdRequest()
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(request, timeout=CONNECT_TIMEOUT_S)
    except grpc.RpcError as err:
        return err.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    return True


def _auto_address() -> str | list[str]:
    """The host:port `ray.init(address="auto")` would connect to, or the one-line problem of finding none."""
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except ConnectionError as err:
        reason = str(err).splitlines()[0] if str(err) else "none found"
        return [f"--address auto: no running Ray cluster on this machine ({reason}); start one with `ray start --head`"]


def config_problems(configs: list[RunConfig], memory: int | None = None) -> list[str]:
    """Data and size problems of the trials, each distinct problem once (trials share their data)."""
    seen: dict[str, None] = {}
    checked = set()
    for cfg in configs:
        key = (cfg.data, cfg.model)
        if key not in checked:
            checked.add(key)
            seen.update(dict.fromkeys(run_problems(cfg, memory)))
    return [f"base: {line}" if line.startswith(("data.", "model")) else line for line in seen]


def _search_base(sweep: SweepConfig) -> RunConfig:
    from geocont.config import resolve

    return resolve(base_raw(sweep))


# ---------------------------------------------------------------------------------------------
# A sweep name already in the store


def same_trials(sweep: SweepConfig, store_dir: Path) -> None:
    """Refuse a launch whose trials differ from those of the sweep already stored under its name."""
    if not store.spec_path(store_dir, sweep.name).is_file():
        return
    old, _ = stored_sweep(store_dir, sweep.name)
    if sweep.search is None and old.search is None:
        if {t.run_id for t in expand(old)} == {t.run_id for t in expand(sweep)}:
            return  # other spellings of the same trials, or only resources, retries or tracking changed
    lines = differences(old, sweep)
    if lines:
        where = f"sweep {sweep.name!r} in {store_dir}"
        raise ConfigError(
            [f"{line}; {where} was launched with other trials: launch this one under a new name" for line in lines]
        )


def differences(old: SweepConfig, new: SweepConfig) -> list[str]:
    """'grid.model.activation: stored [relu, gelu], now [relu, gelu, silu]' for each field that differs."""
    a, b = _comparable(old), _comparable(new)
    lines = []
    for key in sorted(set(a) | set(b), key=lambda k: list(b).index(k) if k in b else len(b)):
        if a.get(key) != b.get(key):
            lines.append(f"{key}: stored {_show(a.get(key))}, now {_show(b.get(key))}")
    return lines or ["grid: the trials differ"]


def _comparable(sweep: SweepConfig) -> dict[str, Any]:
    dump = sweep.model_dump(mode="json", exclude=set(FREE_FIELDS))
    flat = store.flatten({k: v for k, v in dump.items() if k != "grid"})
    flat.update({f"grid.{axis}": values for axis, values in dump["grid"].items()})  # axes are dotted already
    flat.pop("search.n_trials", None)  # a search may be given more trials: the study goes on
    return flat


def _show(value: Any) -> str:
    return "(none)" if value is None else format_value(value)


# ---------------------------------------------------------------------------------------------
# Data that changed under finished trials


def data_changed(sweep: SweepConfig, store_dir: Path) -> list[str]:
    """One line per data.path whose files differ from those finished trials were trained on."""
    digests: dict[Any, str | None] = {}
    changed: dict[str, list[str]] = {}
    for trial in expand(sweep):
        folder = store.run_dir(store_dir, sweep.name, trial.run_id)
        if store.result_info(folder) is None:
            continue
        data = trial.config.data
        if data not in digests:
            digests[data] = fingerprint(data)
        recorded = store.recorded_fingerprint(folder)
        if recorded is not None and digests[data] is not None and recorded != digests[data]:
            changed.setdefault(str(data.path), []).append(trial.run_id)
    return [
        f"data.path: the files in {path} changed since {len(ids)} finished trial(s) of sweep {sweep.name!r} were "
        f"trained on them (run {ids[0]}, ...); restore them, or launch under a new sweep name"
        for path, ids in changed.items()
    ]
