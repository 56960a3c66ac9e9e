"""Dependencies flow one way (docs/architecture.md): core imports no other specmm package but the leaf
`specmm.jobs`, each modality package imports only `specmm.core`, `specmm.jobs` and itself, and nothing below the
CLI imports it.
Checked on the source of every module under `specmm/` with `ast`, function-level imports and
`importlib.import_module("...")` literals included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "specmm"
MODALITIES = ("vlm", "image_ar", "ssm", "diffusion_lm", "reasoning")
ABOVE_LIBRARY = ("zoo", "bench", "cli", "demo")  # reference models, benchmarks, the command, the demo

# (importing module prefix, imported module prefix) -> why it is allowed. Empty today: no modality imports another.
ALLOWED_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every specmm import in the file, wherever it sits."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from specmm import zoo` imports the package specmm.zoo; `from specmm.core import X` imports specmm.core
            found += [(node.lineno, f"{base}.{alias.name}" if base == "specmm" else base) for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, str(node.args[0].value)))
    return [(line, module) for line, module in found if module == "specmm" or module.startswith("specmm.")]


def _layer(module: str) -> str:
    """`specmm.vlm.targets` -> `vlm`; `specmm` -> `specmm` (the top-level package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "specmm"


EDGES = [(_module_name(path), line, imported) for path in sorted(ROOT.rglob("*.py"))
         for line, imported in _imports(path)]


def _violations(importer_layer: str, allowed) -> list[str]:
    bad = []
    for module, line, imported in EDGES:
        if _layer(module) != importer_layer or allowed(_layer(imported)):
            continue
        if any(module.startswith(a) and imported.startswith(b) for a, b in ALLOWED_EXCEPTIONS):
            continue
        bad.append(f"{module}:{line} imports {imported}")
    return bad


def test_the_scan_sees_every_package_and_function_level_imports():
    layers = {_layer(module) for module, _, _ in EDGES}
    assert {"core", *MODALITIES, "zoo", "bench", "cli"} <= layers
    # cli/vlm.py imports specmm.zoo inside cmd_train_drafter only: a function-level import the scan must see
    assert ("specmm.cli.vlm", "specmm.zoo") in {(m, i) for m, _, i in EDGES}


def test_core_imports_no_other_specmm_package():
    assert _violations("core", lambda layer: layer in ("core", "jobs")) == []


def test_jobs_machinery_imports_no_other_specmm_package():
    """`specmm.jobs` (atomic writes, locks, manifests) sits below everything, so any layer may use it."""
    assert _violations("jobs", lambda layer: layer == "jobs") == []


@pytest.mark.parametrize("modality", MODALITIES)
def test_modality_imports_only_core_and_itself(modality):
    assert _violations(modality, lambda layer: layer in ("core", "jobs", modality)) == []


@pytest.mark.parametrize("modality", MODALITIES)
def test_modality_imports_no_zoo_bench_cli_or_demo(modality):
    assert _violations(modality, lambda layer: layer not in ABOVE_LIBRARY) == []


def test_zoo_and_bench_import_no_cli_module():
    assert _violations("zoo", lambda layer: layer not in ("bench", "cli", "demo")) == []
    assert _violations("bench", lambda layer: layer not in ("cli", "demo")) == []
    # nor a command module under another name (`specmm.image_ar.cli` once held `image_grid`)
    assert [(m, i) for m, _, i in EDGES if _layer(m) in ("zoo", "bench") and "cli" in i.split(".")] == []


def test_top_level_library_modules_sit_on_core():
    """`specmm.drafters` (public drafter names), `specmm.machine` and `specmm.modalities` import core at most."""
    for layer in ("drafters", "machine", "modalities"):
        assert _violations(layer, lambda imported: imported in ("core", "jobs")) == [], layer


def test_no_cli_module_is_left_inside_a_modality_package():
    stray = [p.relative_to(ROOT.parent) for m in MODALITIES for p in (ROOT / m).rglob("cli.py")]
    assert stray == []
