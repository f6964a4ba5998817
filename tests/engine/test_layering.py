"""DESIGN.md section 1: imports point down only, module-level or inside a function.

    server, llm -> engine -> spec -> models -> ops -> ref, gguf      (utilities: tokenizer, ...)

Every `import` / `from ... import` of every module under luce/ (found by walking the whole
syntax tree, so an import moved into a function counts), and every
importlib.import_module("luce....") with a literal name, must go to a layer its own layer
may use. The engine and the drafters never import a backend (they use the model's); ref and
gguf import nothing above them. luce.testing (tiny and synthetic models for tests and tools)
sits at the ops layer and no runtime layer imports it; luce.benchmark sits on top (a tool).
"""
from __future__ import annotations

import ast
from pathlib import Path

LUCE = Path(__file__).resolve().parents[2] / "luce"

LAYER_OF = {  # top-level name under luce -> layer
    "server": "frontend", "llm": "frontend", "engine": "engine", "spec": "spec", "models": "models",
    "ops": "ops", "ref": "ref", "gguf": "gguf", "tokenizer": "util", "detokenize": "util",
    "chat_template": "util", "fetch": "util", "model_paths": "util", "benchmark": "tools", "testing": "testing",
}
ALLOWED = {  # layer -> layers it may import
    "frontend": {"frontend", "engine", "spec", "models", "ops", "ref", "gguf", "util"},
    "engine": {"engine", "spec", "models", "ref", "gguf", "util"},
    "spec": {"spec", "models", "ref", "gguf"},
    "models": {"models", "ops", "ref", "gguf"},
    "ops": {"ops", "ref", "gguf", "native"},
    "testing": {"testing", "ops", "ref", "gguf", "native", "util"},
    "ref": {"ref", "gguf"},
    "gguf": {"gguf"},
    "util": {"util", "gguf"},
}


def layer(module: str) -> str | None:
    """Layer of a luce module name; None for the package root (lazy, imports nothing)."""
    parts = module.split(".")
    if parts[0] != "luce" or len(parts) == 1:
        return None
    return "native" if parts[1].startswith("_c") else LAYER_OF.get(parts[1], "tools")


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, luce module name) of every import in `source` (the module `module`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names] + [(node.lineno, name)]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            out.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in out if name and name.split(".")[0] == "luce"]


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    src = layer(module)
    if src in (None, "tools", "native"):
        return []
    bad = []
    for line, name in imported_modules(source, module, is_package):
        dst = layer(name)
        if dst is not None and dst not in ALLOWED[src]:
            bad.append(f"{module}:{line} ({src}) imports {name} ({dst})")
    return bad


def test_every_import_points_down():
    found = []
    for path in sorted(LUCE.rglob("*.py")):
        rel = path.relative_to(LUCE.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        found += violations(path.read_text(), module, is_package)
    assert not found, "\n".join(found)


def test_the_check_sees_imports_inside_functions_and_relative_ones():
    """The checker itself: a backend imported inside an engine function, a relative import
    climbing from ref into the models, an import_module of the engine from ops."""
    engine_src = "def f():\n    from luce.ops.cuda_backend import CudaBackend\n    return CudaBackend\n"
    assert violations(engine_src, "luce.engine.engine") == [
        "luce.engine.engine:2 (engine) imports luce.ops.cuda_backend.CudaBackend (ops)",
        "luce.engine.engine:2 (engine) imports luce.ops.cuda_backend (ops)"]
    assert violations("from ..models import batch\n", "luce.ref.tree")[0].startswith("luce.ref.tree:1 (ref)")
    assert violations("import importlib\nimportlib.import_module('luce.engine.step')\n", "luce.ops.api")
    assert violations("from luce.ref.tree import check_parents\n", "luce.engine.step") == []
    assert violations("def f():\n    import luce.models.loader\n", "luce.testing.tiny_models")   # testing: ops and below
    assert violations("from luce.testing.tiny_models import make_qwen35\n", "luce.models.loader")  # no runtime layer
