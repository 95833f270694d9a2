"""The import rules of docs/architecture.md, read from the source with `ast` (nothing is imported).

The floors table of docs/architecture.md is the allowed-imports map: it is read from the document here, so the
document and the test cannot disagree. Every import is counted, at module level and inside functions alike:

* every package imports only its own modules and the packages its row names; the map itself only points
  down, `gates` imports nothing of the project and `fxpilot` no app (settings and URL roots name apps and
  URL modules as strings, which is not an import);
* no import circle anywhere (module-level and function-level imports together; `if TYPE_CHECKING:`
  imports, which never run, are left out of circles but not out of the map);
* no `except ImportError` in application code (a missing module is a broken install, not a feature);
* no import of a project module inside a function, unless the module's docstring names the imported
  module and says why.

runners/remote/ (scripts shipped to the nodes), runners/sim/ and runners/simnode/ (the simulated node and
server, started as programs of their own) and migrations are walked for the map and for circles, but are
not application code for the last two rules.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FLOORS_HEADING = "## The floors: who may import whom"
NOT_APPLICATION = ("runners/remote", "runners/sim", "runners/simnode", "migrations")
NOTHING = "nothing of the project"


# ── The map, read from the document ────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Floor:
    number: int
    package: str
    may_import: frozenset[str]


def read_floors(text: str) -> dict[str, Floor]:
    """The rows of the floors table: `| floor | package | what it holds | may import |`."""
    if FLOORS_HEADING not in text:
        raise AssertionError(f"docs/architecture.md has no section {FLOORS_HEADING!r}")
    section = text.split(FLOORS_HEADING, 1)[1].split("\n## ", 1)[0]
    floors = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 4 or not cells[0].isdigit():
            continue  # the header, its rule, prose
        package = cells[1].strip("`")
        allowed = cells[-1]
        names = frozenset(re.findall(r"`([a-z_]+)`", allowed))
        if not names and allowed != NOTHING:
            raise AssertionError(f"the row of {package} says neither packages nor {NOTHING!r}: {allowed!r}")
        floors[package] = Floor(int(cells[0]), package, names)
    if not floors:
        raise AssertionError("the floors table of docs/architecture.md has no row")
    return floors


def map_problems(floors: dict[str, Floor], apps: set[str], packages: set[str]) -> list[str]:
    """What is wrong with the map itself: a package outside it, an arrow that does not point down, a decider that
    knows somebody, a project on top that imports an app."""
    problems = [f"{p} is a package of the project but has no row in the floors table" for p in sorted(packages - set(floors))]
    problems += [f"{p} has a row but is no package" for p in sorted(set(floors) - packages)]
    for floor in floors.values():
        for target in sorted(floor.may_import):
            if target not in floors:
                problems.append(f"{floor.package} may import {target}, which has no row")
            elif floors[target].number >= floor.number:
                problems.append(f"{floor.package} (floor {floor.number}) may import {target} "
                                f"(floor {floors[target].number}): an arrow that does not point down")
    if floors.get("gates") is None or floors["gates"].may_import:
        problems.append("gates must import nothing of the project")
    if floors.get("fxpilot") is None or floors["fxpilot"].may_import & apps:
        problems.append("fxpilot must import no app")
    if "fxpilot" in floors and max(f.number for f in floors.values()) != floors["fxpilot"].number:
        problems.append("fxpilot must be the top floor")
    return problems


# ── The sources ────────────────────────────────────────────────────────────────────────────────


@dataclass
class Import:
    line: int
    dotted: str
    in_function: bool
    type_only: bool


@dataclass
class Source:
    name: str
    path: Path
    tree: ast.Module
    imports: list[Import] = field(default_factory=list)
    import_error_handlers: list[int] = field(default_factory=list)

    @property
    def package(self) -> str:
        return self.name.split(".")[0]

    @property
    def docstring(self) -> str:
        return ast.get_docstring(self.tree) or ""

    @property
    def application(self) -> bool:
        relative = f"/{self.path.as_posix()}"
        return not any(f"/{part}/" in relative for part in NOT_APPLICATION)

    @property
    def function_imports(self) -> list[tuple[int, str]]:
        return [(i.line, i.dotted) for i in self.imports if i.in_function]


def project_packages(root: Path) -> set[str]:
    """Every top-level Python package of the repository but the test suite."""
    return {p.parent.name for p in root.glob("*/__init__.py")} - {"tests"}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> list[str]:
    """The dotted names an import statement reaches: `from a import b` is a.b when a.b is a module, else a."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = here.split(".") if is_package else here.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{alias.name}" for alias in node.names]


