"""Guards on the shape of the code (issue 10): the public names resolve, the import graph has
no cycle, the floors never reach up, no project import hides inside a function, and no
encoding name leaks into the model floor or the training code.

Issue 20 extends the graph to `scripts/` and `benchmarks/` (plain folders of scripts that import
their siblings by bare name, `from hf_golden_cases import ...`, which the graph resolves to
`scripts.hf_golden_cases`): no cycle there either, the package never imports them, and torch /
transformers appear only in the files named in TORCH_ONLY (the `bench` extra's and the
throwaway golden venv's).

The checks read the source with `ast` (imports inside functions included) and take the root
of a source tree, so they can be pointed at another checkout:

    python tests/test_architecture.py /path/to/other/checkout      # prints what each finds
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("posenc_jax", "train", "configs")
SCRIPT_DIRS = ("scripts", "benchmarks")  # folders of scripts, each run with its folder on sys.path
PROJECT = PACKAGES + SCRIPT_DIRS
# The only files that may import torch or transformers (globs, relative to the root): never
# the package, its tests or CI.
TORCH_ONLY = {
    "benchmarks/torch_twin.py": "the PyTorch twin model (bench extra)",
    "benchmarks/vs_pytorch.py": "its torch worker process (bench extra; CI runs the JAX side)",
    "benchmarks/pretrained_forward.py": "its transformers worker process (bench extra; CI runs "
                                        "the JAX side's --smoke)",
    "benchmarks/forward_pieces.py": "the torch side of pretrained_forward.py --breakdown, run in "
                                    "its transformers worker (bench extra)",
    "benchmarks/attention_cpu.py": "its torch SDPA worker process (bench extra; CI runs ours "
                                   "--smoke)",
    "scripts/make_*golden*.py": "golden-file writers, run in a throwaway venv",
    "scripts/hf_golden_*.py": "golden-file writers' parts, run in a throwaway venv",
    "scripts/pretrained_golden_*.py": "golden-file writers' parts, run in a throwaway venv",
}
HEAVY = ("torch", "transformers")


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str   # importing module
    target: str   # imported project module
    line: int
    in_function: bool


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file of the project's packages and script
    folders under root."""
    out = {}
    for package in PROJECT:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(tree: ast.AST):
    """(node, inside a function?) for every import statement of a module, at any depth."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inner = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, inner)
    yield from walk(tree, False)


def _targets(node, name: str, is_package: bool, known) -> list[str]:
    """The project modules one import statement of module `name` loads, by the rules below.

    `import a.b.c` -> a.b.c. `from a.b import c` -> a.b.c when that is a module, else a.b
    (a name defined by a.b's own code, e.g. its __init__). So a package __init__ importing its
    children is an edge down, and a child importing names from its parent's __init__ is an
    edge up to the parent (a cycle, since the parent imports the child).
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if node.module else package
    out = []
    for alias in node.names:
        child = f"{base}.{alias.name}"
        out.append(child if child in known else base)
    return out


def import_edges(root: pathlib.Path) -> list[Edge]:
    """Every import of a project module by a project module (imports in functions included)."""
    known = modules(root)
    edges = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        folder = name.split(".")[0]
        for node, in_function in _imports(tree):
            for target in _targets(node, name, path.name == "__init__.py", known):
                if folder in SCRIPT_DIRS and f"{folder}.{target}" in known:
                    target = f"{folder}.{target}"  # a sibling script, imported by bare name
                if target.split(".")[0] in PROJECT and target != name:
                    edges.append(Edge(name, target, node.lineno, in_function))
    return edges


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components of more than one module."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete cycle through the first module of a strongly connected component."""
    start, members = component[0], set(component)
    paths, seen = [[start]], {start}
    while paths:  # breadth first: the shortest cycle back to start
        path = paths.pop(0)
        for child in sorted(graph[path[-1]] & members):
            if child == start:
                return path + [start]
            if child not in seen:
                seen.add(child)
                paths.append(path + [child])
    return component


def import_cycles(root: pathlib.Path) -> list[str]:
    """Each import cycle, as 'a -(line)-> b -(line)-> a' (a line marked 'in a function' when
    the import hides inside one)."""
    edges = import_edges(root)
    graph: dict[str, set[str]] = {name: set() for name in modules(root)}
    where: dict[tuple[str, str], Edge] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
        where.setdefault((edge.source, edge.target), edge)
    out = []
    for component in _strongly_connected(graph):
        cycle = _cycle_in(component, graph)
        text = cycle[0]
        for a, b in itertools.pairwise(cycle):
            edge = where[(a, b)]
            note = ", in a function" if edge.in_function else ""
            text += f" -(line {edge.line}{note})-> {b}"
        out.append(text)
    return out


def floor_violations(root: pathlib.Path) -> list[str]:
    """posenc_jax importing train, posenc_jax.encodings importing posenc_jax.model, a package
    importing a script or a benchmark, or anything but a torch-only file importing one."""
    out = []
    for edge in import_edges(root):
        top = edge.target.split(".")[0]
        if edge.source.split(".")[0] in PACKAGES and top in SCRIPT_DIRS:
            out.append(f"{edge.source}:{edge.line} imports {edge.target} (a script)")
        if _torch_only(_file_of(edge.target)) and not _torch_only(_file_of(edge.source)):
            out.append(f"{edge.source}:{edge.line} imports {edge.target} (torch-only)")
        if edge.source.startswith("posenc_jax") and top == "train":
            out.append(f"{edge.source}:{edge.line} imports {edge.target}")
        if (edge.source.startswith("posenc_jax.encodings")
                and edge.target.startswith("posenc_jax.model")):
            out.append(f"{edge.source}:{edge.line} imports {edge.target} (a floor up)")
    return out


def imports_in_functions(root: pathlib.Path,
                         folders=("posenc_jax", "train", "scripts")) -> list[str]:
    """Project imports inside a function body, in posenc_jax/, train/ and scripts/ (benchmarks/
    may: a benchmark sets XLA_FLAGS or sys.path before it imports JAX and the project)."""
    return [f"{e.source}:{e.line} imports {e.target} inside a function"
            for e in import_edges(root)
            if e.in_function and e.source.split(".")[0] in folders]


def _file_of(module: str) -> str:
    """'benchmarks.torch_twin' -> 'benchmarks/torch_twin.py' (packages' __init__ aside)."""
    return module.replace(".", "/") + ".py"


def _torch_only(relative: str) -> bool:
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in TORCH_ONLY)


