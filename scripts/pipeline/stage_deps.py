"""dvc.yaml's code deps, generated: each stage depends on exactly the files of ours its entry point runs.

The lists are written from the imports (followed transitively, package `__init__.py` files included),
so a moved module or a new import cannot leave a stage that misses a change to its code; the test
suite fails when dvc.yaml differs from what this writes. The imports not followed are the stage
harness (scripts/pipeline/harness.py) and the profile (scripts/pipeline/profile.py, the seconds by part
the harness records): they write no DVC output and change no figure, so editing the memory sampler,
the log filter or the parts' timing reruns nothing.

    python -m scripts.pipeline.stage_deps           # rewrite dvc.yaml's code deps in place
    python -m scripts.pipeline.stage_deps --check   # exit 1, naming the stages whose lists differ
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
OURS = ("scripts", "stages")
HARNESS = Path("scripts/pipeline/harness.py")
PROFILE = Path("scripts/pipeline/profile.py")
NOT_FOLLOWED = {HARNESS, PROFILE}


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of a dotted module of ours (a module, or a package's __init__.py), else None."""
    parts = name.split(".")
    if parts[0] not in OURS:
        return None
    for path in (Path(*parts).with_suffix(".py"), Path(*parts) / "__init__.py"):
        if (root / path).is_file():
            return path
    return None


def imported(path: Path, root: Path = ROOT) -> set[Path]:
    """Our files that `path` imports directly, and the package __init__ files Python runs on the way."""
    found = set()
    tree = ast.parse((root / path).read_text())
    type_only = {  # imports under `if TYPE_CHECKING:` never run: no code dependency, no circle
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # scripts, scripts.checks, scripts.checks.compare
                if (file := module_file(".".join(parts[:i]), root)) is not None:
                    found.add(file)
    return found


def code_of(entry: Path, root: Path = ROOT) -> set[Path]:
    """`entry` and every file of ours it imports, transitively (with the packages `python -m` runs it in),
    the stage harness and the profile (NOT_FOLLOWED) and what only they import left out."""
    parts = entry.with_suffix("").parts
    packages = {f for i in range(1, len(parts)) if (f := module_file(".".join(parts[:i]), root)) is not None}
    seen, todo = {entry} | packages, [entry, *packages]
    while todo:
        for file in imported(todo.pop(), root) - seen - NOT_FOLLOWED:
            seen.add(file)
            todo.append(file)
    return seen


def circles(root: Path = ROOT) -> list[list[Path]]:
    """Every import circle among our modules (lazy imports inside functions count: they run too), each
    as its files sorted; [] when there is none. A circle makes each of its modules a code dep of every
    stage that runs one of them, and an edit anywhere in it reruns them all."""
    files = sorted(p.relative_to(root) for top in OURS for p in (root / top).rglob("*.py"))
    edges = {f: sorted(imported(f, root) - {f}) for f in files}
    order, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: Path) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for f in files:
        if f not in order:
            visit(f)
    return found


def entry_point(stage: dict) -> Path:
    """stages/<name>.py from a stage's `python -m stages.<name> ...` command."""
    module = stage["cmd"].split("python -m ", 1)[1].split()[0]
    return Path(*module.split(".")).with_suffix(".py")


def is_code(dep: str) -> bool:
    return dep.endswith(".py") and dep.split("/")[0] in OURS


def wanted_deps(stage: dict, root: Path = ROOT) -> list[str]:
    """The entry point, the rest of its code sorted, then the stage's data deps in their order."""
    entry = entry_point(stage)
    code = sorted(str(p) for p in code_of(entry, root) - {entry})
    return [str(entry)] + code + [d for d in stage.get("deps", []) if not is_code(d)]


def rewrite(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """dvc.yaml's text with every stage's deps list as wanted_deps says -> (text, stages changed).
    Only the list lines change: comments, order of keys and everything else stay as written."""
    stages = yaml.safe_load(text)["stages"]
    lines = text.splitlines(keepends=True)
    changed = []
    for name, raw in stages.items():
        stage = raw.get("do", raw)
        start = next(i for i, line in enumerate(lines) if line.rstrip() == f"  {name}:")
        deps = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "deps:")
        indent = lines[deps][: len(lines[deps]) - len(lines[deps].lstrip())] + "  "
        end = deps + 1
        while end < len(lines) and lines[end].startswith(indent + "- "):
            end += 1
        want = [f"{indent}- {d}\n" for d in wanted_deps(stage, root)]
        if lines[deps + 1 : end] != want:
            changed.append(name)
            lines[deps + 1 : end] = want
    return "".join(lines), changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stages whose code deps differ")
    a = ap.parse_args()
    path = ROOT / "dvc.yaml"
    text, changed = rewrite(path.read_text())
    found = circles()
    if found:
        shown = "; ".join(" -> ".join(str(f) for f in c) for c in found)
        print(f"import circles among our modules (break each): {shown}", file=sys.stderr)
        sys.exit(1)
    if a.check:
        if changed:
            print(
                f"dvc.yaml: code deps differ from the imports for {', '.join(changed)} "
                "(python -m scripts.pipeline.stage_deps rewrites them)",
                file=sys.stderr,
            )
            sys.exit(1)
        return
    from scripts.pipeline import atomic

    atomic.write_text(path, text)
    print(f"dvc.yaml: code deps rewritten for {len(changed)} stages" + (f": {', '.join(changed)}" if changed else ""))


if __name__ == "__main__":
    main()
