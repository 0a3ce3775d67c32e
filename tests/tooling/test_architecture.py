"""The package's architecture, read from its source with ``ast`` (nothing is imported, torch included).

The package is laid out in parts (subpackages): ``core`` (the attention module and what it is made of), ``models``
(tasks, tiny transformers, training), ``modern`` (tiled attention, grouped K/V heads and the Part II studies),
``analysis`` (inspecting and pruning heads), ``pretrained`` (a real encoder), ``bench`` and ``checks``; ``device``,
``figures`` and ``__init__`` sit at the top. The parts import each other without a cycle.

Layers, bottom to top; a module may import its own layer and the ones below, never one above:

0. tooling that knows nothing of attention (``device``, ``figures``, ``data``: the shipped files' folder);
1. the core attention: scores, masks, heads, multi-head attention, positions, caches, kernels, and their checks;
2. the tiny models (``models.blocks``, ``models.model``) and their checks;
3. the tasks and training, and their checks;
4. what is built on trained models: inspecting and pruning heads, figures, studies, benchmarks;
5. the pretrained models and what uses them (the SmolLM2 benchmark, the benchmarks' command line), the notebooks'
   checks, and the package's ``__init__``.

Every import counts, at the top of a module or inside a function (a lazy import is still a dependency: it only
runs later), except those under ``if TYPE_CHECKING:``, which never run. On top of the layers: no import cycle at
all, even within a layer, and the size limits of DEVELOPERS' standards (modules <= 400 lines, functions <= 60).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mha_tutorial"
DATA = PACKAGE.parent / "data"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# {module: layer}. A module is named by its path in the package ("checks.nb01"); "__init__" is the package's own
# __init__.py. An entry for a subpackage ("checks") covers every module in it.
LAYERS = {
    "device": 0,
    "figures": 0,
    "data": 0,  # data/ in the repository, mapped onto mha_tutorial.data: where the shipped files are
    # the subpackages' __init__ files (docstrings; bench re-exports its measuring tools)
    "core": 1,
    "modern": 1,
    "models": 2,
    "analysis": 4,
    "bench": 4,
    "pretrained": 5,
    # 1. core attention
    "core.attention": 1,
    "core.masks": 1,
    "core.heads": 1,
    "core.mha": 1,
    "core.rope": 1,
    "modern.flash": 1,
    "modern.flash_triton": 1,
    "core.kv_cache": 1,
    "modern.gqa": 1,
    "core.variants": 1,
    "core._validate": 1,
    "core._validate_masks": 1,
    "core._validate_rope": 1,
    "core._validate_cache": 1,
    # 2. tiny models
    "models.blocks": 2,
    "models.model": 2,
    "models._validate_model": 2,
    # 3. tasks and training
    "models.task_base": 3,
    "models.tasks": 3,
    "models.train": 3,
    "models._validate_training": 3,
    "models._validate_experiments": 3,
    # 4. inspecting and pruning heads, figures, studies, benchmarks
    "analysis.pruning": 4,
    "analysis.maps": 4,
    "analysis.viz": 4,
    "analysis.head_stats": 4,
    "analysis._head_patterns": 4,
    "analysis.mask_viz": 4,
    "analysis.mha_figures": 4,
    "modern.length_study": 4,
    "modern.gqa_study": 4,
    "bench.attention": 4,
    "bench.report": 4,
    "bench.decode": 4,
    "bench.flash": 4,
    # 5. pretrained models, the notebooks' checks, the package
    "pretrained.bert": 5,
    "pretrained._validate_bert": 5,
    "pretrained.minilm": 5,
    "pretrained.bert_heads": 5,
    "pretrained.retrieval": 5,
    "pretrained._retrieval_score": 5,
    "pretrained.retrieval_study": 5,
    "pretrained._validate_pretrained": 5,
    "checks": 5,
    "bench.smollm": 5,  # a benchmark of the pretrained decoder
    "bench.__main__": 5,  # the benchmarks' command line, reaching every benchmark
    "__init__": 5,
}


# ---- reading the import graph ------------------------------------------------------------------------------------
def module_name(path: Path, root: Path = PACKAGE) -> str:
    """'attention' for attention.py, 'checks.nb01' for checks/nb01.py, 'checks' for checks/__init__.py."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom, at any depth (functions, methods, branches), except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        children = list(ast.iter_child_nodes(node))
        if _is_type_checking(node):
            children = list(node.orelse)  # the else branch runs
        stack.extend(children)


