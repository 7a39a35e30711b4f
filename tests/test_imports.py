"""The import graph runs one way: no cycle between modules, none between parts, and no part imports a later one.

Every `import` / `from ... import` of every module counts, those inside functions included (read with ast, nothing
is imported). Parts, in order: fx, papers, position_modes (leaves) -> attention (the kernels and what they read) ->
layout (token and batch layouts) -> pos -> layers -> models -> zoo (and the package's `__init__`, the zoo's front
door) -> data, recipes -> engine -> bench. Attention and the attention layer import nothing from pos: the PEs build
what attention declares."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "visionpe"

RANK = {
    "fx": 0,
    "papers": 0,  # the table of papers (data only), read by presets, the zoo's cfgs, reports and cards
    "position_modes": 0,  # the test-time position modes (the one list: models, PEs, CLI, benchmark)
    "attention": 1,  # attend, its backends, masks, inputs (PosContext, AttnRoute) and row blocks: declared here
    "layout": 2,  # TokenLayout, and BatchLayout: where each image of a native batch sits (it holds an AttnMask)
    "pos": 3,
    "layers": 4,
    "models": 5,
    "zoo": 6,
    "<root>": 6,
    "data": 7,
    "recipes": 7,
    "engine": 8,
    "bench": 9,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _known(name: str) -> str | None:
    """The module an imported name lives in (`visionpe.pos.base.PEHost` -> `visionpe.pos.base`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        else:
            continue
        found |= {t for n in names if n.split(".")[0] == "visionpe" and (t := _known(n)) and t != module}
    return found


@functools.cache
def _full_graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(_targets(m, p)) for m, p in MODULES.items()}


def _graph(bench: bool = True) -> dict[str, set[str]]:
    """module -> the modules it imports; without bench/ (whose cycle its own rework removes) when bench=False."""
    keep = {m for m in MODULES if bench or part(m) != "bench"}
    return {m: set(t) & keep for m, t in _full_graph().items() if m in keep}


def part(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "<root>"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walk_sees_function_level_and_relative_imports():
    graph = _graph()
    assert len(graph) > 100 and "visionpe.attention.inputs" in graph["visionpe.layers.attention_layer"]
    assert "visionpe.pos.base" in graph["visionpe.models.swin"]
    assert {"visionpe.zoo", "visionpe.attention", "visionpe.layout"} <= graph["visionpe"]
    # a cycle through a function-level import is found
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_part_has_a_rank():
    assert {part(m) for m in MODULES} <= set(RANK), sorted({part(m) for m in MODULES} - set(RANK))


@pytest.mark.parametrize("bench", [False, True], ids=["outside-bench", "everything"])
def test_no_import_cycle_between_modules(bench):
    found = _cycle(_graph(bench))
    assert found is None, " -> ".join(found)


def test_no_cycle_between_parts_and_no_part_imports_a_later_one():
    parts: dict[str, set[str]] = defaultdict(set)
    backwards = []
    for a, targets in _graph().items():
        for b in targets:
            if part(a) != part(b):
                parts[part(a)].add(part(b))
                if RANK.get(part(a), 99) < RANK.get(part(b), 99):
                    backwards.append(f"{a} -> {b}")
    assert not backwards, f"imports against the order of the parts: {sorted(backwards)}"
    found = _cycle(dict(parts))
    assert found is None, " -> ".join(found)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if part(m) in ("pos", "layout", "fx")))
def test_the_lower_parts_never_name_a_backbone(module):
    """pos / layout / fx know no model family: their imports stay inside the lower parts."""
    assert {part(t) for t in _graph()[module]} <= {"pos", "layout", "fx", "papers", "attention", "position_modes"}


def _reached(module: str) -> set[str]:
    """Every module `module` imports, directly or through others."""
    graph, seen, todo = _graph(), set(), [module]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


ATTENTION = sorted(m for m in MODULES if part(m) == "attention")


@pytest.mark.parametrize("module", [*ATTENTION, "visionpe.layers.attention_layer", "visionpe.layers.block"])
def test_attention_imports_nothing_from_pos(module):
    """The kernels, attention's input types and the attention layer reach no module of pos/, not even through
    another: attention declares its inputs (PosContext, RowBias, ...) and the PEs implement them."""
    found = sorted(t for t in _reached(module) if part(t) == "pos")
    assert not found, f"{module} reaches {found}"


def test_the_pes_build_attentions_types():
    """The arrow runs from pos to attention's input types (pos/base re-exports PosContext from there)."""
    assert "visionpe.attention.inputs" in _graph()["visionpe.pos.base"]
    assert "visionpe.attention.rows" in _graph()["visionpe.pos.irpe"]
