"""The project as an installed distribution (pyproject.toml, installed by scripts/make_venv.sh): its
packages import from any folder without a ``sys.path`` edit anywhere, its metadata names them,
and its pins are those of requirements.txt."""

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

import pytest

from helpers import ROOT

DISTRIBUTION = "attention-nmt"
PACKAGES = ["alignment", "common", "comparison", "data", "inference", "models", "training", "viewer"]
# A change of the module search path: insert/append/... on it, an assignment to it or to an item of
# it, or a site folder added at run time. Reading it (``sys.path[0]``) is fine.
PATH_EDIT = re.compile(
    r"\bsys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b|\[[^\]]*\]\s*=(?!=)|\+=|=(?!=))"
    r"|\bsite\.addsitedir\b"
)


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)


def python_files():
    """The repository's .py files that git tracks or would track (new ones too; ignored ones not)."""
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"not a git checkout ({done.stderr.strip()}): the tracked files are unknown")
    return [ROOT / name for name in done.stdout.split("\0") if name and (ROOT / name).is_file()]


# Starts the scripts of the tests as the interpreter does, so it sets the first entry of the
# module search path to the script's folder, as the interpreter would (and nothing else).
INTERPRETER = ROOT / "tests" / "preloaded.py"


def test_no_code_edits_the_module_search_path():
    """Scripts, tests and the packages import the installed project; nothing puts the repository
    on ``sys.path`` (pytest.ini neither: its ``pythonpath`` would do the same for the tests)."""
    files = python_files()
    assert ROOT / "scripts" / "compare.py" in files
    edits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        if path != INTERPRETER
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PATH_EDIT.search(line)
    ]
    assert edits == [], "import the installed packages instead of editing sys.path:\n" + "\n".join(edits)
    assert "pythonpath" not in (ROOT / "pytest.ini").read_text()


def test_the_path_edit_pattern_finds_edits_and_leaves_reads():
    path = "sys.path"  # spelt apart, so that the scan above passes this file
    edits = [f"{path}.insert(0, str(ROOT))", f"{path}.append(x)", f"{path}[:0] = [x]", f"{path} += [x]"]
    edits += [f"{path} = [x]", "site" + ".addsitedir(x)"]
    reads = [f"first = {path}[0]", f"if x in {path}:", f"{path}[0] == x", f"# no {path} edit"]
    assert all(PATH_EDIT.search(line) for line in edits)
    assert not any(PATH_EDIT.search(line) for line in reads)


def test_the_python_api_imports_from_a_folder_outside_the_repository(tmp_path):
    """This Python (the venv's under make) imports the packages of this checkout from elsewhere."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    code = "import inference.translator, training.trainer; print(inference.translator.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, (
        f"the project is not installed in {sys.executable}: run make (or pip install --no-deps -e .)\n"
        + done.stderr[-2000:]
    )
    assert done.stdout.strip() == str(ROOT / "inference" / "translator.py")


def test_the_installed_metadata_names_the_packages():
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{DISTRIBUTION} is not installed in {sys.executable}: run make (or pip install -e .)")
    assert dist.version == pyproject()["project"]["version"]
    owners = importlib.metadata.packages_distributions()
    assert {name for name in PACKAGES if DISTRIBUTION in owners.get(name, [])} == set(PACKAGES)


def test_the_packages_are_the_repository_packages_and_ruffs_first_party():
    """A new top-level package is listed in pyproject.toml (else it would not import once installed)."""
    config = pyproject()
    on_disk = sorted(path.parent.name for path in ROOT.glob("*/__init__.py"))
    assert sorted(config["tool"]["setuptools"]["packages"]) == on_disk == PACKAGES
    assert sorted(config["tool"]["ruff"]["lint"]["isort"]["known-first-party"]) == PACKAGES


def test_the_dependencies_are_the_pins_of_requirements_txt():
    """requirements.txt builds the venv (torch first); pyproject.toml repeats its pins for
    ``pip install .``, the development tools as the ``dev`` extra."""
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    project = pyproject()["project"]
    assert project["dependencies"] + project["optional-dependencies"]["dev"] == pins


def module_imports(files) -> dict:
    """``{module: the project's modules it imports}`` (imports inside functions too) of the
    packages' ``.py`` files ``{module name: source text}``."""
    graph = {name: set() for name in files}
    for name, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name] |= {full} if full in files else {node.module} & set(files)
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names} & set(files)
        graph[name].discard(name)
    return graph


def import_circles(graph: dict) -> list:
    """Every module that reaches itself through the imports of ``graph``, with the path back."""
    circles = []
    for start in sorted(graph):
        paths, seen = [[start]], set()
        while paths:
            path = paths.pop()
            for after in sorted(graph[path[-1]]):
                if after == start:
                    circles.append(" -> ".join(path + [start]))
                elif after not in seen:
                    seen.add(after)
                    paths.append(path + [after])
    return circles


def test_no_module_imports_a_module_that_imports_it_back():
    """No import circle in the packages, directly or around, imports inside functions counted."""
    files = {}
    for path in python_files():
        relative = path.relative_to(ROOT)
        if relative.parts[0] in PACKAGES:
            name = ".".join(relative.with_suffix("").parts)
            files[name.removesuffix(".__init__")] = path.read_text(encoding="utf-8")
    assert "inference.translator" in files and "data.corpus" in files
    assert import_circles(module_imports(files)) == []


def test_the_circle_finder_finds_a_circle_around_three_modules():
    files = {"a": "from b import x", "b": "def f():\n    from c import y", "c": "import a", "d": "import a"}
    assert import_circles(module_imports(files)) == [
        "a -> b -> c -> a",
        "b -> c -> a -> b",
        "c -> a -> b -> c",
    ]
