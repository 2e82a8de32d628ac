"""Load the functions' `app.py` modules by path, as the Lambda runtime does (both are `app`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load(function: str) -> ModuleType:
    """`functions/<function>/app.py` as module `<function>_app`, imported once."""
    name = f"{function}_app"
    if name in sys.modules:
        return sys.modules[name]
    shared = str(ROOT / "shared")
    if shared not in sys.path:
        sys.path.insert(0, shared)
    spec = importlib.util.spec_from_file_location(name, ROOT / "functions" / function / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
