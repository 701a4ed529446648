"""The house's rules, read from the package's own imports (docs/explanation/architecture.md):
no import cycle, every arrow pointing down the floors, no module too long to live in."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "django_reactor"
NAME = "django_reactor"
LONGEST = 800

#: The floors, lowest first; a module may import its own floor and those below.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("states", "exceptions", "conf")),
    ("engine", ("engine", "faults", "actors")),
    ("models", ("models", "migrations", "coordination.models")),
    ("store", ("store",)),
    ("coordination", ("coordination",)),
    ("runtime", ("runtime", "registry", "observability", "otel", "signals")),
    ("services", ("services", "handle", "reactor", "graph", "display")),
]
#: Everything else (api, admin, management, celery, testing, checks, apps, demo, the package's
#: ``__init__``) is a face, on the top floor.
FACES = len(FLOORS)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def floor(module: str) -> int:
    rest = module.split(".", 1)[1] if "." in module else ""
    for index, (_, heads) in enumerate(FLOORS):  # a dotted entry is more precise than a head
        if any(rest == h or rest.startswith(h + ".") for h in heads if "." in h):
            return index
    head = rest.split(".")[0]
    for index, (_, heads) in enumerate(FLOORS):
        if head in heads:
            return index
    return FACES


def imports(module: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    """``(imported module, line, at run time)``; type-checking-only imports say False."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    checking: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in ast.walk(node):
                checking.add(id(inner))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            if name == NAME or name.startswith(NAME + "."):
                yield name, node.lineno, id(node) not in checking


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for name, _, at_run_time in imports(module, path):
            if at_run_time and name in known and name != module:
                edges[module].add(name)
    return edges


def test_no_import_cycle() -> None:
    edges = graph()
    # A package's __init__ that re-exports its submodules is one room with them.
    for module in list(edges):
        edges[module] = {t for t in edges[module] if not module.startswith(t + ".")}
    visiting: list[str] = []
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        if module in visiting:
            cycles.append([*visiting[visiting.index(module) :], module])
            return
        if module in done:
            return
        visiting.append(module)
        for target in sorted(edges[module]):
            visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(edges):
        visit(module)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_import_points_down_the_floors() -> None:
    against = []
    for module, path in modules().items():
        for name, line, at_run_time in imports(module, path):
            # Type-checking-only imports never run; the package itself (its version) is there
            # before any of its modules.
            if not at_run_time or name == NAME or module == NAME or ".__" in name:
                continue
            if floor(name) > floor(module):
                against.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} -> {name}")
    assert against == [], "imports against the floors:\n" + "\n".join(sorted(set(against)))


@pytest.mark.parametrize("forbidden", ["django.db", "celery", "rest_framework", "django_redis"])
def test_the_engine_is_pure(forbidden: str) -> None:
    found = []
    for path in (PACKAGE / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names.append(getattr(node, "module", None) or "")
                if any(n == forbidden or n.startswith(forbidden + ".") for n in names):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert found == []


def test_no_module_is_too_long() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts
        and (lines := len(path.read_text().splitlines())) > LONGEST
    }
    assert long == {}, f"modules over {LONGEST} lines: {long}"


def test_executors_are_built_in_one_place() -> None:
    """Every executor of a stored run comes from ``runtime/executors.py``; the engine builds
    the in-memory ones of map elements through ``Executor.in_memory``."""
    builder = PACKAGE / "runtime" / "executors.py"
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path == builder:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name | ast.Attribute)
                and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
                == "Executor"
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert found == [], "executors built outside runtime/executors.py:\n" + "\n".join(found)


@pytest.mark.parametrize("gone", ["engine.composition", "engine.interrupts", "engine.mapping"])
def test_nothing_imports_the_old_shims(gone: str) -> None:
    """The constructs live in ``engine/constructs/``; the modules that re-exported them are
    gone (stored shapes that name them are compared as text, never imported)."""
    assert not (PACKAGE / Path(*gone.split("."))).with_suffix(".py").exists()
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for module, path in modules().items()
        for name, line, _ in imports(module, path)
        if name == f"{NAME}.{gone}" or name.startswith(f"{NAME}.{gone}.")
    ]
    assert found == []


def test_the_store_does_not_decide_what_a_record_means() -> None:
    """The store reads step records back; which statuses go on the undo stack, wait or are
    compensated is the engine's to say (``Construct.restore``)."""
    reads = PACKAGE / "store" / "reads.py"
    used = {
        node.value.id
        for node in ast.walk(ast.parse(reads.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    assert not used & {"StepStatus", "RollbackStatus"}


#: Where a connection's vendor may be read: the store's dialects, chosen from it once per alias
#: (``store.dialects``). Migrations (any ``migrations/`` folder) are left alone too: frozen
#: history, each with the vendor checks it was written with.
READS_THE_VENDOR = ("store/dialects/",)


def test_only_the_dialects_read_the_database_vendor() -> None:
    """Everything that depends on the database asks the store's dialect (``store.dialect()``,
    ``store.dialect_for(alias)``), so no module checks ``connection.vendor`` of its own."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE)
        if where.as_posix().startswith(READS_THE_VENDOR) or "migrations" in where.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            read = isinstance(node, ast.Attribute) and node.attr == "vendor"
            read = read or (  # getattr(connection, "vendor")
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and any(isinstance(a, ast.Constant) and a.value == "vendor" for a in node.args)
            )
            if read:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    listed = "\n".join(found)
    assert found == [], f"a connection's vendor read outside store/dialects/:\n{listed}"
