"""The package's layers stay clean: every import goes down the layer order of the README's Layout section (or stays
within its layer), no import cycle crosses a package boundary, and no private name is imported from another module.

Imports are read from the source (ast), those inside functions included: a lazy import upward is still an arrow
upward. `ember/__init__.py` is the public surface (ember.compile, ember.load, ember.build, te, tir): it is not
checked, and importing it counts as importing ember.compiler."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ember"


def layer_order() -> list[str]:
    """The layers of the README's Layout section, lowest first: module paths like "ember/tir" or "ember/cli"."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout") :]
    block = section[section.index("```") + 3 :]
    block = block[: block.index("```")]
    return [m.group(1).rstrip("/").removesuffix(".py") for m in re.finditer(r"^(ember/\S+)", block, re.M)]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str | None, int]]:
    """(module imported, name imported from it or None, line) for every ember import of a module."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "ember"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "ember":
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.append((sub, None, node.lineno) if sub in known else (source, a.name, node.lineno))
    return out


def layer_of(module: str, layers: list[str]) -> int | None:
    path = module.replace(".", "/")
    for i, layer in enumerate(layers):
        if path == layer or path.startswith(layer + "/"):
            return i
    return None


def graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, str | None, int]]]]:
    mods = modules()
    return mods, {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_the_layout_names_every_module():
    layers = layer_order()
    assert len(layers) >= 10 and layers[0] == "ember/target", layers
    unplaced = [m for m in modules() if m != "ember" and layer_of(m, layers) is None]
    assert not unplaced, f"modules missing from the README's Layout section: {unplaced}"


def test_imports_go_down_the_layers():
    layers = layer_order()
    mods, edges = graph()
    upward = []
    for name, imps in edges.items():
        if name == "ember":
            continue
        mine = layer_of(name, layers)
        for target, _, line in imps:
            theirs = layer_of("ember.compiler" if target == "ember" else target, layers)  # ember: compile, load
            if mine is not None and theirs is not None and theirs > mine:
                where = f"{mods[name].relative_to(ROOT)}:{line}"
                upward.append(f"{where} imports {target} ({layers[theirs]} is above {layers[mine]})")
    assert not upward, "imports upward across layers:\n" + "\n".join(upward)


def test_no_private_name_crosses_modules():
    mods, edges = graph()
    private = [f"{mods[name].relative_to(ROOT)}:{line} imports {item} from {target}"
               for name, imps in edges.items() for target, item, line in imps
               if item is not None and item.startswith("_") and not item.startswith("__")]  # fmt: skip
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_crosses_a_package():
    mods, edges = graph()
    simple = {name: {t for t, _, _ in imps if t in mods and t != name} for name, imps in edges.items()}
    simple.pop("ember")
    for v in simple.values():
        v.discard("ember")

    def package(m: str) -> str:
        return m if mods[m].name == "__init__.py" else m.rsplit(".", 1)[0]

    crossing = [c for c in cycles(simple) if len({package(m) for m in c}) > 1]
    assert not crossing, f"import cycles across packages: {crossing}"


def test_the_checks_see_a_planted_violation(tmp_path):
    """The checker itself: an upward import, a private import and a cycle in a made-up package are all found."""
    layers = ["ember/low", "ember/high"]
    assert layer_of("ember.low.a", layers) == 0 and layer_of("ember.high", layers) == 1
    assert layer_of("ember.elsewhere", layers) is None
    src = tmp_path / "ember" / "low"
    src.mkdir(parents=True)
    (src / "a.py").write_text("from ember.high import thing\nfrom .b import _hidden\n")
    found = imports("ember.low.a", src / "a.py", {"ember.low.a", "ember.low.b", "ember.high"})
    assert ("ember.high", "thing", 1) in found and ("ember.low.b", "_hidden", 2) in found
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