def _heavy_import(node) -> str | None:
    """The torch / transformers module an import statement or an `importlib.import_module` /
    `__import__` call with a literal (or f-string) name loads, else None."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
    elif (isinstance(node, ast.Call) and node.args
          and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                         "__import__")):
        arg = node.args[0]
        if isinstance(arg, ast.JoinedStr) and arg.values:
            arg = arg.values[0]
        names = [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else []
    else:
        return None
    return next((n for n in names if n.split(".")[0] in HEAVY), None)


def heavy_imports(root: pathlib.Path, folders=PROJECT + ("tests",)) -> list[str]:
    """'file:line imports torch...' for each torch / transformers import (at any depth) in a
    file that TORCH_ONLY does not name."""
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if _torch_only(relative):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                name = _heavy_import(node)
                if name:
                    out.append(f"{relative}:{node.lineno} imports {name}")
    return out


def _named_defaults(tree: ast.AST) -> set[int]:
    """ids of the default values of a field or argument called `encoding` (a user-facing
    default choice, e.g. `encoding: str = "rope"`, is not a dispatch on a name)."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "encoding" and node.value is not None):
            out.add(id(node.value))
        if isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            for arg, default in zip(positional[len(positional) - len(node.defaults):],
                                    node.defaults):
                if arg.arg == "encoding":
                    out.add(id(default))
            for arg, default in zip(node.kwonlyargs, node.kw_defaults):
                if arg.arg == "encoding" and default is not None:
                    out.add(id(default))
    return out


def encoding_names_in(root: pathlib.Path, names, folders=("posenc_jax/model", "train")):
    """'file:line: 'name'' for each string literal equal to a registered encoding name in the
    model floor and the training code (docstrings never equal a bare name; the default value
    of an `encoding` field or argument is allowed)."""
    names, out = set(names), []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            allowed = _named_defaults(tree)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and node.value in names
                        and id(node) not in allowed):
                    out.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return out


_RESOLVE = """
import json, posenc_jax
bad = {}
for name in posenc_jax.__all__:
    try:
        getattr(posenc_jax, name)
    except Exception as err:
        bad[name] = f"{type(err).__name__}: {err}"
print(json.dumps(bad))
"""


def unresolved_public_names(root: pathlib.Path) -> dict[str, str]:
    """{name: error} for each name in posenc_jax.__all__ that a fresh process, after a bare
    `import posenc_jax` from `root`, cannot get."""
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _RESOLVE], cwd=root, env=env, text=True,
                          check=False, capture_output=True, timeout=300)
    if done.returncode:
        return {"import posenc_jax": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the tests ----------------------------------------------------------------------------


def test_every_public_name_resolves_after_a_bare_import():
    assert unresolved_public_names(ROOT) == {}


def test_no_import_cycle_among_the_projects_modules():
    assert len(modules(ROOT)) > 30 and len(import_edges(ROOT)) > 50  # the parser sees them
    pairs = {(e.source, e.target) for e in import_edges(ROOT)}
    # ... the scripts' and benchmarks' imports of their siblings by bare name included
    assert ("scripts.make_hf_golden", "scripts.hf_golden_cases") in pairs
    assert ("benchmarks.device_check", "benchmarks.device_sections") in pairs
    cycles = import_cycles(ROOT)
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    # The guard itself can fail: a child importing its parent's names inside a function.
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "posenc_jax" / "__init__.py").write_text("from posenc_jax.a import f\n")
    (tmp_path / "posenc_jax" / "a.py").write_text(
        "def f():\n    from posenc_jax import f as g\n    import train.b\n    return g\n")
    assert import_cycles(tmp_path) == [
        "posenc_jax -(line 1)-> posenc_jax.a -(line 2, in a function)-> posenc_jax"]
    assert floor_violations(tmp_path) == ["posenc_jax.a:3 imports train.b"]
    assert imports_in_functions(tmp_path) == [
        "posenc_jax.a:2 imports posenc_jax inside a function",
        "posenc_jax.a:3 imports train.b inside a function"]


