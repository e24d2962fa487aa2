"""The shape of the code: modules small enough to read in one sitting, functions short
enough to follow, imports that run one way, and NOTE citations that resolve."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("offrecomp", "scheduler")
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_module_is_too_long() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_is_too_long() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Project modules ``path`` imports when it runs (at module level or inside a
    function; imports only a type checker reads are left out)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def test_imports_run_one_way() -> None:
    """No import circle among the project's modules (a package's ``__init__`` may import
    its own modules)."""
    paths = {_module_name(p): p for p in _sources()}
    modules = set(paths)
    graph = {m: {d for d in _imports(p, modules) if d != m and not m.startswith(d + ".")} for m, p in paths.items()}
    for m, p in paths.items():
        if p.name == "__init__.py":
            continue
        # importing a.b runs a/__init__.py: a dependency on each enclosing package
        graph[m] |= {d.rpartition(".")[0] for d in graph[m] if "." in d and d.rpartition(".")[0] in modules} - {m}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if d.startswith(m + ".") and paths[m].name == "__init__.py":
                continue  # a package's __init__ gathering its modules
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d):], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


#: A NOTE block's header: the name alone on its line (a comment or a docstring line).
_HEADER = re.compile(r"^\s*(?:#\s*)?NOTE \[([^\]]+)\]\s*$")
#: A paragraph led by the name (``NOTE [Name]: ...``): a docstring-style block.
_LEAD = re.compile(r'^\s*(?:#\s*|""")?NOTE \[([^\]]+)\]:')
_CITATION = re.compile(r"NOTE \[([^\]]+)\]")


def test_note_citations_resolve() -> None:
    """Every ``NOTE [Name]`` cited in the code has a block, and no two blocks share a
    name."""
    headers: dict[str, list[str]] = {}
    leads: set[str] = set()
    cited: dict[str, str] = {}
    for path in _sources():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{i}"
            m = _HEADER.match(line)
            if m:
                headers.setdefault(m.group(1), []).append(where)
            m = _LEAD.match(line)
            if m:
                leads.add(m.group(1))
            for name in _CITATION.findall(line):
                cited.setdefault(name, where)
    missing = {n: w for n, w in cited.items() if n not in headers and n not in leads}
    twice = {n: ws for n, ws in headers.items() if len(ws) > 1}
    assert not missing, f"cited but never defined: {missing}"
    assert not twice, f"defined more than once: {twice}"


def test_the_design_doc_indexes_every_note() -> None:
    """docs/design.md's NOTE index names exactly the NOTE blocks in the code."""
    names: set[str] = set()
    for path in _sources():
        for line in path.read_text().splitlines():
            for pattern in (_HEADER, _LEAD):
                m = pattern.match(line)
                if m:
                    names.add(m.group(1))
    doc = (ROOT / "docs" / "design.md").read_text()
    index = doc[doc.index("## NOTE index"):]
    listed = {m.group(1) for m in re.finditer(r"^- ([^:]+):", index, re.M)}
    assert names - listed == set(), f"NOTE blocks missing from the index: {sorted(names - listed)}"
    assert listed - names == set(), f"index entries with no NOTE block: {sorted(listed - names)}"
