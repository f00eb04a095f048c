"""Print geocont's import arrows from the real imports: `python docs/imports.py [--modules | --cycles]`.

One line per importer: the geocont units it imports (package folder or top-level module) and the
third-party packages it imports. An arrow is `lazy` when every import behind it sits inside a
function (paid only when that function runs); otherwise it is paid when the module is imported.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "geocont"
THIRD_PARTY = {
    "torch", "pytorch_lightning", "lightning", "ray", "wandb", "optuna", "polars", "pydantic", "typer", "rich",
    "safetensors", "yaml", "sklearn", "datasets", "tokenizers", "wandb_workspaces", "numpy", "huggingface_hub",
    "psutil", "altair", "vl_convert", "torchvision", "transformers", "gguf",
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def existing(name: str) -> str:
    """The longest prefix of a dotted name that is a geocont module or package."""
    parts = name.split(".")
    while parts:
        base = ROOT.parent.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return name


def unit(module: str) -> str:
    """geocont.sweep.grid -> 'sweep/'; geocont.store -> 'store.py'."""
    parts = module.split(".")
    if len(parts) == 1:
        return "geocont"
    return f"{parts[1]}/" if (ROOT / parts[1] / "__init__.py").is_file() else f"{parts[1]}.py"


def imports(path: Path):
    """(imported name, lazy) for every import statement in a file."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for s in tree.body if _is_type_checking(s) for n in ast.walk(s)}
    top = {id(n) for n in tree.body} | {id(n) for s in tree.body if isinstance(s, ast.Try) for n in s.body}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue  # `if TYPE_CHECKING:` imports never run
        lazy = id(node) not in top
        if isinstance(node, ast.Import):
            yield from ((a.name, lazy) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from geocont.sweep import ray_runner` imports the module ray_runner; `from x import f`, x itself
            yield from ((f"{node.module}.{a.name}", lazy) for a in node.names)


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def graph(by_module: bool) -> dict[str, dict[str, bool]]:
    """importer -> {imported: lazy}; an arrow is lazy only if all its imports are."""
    edges: dict[str, dict[str, bool]] = defaultdict(dict)
    for path in sorted(ROOT.rglob("*.py")):
        src = module_name(path)
        key = src if by_module else unit(src)
        for name, lazy in imports(path):
            if name.startswith("geocont."):
                target = existing(name)
                target = target if by_module else unit(target)
                if target in (key, src):
                    continue
            elif name.split(".")[0] in THIRD_PARTY:
                target = f"[{name.split('.')[0]}]"
            else:
                continue
            edges[key][target] = edges[key].get(target, True) and lazy
    return edges


def cycles(edges: dict[str, dict[str, bool]]) -> list[list[str]]:
    """Every elementary cycle among geocont modules, each once (rotated to start at its smallest name)."""
    found: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for nxt in edges.get(path[-1], {}):
            if nxt == path[0]:
                i = path.index(min(path))
                found.add(tuple(path[i:] + path[:i]))
            elif nxt not in path and nxt > path[0] and not nxt.startswith("["):
                walk([*path, nxt])

    for start in sorted(edges):
        walk([start])
    return [list(c) for c in sorted(found, key=lambda c: (len(c), c))]


def main() -> None:
    by_module = "--modules" in sys.argv
    if "--cycles" in sys.argv:
        edges = graph(by_module=True)
        for cycle in cycles(edges):
            hops = [f"{a} -{'(lazy)' if edges[a][b] else ''}-> " for a, b in zip(cycle, cycle[1:] + cycle[:1])]
            print("".join(hops) + cycle[0])
        return
    for src, targets in sorted(graph(by_module).items()):
        inner = sorted(t for t in targets if not t.startswith("["))
        outer = sorted(t for t in targets if t.startswith("["))
        shown = [f"{t} (lazy)" if targets[t] else t for t in inner + outer]
        print(f"{src:28s} -> {', '.join(shown)}")


if __name__ == "__main__":
    main()
