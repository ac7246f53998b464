"""The house rules that can be checked mechanically: no import cycles in the package (lazy imports inside functions
included), the engine never imports ROS, the runtime never imports the dev tools (test models; the CLI is a tool and
may, the drafter trainer ships with the engine's GGUF writer instead), and no module is over 400 lines without a reason
at its top."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
REASON = "Over 400 lines on purpose"


def _modules() -> dict[str, Path]:
    out = {}
    for p in (ROOT / "bolt_ros").rglob("*.py"):
        if "kernels" in p.relative_to(ROOT).parts[1:2]:
            p = ROOT / "kernels" / p.relative_to(ROOT / "bolt_ros" / "kernels")  # the symlinked package
        parts = p.relative_to(ROOT).with_suffix("").parts
        parts = ("bolt_ros", *parts) if parts[0] == "kernels" else parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Package modules `name` imports anywhere in its file (module level or inside functions)."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                found.add(sub if sub in mods else mod)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in mods and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = _graph()
    assert _cycles(graph) == []
    # negative control: the detector sees a cycle when one is added
    graph["bolt_ros.engine.text.chat_format"] = graph["bolt_ros.engine.text.chat_format"] | {
        "bolt_ros.engine.text.gemma4_format"}
    assert _cycles(graph)


def test_layers_only_import_downwards():
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith(("bolt_ros.engine", "bolt_ros.kernels")):
            assert not [d for d in deps if d.startswith(("bolt_ros.nodes", "bolt_ros.assistant", "bolt_ros.msg"))], mod
        # the CLI may use the dev tools (its `testmodel`); the runtime and the drafter trainer (its GGUF export is the
        # engine's writer, engine/gguf/writer.py) never do
        if not mod.startswith("bolt_ros.devtools") and mod != "bolt_ros.cli":
            assert not [d for d in deps if d.startswith("bolt_ros.devtools")], mod
    engine_src = [p for m, p in _modules().items() if m.startswith(("bolt_ros.engine", "bolt_ros.kernels"))]
    assert not [p for p in engine_src if "rclpy" in p.read_text()]


def test_no_module_over_400_lines_without_a_reason():
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    unexplained = [m for m in long if REASON not in (ast.get_docstring(ast.parse(_modules()[m].read_text())) or "")]
    assert unexplained == [], long