def _resolve(name: str, node: ast.AST, modules: set[str]) -> set[str]:
    """The package modules that one import statement in module ``name`` loads."""
    if name == "__init__":
        package = []
    elif any(m.startswith(name + ".") for m in modules):  # a subpackage's __init__
        package = name.split(".")
    else:
        package = name.split(".")[:-1]
    found = set()
    if isinstance(node, ast.ImportFrom):
        if node.level:  # from . import x, from ..mod import y
            target = [*package[: len(package) - node.level + 1], *(node.module.split(".") if node.module else [])]
        elif node.module and node.module.split(".")[0] == PACKAGE.name:
            target = node.module.split(".")[1:]
        else:
            return found
        dotted = ".".join(target)
        submodules = {f"{dotted}.{a.name}".lstrip(".") for a in node.names} & modules
        found |= submodules
        if len(submodules) < len(node.names):  # some name comes from the module itself
            found.add(dotted or "__init__")
    else:
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == PACKAGE.name:
                found.add(".".join(parts[1:]) or "__init__")
    return {m for m in found if m in modules and m != name}


def import_graph(sources: dict[str, str]) -> dict[str, dict[str, int]]:
    """{module: {imported package module: line of the first such import}} from {module: source text}."""
    modules = set(sources)
    graph = {}
    for name, text in sources.items():
        edges: dict[str, int] = {}
        for node in _import_nodes(ast.parse(text)):
            for target in _resolve(name, node, modules):
                edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict]) -> list[list[str]]:
    """The import cycles: each strongly connected component of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer_of(name: str, layers: dict[str, int] = LAYERS) -> int | None:
    """The layer of ``name``, or of the closest subpackage that has one; None when none is given."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in layers:
            return layers[".".join(parts[:n])]
    return None


def upward_imports(graph: dict[str, dict[str, int]], layers: dict[str, int] = LAYERS) -> list[str]:
    return [
        f"{name} (layer {layer_of(name, layers)}) imports {target} (layer {layer_of(target, layers)}) at line {line}"
        for name, edges in sorted(graph.items())
        for target, line in sorted(edges.items())
        if layer_of(target, layers) > layer_of(name, layers)
    ]


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    found = {module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}
    found["data"] = (DATA / "__init__.py").read_text(encoding="utf-8")  # pyproject maps data/ onto mha_tutorial.data
    return found


@pytest.fixture(scope="module")
def graph(sources) -> dict[str, dict[str, int]]:
    return import_graph(sources)


# ---- the package -------------------------------------------------------------------------------------------------
def test_the_graph_holds_the_imports_that_count_and_only_those(graph):
    """The reader itself, on imports whose answer is known: top-level, lazy (inside a function), a subpackage's
    relative one, and one under ``if TYPE_CHECKING:``, which never runs and so does not count."""
    assert "core.attention" in graph["core.mha"]  # from .attention import DotProductAttention, at the top
    assert "modern.flash_triton" in graph["bench.flash"]  # only inside a function, when triton is there
    assert "analysis.pruning" in graph["checks.nb07"]  # from ..analysis import pruning
    assert "checks._common" in graph["checks.nb01"]  # from ._common import ...
    assert "models.model" not in graph["models.blocks"]  # only under TYPE_CHECKING
    assert {"core.mha", "models.model", "models.train", "models.tasks", "pretrained.bert"} <= set(graph["__init__"])


