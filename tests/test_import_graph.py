"""vrl's modules import each other in layers, without circles.

The graph is read from the source (ast): every `import` that runs - at module level or
inside a function (vrl imports torch, numpy and the heavier modules inside functions, so
that light commands stay fast: those imports count here as much as the others). Imports
under `if TYPE_CHECKING:` never run; they form no circle either (a mixin declares what it
needs from the class it is mixed into instead of importing that class).
"""

import ast
from pathlib import Path

import vrl

ROOT = Path(vrl.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imported(node: ast.AST, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        package = module.split(".")[:-node.level] if node.level else []
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module but those under `if TYPE_CHECKING:`."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.append(ast.Module(body=child.orelse, type_ignores=[]))
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            else:
                todo.append(child)
    return found


def _all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _graph(statements=_runtime_imports) -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name if name and name != "vrl" else None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(name) for node in statements(ast.parse(path.read_text()))
                   for name in _imported(node, module)}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_module_of_vrl_imports_one_that_imports_it_back():
    assert _cycles(_graph()) == []


def test_not_even_for_type_annotations():
    assert _cycles(_graph(_all_imports)) == []


def test_the_check_sees_a_circle():
    graph = _graph()
    assert "vrl.objects" in graph["vrl.repo"]  # the graph is read at all
    graph["vrl.objects"] = graph["vrl.objects"] | {"vrl.repo"}  # as a function's import
    assert any({"vrl.objects", "vrl.repo"} <= set(c) for c in _cycles(graph))


def test_the_core_never_imports_the_layers_above_it():
    """The store (objects up to the repository) knows nothing of remotes, the CLI, the
    UI, the Snapshotter or the framework integrations: it reaches remotes through an entry
    point (`vrl.repo.remote_layer`)."""
    graph = _graph()
    core = {m for m in graph if m.count(".") == 1 and m not in
            ("vrl.cli", "vrl.ui", "vrl.remote", "vrl.testing", "vrl.hooks", "vrl.committer",
             "vrl.snapshotter", "vrl.demo", "vrl.plots", "vrl.views", "vrl.interrupt",
             "vrl.__main__", "vrl.shm", "vrl.handover", "vrl.integrations")}
    above = ("vrl.cli", "vrl.ui", "vrl.remote", "vrl.testing", "vrl.integrations")
    reached = {(m, t) for m in core for t in graph[m] if t.startswith(above)}
    assert reached == set()


def test_imports_inside_functions_count_and_type_checking_ones_do_not():
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
                     "def f():\n    from d import e\nclass K:\n    def g(self):\n"
                     "        import h\n")
    assert sorted(ast.unparse(n) for n in _runtime_imports(tree)) == \
        ["from d import e", "import a", "import c", "import h"]