def _visit(source: Source, node: ast.AST, in_function: bool, type_only: bool, packages: set[str]) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        in_function = True
    if _is_type_checking(node):
        type_only = True
    if isinstance(node, ast.ExceptHandler) and node.type is not None:
        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        if any(isinstance(c, ast.Name) and c.id in ("ImportError", "ModuleNotFoundError") for c in caught):
            source.import_error_handlers.append(node.lineno)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for dotted in _imported(node, source.name, source.path.name == "__init__.py"):
            if dotted.split(".")[0] in packages:
                source.imports.append(Import(node.lineno, dotted, in_function, type_only))
    for child in ast.iter_child_nodes(node):
        _visit(source, child, in_function, type_only, packages)


def read_sources(root: Path, packages: set[str] | None = None) -> dict[str, Source]:
    packages = project_packages(root) if packages is None else packages
    sources = {}
    for package in sorted(packages):
        for path in sorted((root / package).rglob("*.py")):
            name = _module_name(root, path)
            sources[name] = Source(name, path.relative_to(root),
                                   ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    for source in sources.values():
        _visit(source, source.tree, False, False, packages)
    return sources


def resolver(sources: dict[str, Source]):
    def resolve(dotted: str) -> str:
        """The module an imported name lives in (`gates.judge.evaluate` → gates.judge); a name outside the walk
        stays as named."""
        found = dotted
        while found and found not in sources:
            found = found.rpartition(".")[0]
        return found or dotted
    return resolve


def import_graph(sources: dict[str, Source]) -> dict[str, set[str]]:
    """Module → the project modules it imports, at any depth (function level included), `TYPE_CHECKING` left out."""
    resolve = resolver(sources)
    return {s.name: {t for i in s.imports if not i.type_only and (t := resolve(i.dotted)) != s.name}
            for s in sources.values()}


def forbidden_imports(sources: dict[str, Source], floors: dict[str, Floor]) -> list[str]:
    """Every import, at any depth, of a package the importing package's row does not name."""
    found = []
    for source in sources.values():
        floor = floors.get(source.package)
        allowed = {source.package, *(floor.may_import if floor else ())}
        for i in source.imports:
            target = i.dotted.split(".")[0]
            if target not in allowed:
                where = " inside a function" if i.in_function else ""
                found.append(f"{source.path}:{i.line} imports {i.dotted}{where}: "
                             f"{source.package} may not import {target} (docs/architecture.md, the floors)")
    return sorted(found)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each as the path that closes it (a → b → … → a)."""
    cycles, state, stack = [], {}, []

    def walk(name: str) -> None:
        state[name] = "open"
        stack.append(name)
        for target in sorted(t for t in graph[name] if t in graph):
            if state.get(target) == "open":
                cycles.append([*stack[stack.index(target):], target])
            elif target not in state:
                walk(target)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            walk(name)
    return cycles


def unexplained_function_imports(sources: dict[str, Source]) -> list[str]:
    found = []
    for source in sources.values():
        if not source.application:
            continue
        docstring = source.docstring
        for line, dotted in source.function_imports:
            named = any(dotted == n or dotted.startswith(n + ".") or n.startswith(dotted + ".")
                        for n in _dotted_names(docstring, {s.package for s in sources.values()}))
            if not (named and "import" in docstring):
                found.append(f"{source.path}:{line} imports {dotted} inside a function")
    return sorted(set(found))


def _dotted_names(text: str, packages: set[str]) -> set[str]:
    words = (w.strip("`'\"()[],.:;") for w in text.split())
    return {w for w in words if w.split(".")[0] in packages}


# ── The project ────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def floors() -> dict[str, Floor]:
    return read_floors(ARCHITECTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def project() -> dict[str, Source]:
    return read_sources(ROOT)


def installed_project_apps() -> set[str]:
    from django.conf import settings

    return {app.split(".")[0] for app in settings.INSTALLED_APPS} & project_packages(ROOT)


def test_the_map_in_the_document_covers_every_package_and_only_points_down(floors):
    apps = installed_project_apps()
    assert {"gates", "runners", "reports", "portal"} <= apps
    assert map_problems(floors, apps, project_packages(ROOT)) == []
    # the order of the floors: the decider, the doer, the reports, the portal, then the project
    assert [floors[p].number for p in ("gates", "runners", "reports", "portal", "fxpilot")] == sorted(
        floors[p].number for p in ("gates", "runners", "reports", "portal", "fxpilot"))


def test_every_import_at_any_depth_is_one_the_map_allows(project, floors):
    assert "runners.engine" in project and "gates.lifecycle" in project  # the walk found the code
    assert any(i.in_function for s in project.values() for i in s.imports)  # …and the imports inside functions
    assert forbidden_imports(project, floors) == []


def test_no_import_circle_anywhere(project):
    assert find_cycles(import_graph(project)) == []


def test_the_engine_chain_runs_one_way(project):
    graph = import_graph(project)
    assert "runners.tasks" not in graph["runners.engine"]
    assert "runners.engine" not in graph["runners.dispatch"]
    # the step kinds are imported by their app's ready() alone: the engine finds them in the registry
    assert {s for s, targets in graph.items() if "runners.steps" in targets} == {"runners.apps"}
    assert {s for s, targets in graph.items() if "reports.steps" in targets} == {"reports.apps"}


def test_the_views_of_one_subject_do_not_import_another_subjects(project):
    graph = import_graph(project)
    views = {name for name in project if name.startswith("portal.views.")}
    assert {"portal.views.pilots", "portal.views.runs"} <= views
    assert [(a, b) for a in sorted(views) for b in sorted(graph[a] & views)] == []


def test_no_except_import_error_in_application_code(project):
    found = [f"{s.path}:{line}" for s in project.values() if s.application for line in s.import_error_handlers]
    assert found == []


def test_imports_inside_functions_are_explained_by_their_module(project):
    assert unexplained_function_imports(project) == []


def _project_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_the_simulated_node_imports_nothing_of_the_django_project_and_processes_only_the_stdlib():
    shared = ("runners.sim.", "runners.simnode.", "runners.processes.")
    packages = project_packages(ROOT)
    outside = sorted(f"{path.relative_to(ROOT)}: {name}"
                     for folder in ("runners/sim", "runners/simnode") for path in (ROOT / folder).rglob("*.py")
                     for name in _project_imports(path)
                     if name.split(".")[0] in packages and not (name + ".").startswith(shared)
                     and name != "runners.processes")
    assert outside == []
    roots = {name.split(".")[0] for name in _project_imports(ROOT / "runners" / "processes.py")} - {"__future__"}
    assert roots and roots <= set(sys.stdlib_module_names), roots


# ── The checks themselves fail where they should ──────────────────────────────────────────────


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


DOC = """# Architecture

## The floors: who may import whom

| floor | package | what it holds | may import |
|---|---|---|---|
| 3 | `fxpilot` | the project | `infra` |
| 2 | `runners` | the doer | `gates`, `infra` |
| 1 | `gates` | the decider | nothing of the project |
| 0 | `infra` | the ground | nothing of the project |

## Something else

| 9 | `elsewhere` | not a floor | `gates` |
"""


def test_the_map_is_read_from_the_document_and_a_wrong_map_is_refused():
    floors = read_floors(DOC)
    assert floors == {"fxpilot": Floor(3, "fxpilot", frozenset({"infra"})),
                      "runners": Floor(2, "runners", frozenset({"gates", "infra"})),
                      "gates": Floor(1, "gates", frozenset()), "infra": Floor(0, "infra", frozenset())}
    packages = {"fxpilot", "runners", "gates", "infra"}
    assert map_problems(floors, {"runners", "gates"}, packages) == []
    upward = DOC.replace("| 1 | `gates` | the decider | nothing of the project |", "| 1 | `gates` | the decider | `runners` |")
    assert map_problems(read_floors(upward), {"runners", "gates"}, packages) == [
        "gates (floor 1) may import runners (floor 2): an arrow that does not point down",
        "gates must import nothing of the project"]
    on_top = DOC.replace("| 3 | `fxpilot` | the project | `infra` |", "| 3 | `fxpilot` | the project | `runners` |")
    assert map_problems(read_floors(on_top), {"runners", "gates"}, packages | {"portal"}) == [
        "portal is a package of the project but has no row in the floors table", "fxpilot must import no app"]
    with pytest.raises(AssertionError, match="neither packages nor"):
        read_floors(DOC.replace("| 0 | `infra` | the ground | nothing of the project |", "| 0 | `infra` | the ground | - |"))


def test_the_checks_find_an_upward_import_inside_a_function_and_a_circle_through_one(tmp_path):
    _write(tmp_path, {
        "gates/__init__.py": "",
        "gates/a.py": '"""A."""\ndef f():\n    from runners import b\n',
        "runners/__init__.py": "",
        "runners/b.py": '"""B."""\nfrom gates import a\n',
        "fxpilot/__init__.py": "",
        "fxpilot/c.py": '"""C."""\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runners.b import x\n',
        "infra/__init__.py": "",
    })
    sources = read_sources(tmp_path)
    assert forbidden_imports(sources, read_floors(DOC)) == [
        "fxpilot/c.py:4 imports runners.b.x: fxpilot may not import runners (docs/architecture.md, the floors)",
        "gates/a.py:3 imports runners.b inside a function: gates may not import runners (docs/architecture.md, the floors)"]
    assert find_cycles(import_graph(sources)) == [["gates.a", "runners.b", "gates.a"]]


def test_the_checks_find_a_circle_a_fallback_and_an_unexplained_import(tmp_path):
    _write(tmp_path, {
        "gates/__init__.py": "",
        "gates/a.py": '"""A."""\nfrom gates import b\n',
        "gates/b.py": '"""B."""\nfrom gates.a import thing\n',
        "gates/c.py": '"""C."""\ntry:\n    import gates.a\nexcept ImportError:\n    pass\n'
                      "def f():\n    from gates import b\n",
        "gates/d.py": '"""D: f imports gates.b late, on purpose, to keep its start fast."""\n'
                      "def f():\n    from gates import b\n",
        "gates/e.py": '"""E."""\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gates import f\n',
        "gates/f.py": '"""F."""\nfrom gates import e\n',
        "runners/__init__.py": "",
        "runners/remote/__init__.py": "",
        "runners/remote/x.py": "try:\n    import gates.a\nexcept ImportError:\n    pass\n"
                               "def f():\n    from gates import b\n",
    })
    sources = read_sources(tmp_path)
    assert "runners.remote.x" in sources and not sources["runners.remote.x"].application
    assert find_cycles(import_graph(sources)) == [["gates.a", "gates.b", "gates.a"]]
    assert [name for name, s in sources.items() if s.import_error_handlers and s.application] == ["gates.c"]
    assert [(s.name, s.function_imports) for s in sources.values() if s.function_imports and s.application] == [
        ("gates.c", [(7, "gates.b")]), ("gates.d", [(3, "gates.b")])]
    found = unexplained_function_imports(sources)
    assert len(found) == 1 and found[0].endswith("c.py:7 imports gates.b inside a function")