def test_no_import_cycle(graph):
    found = cycles(graph)
    assert not found, (
        "import cycles among the package's modules (lazy imports inside functions count; only `if TYPE_CHECKING:` "
        f"blocks do not): {found}. Edges inside them: "
        + "; ".join(f"{v} -> {sorted(w for w in graph[v] if w in c)}" for c in found for v in c)
    )


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The import graph between the package's parts: a module ``core.mha`` belongs to ``core``; a top-level module
    (``device``, ``figures``, ``__init__``) is a part of its own."""
    part = lambda name: name.split(".")[0]  # noqa: E731
    parts: dict[str, dict[str, int]] = {}
    for name, edges in graph.items():
        out = parts.setdefault(part(name), {})
        for target, line in edges.items():
            if part(target) != part(name):
                out.setdefault(part(target), line)
    return parts


def test_the_parts_import_each_other_without_a_cycle(graph):
    """Not only modules: the subpackages too form no cycle, so each part can be read knowing only those below it."""
    parts = package_graph(graph)
    assert set(parts) >= {"core", "modern", "models", "analysis", "pretrained", "bench", "checks"}
    assert not cycles(parts), f"cycles between the package's parts: {cycles(parts)}"
    assert set(parts["core"]) <= {"device"}, f"the core imports {sorted(parts['core'])}; it may import nothing above"


def test_the_top_level_holds_only_the_entry_and_the_tools():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert flat == ["__init__.py", "device.py", "figures.py"], f"modules outside a part: {flat}"


def test_every_module_has_a_layer_and_every_layer_entry_a_module(graph):
    missing = sorted(name for name in graph if layer_of(name) is None)
    assert not missing, (
        f"modules without a layer: {missing}. Add each to LAYERS in {Path(__file__).name} (layers: 1 core attention, "
        "2 tiny models, 3 tasks and training, 4 head inspection/pruning/figures/studies/benchmarks, 5 pretrained "
        "models, checks, __init__), by what it does and what it imports"
    )
    stale = sorted(name for name in LAYERS if name not in graph)
    assert not stale, f"LAYERS names modules that do not exist (renamed or removed?): {stale}"


def test_no_module_imports_a_higher_layer(graph):
    upward = upward_imports(graph)
    assert not upward, "imports from a higher layer (move the code down, or pass the class in):\n" + "\n".join(upward)


def test_module_and_function_sizes(sources):
    too_long = [
        f"{name}: {len(text.splitlines())} lines (at most {MAX_MODULE_LINES})"
        for name, text in sources.items()
        if len(text.splitlines()) > MAX_MODULE_LINES
    ]
    too_long += [
        f"{name}.{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines "
        f"(at most {MAX_FUNCTION_LINES})"
        for name, text in sources.items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not too_long, "\n".join(too_long)


# ---- the checks themselves, on made-up packages ------------------------------------------------------------------
FAKE = {
    "__init__": "from .low import f\n",
    "low": "def f():\n    from .high import g  # lazy\n",
    "high": "from typing import TYPE_CHECKING\nfrom . import low\nif TYPE_CHECKING:\n    from .top import T\n",
    "top": "import mha_tutorial.high\n",
    "sub": "",
    "sub.a": "from ..low import f\nfrom . import b\n",
    "sub.b": "x = 1\n",
}


def test_a_lazy_import_makes_a_cycle_and_type_checking_imports_do_not_count():
    fake = import_graph(FAKE)
    assert fake["low"] == {"high": 2}
    assert fake["high"] == {"low": 2}  # not "top": TYPE_CHECKING
    assert fake["top"] == {"high": 1}
    assert fake["sub.a"] == {"low": 1, "sub.b": 2}
    assert cycles(fake) == [["high", "low"]]
    assert cycles({**fake, "low": {}}) == []


def test_an_upward_import_is_named_with_its_layers_and_line():
    fake = import_graph(FAKE)
    layers = {"__init__": 9, "low": 1, "high": 2, "top": 3, "sub": 1}
    assert upward_imports(fake, layers) == ["low (layer 1) imports high (layer 2) at line 2"]
    assert layer_of("sub.a", layers) == 1  # a subpackage's entry covers its modules
    assert layer_of("missing", layers) is None
