"""The house rules of the import graph (docs/OWNERS.md), checked on the source: each room
imports only the rooms below it, the library holds no tools and no print, pyverbs has one
home, and no two modules import each other in a circle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nr_contract", "netreduce", "flowctl", "ring_setup", "switch", "labswitches",
            "benchmarks")
LIBRARY_TOOLS = "netreduce.tools"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if "_pb2" not in p.name}


def imports(path: Path) -> set[str]:
    """Modules `path` imports anywhere, function-local imports included (`from a.b import c`
    counts as a.b and a.b.c)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# room -> the project rooms it may import (besides itself)
ALLOWED = {
    "nr_contract": (),                       # beneath both sides: imports neither
    "switch.dataplane": ("nr_contract.spec",),
    "flowctl": ("nr_contract.spec",),
    "ring_setup": ("flowctl", "nr_contract.spec"),
    "switch.p4": (),
    "switch.native": ("nr_contract.spec", "switch.dataplane"),   # the C data plane's bindings
    "switch.control": ("nr_contract", "switch.dataplane", "switch.p4", "switch.native"),
    "netreduce": ("nr_contract", "flowctl", "ring_setup"),     # the library, its tools too
}


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_each_room_imports_only_the_rooms_below_it(room: str) -> None:
    bad = []
    for name, path in project_modules().items():
        if not within(name, (room,)):
            continue
        for imp in imports(path):
            top = imp.split(".")[0]
            if top in PACKAGES and not within(imp, (room, *ALLOWED[room])):
                bad.append(f"{name} imports {imp}")
    assert not bad, bad


def test_the_library_imports_no_tools() -> None:
    bad = [f"{name} imports {imp}" for name, path in project_modules().items()
           if within(name, ("netreduce",)) and not within(name, (LIBRARY_TOOLS,))
           for imp in imports(path) if within(imp, (LIBRARY_TOOLS,))]
    assert not bad, bad


def test_no_installed_package_imports_the_harness_directories() -> None:
    """labswitches/ and benchmarks/ are not installed: nothing installed may need them."""
    harness = ("labswitches", "benchmarks")
    bad = [f"{name} imports {imp}" for name, path in project_modules().items()
           if not within(name, harness) for imp in imports(path) if within(imp, harness)]
    assert not bad, bad


def test_pyverbs_has_one_home() -> None:
    users = sorted(name for name, path in project_modules().items()
                   if any(within(i, ("pyverbs",)) for i in imports(path)))
    assert users and all(within(u, ("ring_setup.verbs",)) for u in users), users


def test_the_library_does_not_print() -> None:
    bad = []
    for name, path in project_modules().items():
        if not within(name, ("netreduce", "flowctl", "ring_setup", "nr_contract")) \
                or within(name, (LIBRARY_TOOLS,)):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                bad.append(f"{name}:{node.lineno}")
    assert not bad, bad


def test_no_import_circle_between_modules() -> None:
    """Over every import, function-local ones included: a lazy import does not hide a
    circle."""
    mods = project_modules()
    graph = {name: {i for i in imports(path) if i in mods and i != name}
             for name, path in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail("import circle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_readme_stays_a_manual_of_at_most_12_kb() -> None:
    """Measurements and narratives live in docs/ (issue 25): the README is the user's manual."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12_000, f"README.md is {size} bytes: move detail to docs/"