def test_the_cycle_finder_sees_scripts_importing_each_other_by_bare_name(tmp_path):
    # The circle issue 20 found: make_hf_golden <-> hf_golden_cases, one side in a function.
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "maker.py").write_text("_X = 1\ndef main():\n    from cases import Y\n")
    (tmp_path / "scripts" / "cases.py").write_text("from maker import _X\nY = _X\n")
    assert import_cycles(tmp_path) == [
        "scripts.cases -(line 1)-> scripts.maker -(line 3, in a function)-> scripts.cases"]
    assert imports_in_functions(tmp_path) == [
        "scripts.maker:3 imports scripts.cases inside a function"]


def test_lower_floors_never_import_upper_ones():
    assert floor_violations(ROOT) == []


def test_the_floor_check_sees_a_package_importing_a_script_or_a_torch_only_file(tmp_path):
    for folder in ("posenc_jax", "benchmarks"):
        (tmp_path / folder).mkdir()
    (tmp_path / "posenc_jax" / "__init__.py").write_text("from benchmarks import rope\n")
    (tmp_path / "benchmarks" / "rope.py").write_text("import torch_twin\n")
    (tmp_path / "benchmarks" / "torch_twin.py").write_text("import torch\n")
    assert sorted(floor_violations(tmp_path)) == [
        "benchmarks.rope:1 imports benchmarks.torch_twin (torch-only)",
        "posenc_jax:1 imports benchmarks.rope (a script)"]


def test_torch_and_transformers_only_in_the_bench_and_golden_files():
    found = heavy_imports(ROOT)
    assert not found, ("torch / transformers outside TORCH_ONLY (the package, its tests and CI "
                       "never need them):\n  " + "\n  ".join(found))
    # the guard sees the golden writers' imports, plain and by importlib with an f-string
    assert heavy_imports(ROOT, folders=("scripts",)) == [] and any(
        _heavy_import(node) == "transformers.models." for node in ast.walk(ast.parse(
            (ROOT / "scripts" / "make_hf_golden.py").read_text())))


def test_the_torch_guard_sees_every_form_of_import(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import importlib\nimport torch.nn as nn\nfrom transformers import AutoModel\n"
        "def f(name):\n    return importlib.import_module(f'transformers.models.{name}')\n")
    assert heavy_imports(tmp_path) == [
        "tests/test_x.py:2 imports torch.nn", "tests/test_x.py:3 imports transformers",
        "tests/test_x.py:5 imports transformers.models."]


FLOORS = ["posenc_jax", "train", "scripts"]


@pytest.mark.parametrize("package", FLOORS)
def test_no_project_import_inside_a_function(package):
    found = [line for line in imports_in_functions(ROOT) if line.startswith(package)]
    assert not found, "project imports inside functions:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("folder", ["posenc_jax/model", "train"])
def test_no_encoding_name_in_the_model_floor_or_the_training_code(folder):
    import posenc_jax
    offenders = encoding_names_in(ROOT, posenc_jax.names(), folders=(folder,))
    assert not offenders, (f"encoding names in {folder}/ (an encoding should declare what the "
                           "code needs):\n  " + "\n  ".join(offenders))


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_the_name_check_sees_a_name_but_not_a_default(tmp_path, name):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "x.py").write_text(
        f'"""Docstring naming {name}."""\n'
        f'def f(encoding="{name}"):\n    return encoding == "{name}"\n')
    assert encoding_names_in(tmp_path, [name], folders=("train",)) == [
        f"train/x.py:3: {name!r}"]


def _report(root: pathlib.Path) -> None:
    print(f"checking {root}")
    print("(a) public names that do not resolve after a bare import:")
    for name, err in unresolved_public_names(root).items():
        print(f"    posenc_jax.{name}: {err}")
    print("(b) import cycles:")
    for cycle in import_cycles(root):
        print(f"    {cycle}")
    print("(c) floors reaching up:", *floor_violations(root), sep="\n    ")
    print("(d) project imports inside functions:", *imports_in_functions(root), sep="\n    ")
    print("(e) torch / transformers outside TORCH_ONLY:", *heavy_imports(root), sep="\n    ")


if __name__ == "__main__":
    _report(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT).resolve())
