"""Regenerates `dplint/analysis/tensor_api.py` from the type stubs of the installed torch.

    python -m dplint.analysis.torch_stubs dplint/analysis/tensor_api.py

torch ships typed stubs for its whole Python API; this reads them with `ast` (torch itself is never
imported: only its files are located) and lists every `torch.*` function, `torch.nn.functional`
function and `Tensor` method whose every overload is annotated to return a `Tensor` (or a tuple or
list of tensors), and the `Tensor` attributes annotated `Tensor`. The linter reads the generated
table and never needs torch. `tests/test_precision.py` fails when the table is stale, where torch is
installed.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import textwrap
from typing import Dict, Iterable, List, Optional, Set, Tuple

TENSOR = "tensor"
SEQUENCE = "sequence"  # a tuple or list of tensors
UNANNOTATED = "unannotated"  # a Python definition without a return annotation

# torch's stubs, relative to the package folder.
VARIABLE_FUNCTIONS = "_C/_VariableFunctions.pyi"
TENSOR_BASE_STUB = "_C/__init__.pyi"
TENSOR_CLASS = "_tensor.py"
TORCH_FUNCTIONAL = "functional.py"
NN_FUNCTIONAL = "nn/functional.pyi"
NN_NATIVE = "_C/_nn.pyi"


def _return_kind(annotation: Optional[ast.expr]) -> Optional[str]:
    """TENSOR for `Tensor`, SEQUENCE for `tuple[Tensor, ...]`, `list[Tensor]`, `Sequence[Tensor]`, `tuple[Tensor, Tensor]`."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:  # a quoted forward reference: `-> "Tensor"`
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if _is_tensor(annotation):
        return TENSOR
    if isinstance(annotation, ast.Subscript) and _last_name(annotation.value) in ("tuple", "Tuple", "list", "List", "Sequence"):
        items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        items = [item for item in items if not (isinstance(item, ast.Constant) and item.value is Ellipsis)]
        if items and all(_is_tensor(item) for item in items):
            return SEQUENCE
    return None


def _is_tensor(node: ast.expr) -> bool:
    return _last_name(node) == "Tensor"


def _last_name(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _functions(body: Iterable[ast.stmt]) -> Dict[str, List[Optional[str]]]:
    """Each public function of a body with the kinds its overloads return (an unannotated one: None),
    also those defined under `if TYPE_CHECKING:` and its `else`."""
    found: Dict[str, List[Optional[str]]] = {}
    for node in body:
        if isinstance(node, ast.If):
            for name, kinds in _functions(node.body + node.orelse).items():
                found.setdefault(name, []).extend(kinds)
        elif isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and not _is_property(node):
            found.setdefault(node.name, []).append(_return_kind(node.returns) if node.returns is not None else UNANNOTATED)
    return found


def _is_property(node: ast.FunctionDef) -> bool:
    return any(_last_name(decorator) in ("property", "setter", "getter") for decorator in node.decorator_list)


def _agreed(functions: Dict[str, List[Optional[str]]]) -> Dict[str, Optional[str]]:
    """A name's kind when all its overloads agree; None otherwise (`Tensor.type()` returns a str or a Tensor)."""
    return {name: kinds[0] if len(set(kinds)) == 1 else None for name, kinds in functions.items()}


def _override(native: Dict[str, Optional[str]], python: Dict[str, List[Optional[str]]]) -> None:
    """Python definitions replace the native ones they wrap; an unannotated wrapper (`Tensor.split`,
    `torch.cdist`) forwards to the native function, so it keeps the native stub's kind."""
    for name, kinds in python.items():
        if all(kind == UNANNOTATED for kind in kinds):
            native.setdefault(name, None)
        else:
            native[name] = _agreed({name: kinds})[name]


def _class_body(tree: ast.Module, name: str) -> List[ast.stmt]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node.body
    raise LookupError(f"class {name} not found")


def _attributes(body: Iterable[ast.stmt]) -> Dict[str, Optional[str]]:
    """Annotated attributes and properties of a class body with their kinds."""
    found: Dict[str, Optional[str]] = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = _return_kind(node.annotation)
        elif isinstance(node, ast.FunctionDef) and any(_last_name(d) == "property" for d in node.decorator_list):
            found[node.name] = _return_kind(node.returns)
    return found


def _public_all(tree: ast.Module) -> Optional[Set[str]]:
    """The module's `__all__` (with `+=` additions), or None when it has none."""
    names: Optional[Set[str]] = None
    for node in tree.body:
        value = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value, names = node.value, set()
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__":
            value = node.value
        if value is not None and isinstance(value, (ast.List, ast.Tuple)) and names is not None:
            names.update(e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return names


def _reexports(tree: ast.Module, module: str) -> Dict[str, str]:
    """`from <module> import name as alias` at the top level: alias → name."""
    found: Dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = alias.name
    return found


def collect(torch_dir: str) -> Dict[str, Dict[str, str]]:
    """The tables, by name: each maps an API name to TENSOR or SEQUENCE."""

    def parse(relative: str) -> ast.Module:
        with open(os.path.join(torch_dir, relative), encoding="utf-8") as handle:
            return ast.parse(handle.read(), relative)

    torch_functions = _agreed(_functions(parse(VARIABLE_FUNCTIONS).body))
    functional = parse(TORCH_FUNCTIONAL)
    exported = _public_all(functional) or set()
    # `from torch.functional import *` runs after the native functions are bound: its names win.
    _override(torch_functions, {n: k for n, k in _functions(functional.body).items() if n in exported})

    methods = _agreed(_functions(_class_body(parse(TENSOR_BASE_STUB), "TensorBase")))
    attributes = _attributes(_class_body(parse(TENSOR_BASE_STUB), "TensorBase"))
    tensor_class = _class_body(parse(TENSOR_CLASS), "Tensor")
    # `Tensor` overrides some `TensorBase` methods in Python.
    _override(methods, _functions(tensor_class))
    attributes.update(_attributes(tensor_class))

    nn_functional = parse(NN_FUNCTIONAL)
    native = _agreed(_functions(parse(NN_NATIVE).body))
    functional_functions = _agreed(_functions(nn_functional.body))
    for alias, name in _reexports(nn_functional, "torch").items():
        functional_functions[alias] = torch_functions.get(name)
    for alias, name in _reexports(nn_functional, "torch._C._nn").items():
        functional_functions[alias] = native.get(name)
    public = _public_all(nn_functional)
    if public is not None:
        functional_functions = {n: k for n, k in functional_functions.items() if n in public}

    return {
        "TORCH_FUNCTIONS": _known(torch_functions),
        "FUNCTIONAL_FUNCTIONS": _known(functional_functions),
        "TENSOR_METHODS": _known(methods),
        "TENSOR_ATTRIBUTES": _known(attributes),
    }


def _known(kinds: Dict[str, Optional[str]]) -> Dict[str, str]:
    return {name: kind for name, kind in kinds.items() if kind in (TENSOR, SEQUENCE) and not name.startswith("_")}


def torch_folder() -> Tuple[str, str]:
    """The installed torch's folder and version, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed")
    folder = list(spec.submodule_search_locations)[0]
    with open(os.path.join(folder, "version.py"), encoding="utf-8") as handle:
        version_module = ast.parse(handle.read())
    version = next(
        node.value.value
        for node in version_module.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        and isinstance(node.value, ast.Constant)
    )
    return folder, str(version).split("+")[0]


_DESCRIPTIONS = {
    "TORCH_FUNCTIONS": "`torch.<name>(...)`",
    "FUNCTIONAL_FUNCTIONS": "`torch.nn.functional.<name>(...)`",
    "TENSOR_METHODS": "`tensor.<name>(...)`",
    "TENSOR_ATTRIBUTES": "`tensor.<name>`",
}


def _names(names: Iterable[str]) -> str:
    lines = textwrap.wrap(" ".join(sorted(names)), width=104, break_long_words=False, break_on_hyphens=False)
    return "\n    ".join(lines)


def tensor_api_module() -> str:
    """The text of `dplint/analysis/tensor_api.py` for the installed torch."""
    folder, version = torch_folder()
    tables = collect(folder)
    parts = [
        f'"""What torch {version}\'s type stubs say returns a tensor: generated, do not edit.\n\n'
        "Regenerate with `python -m dplint.analysis.torch_stubs dplint/analysis/tensor_api.py`.\n"
        '"""\n\n'
        f'TORCH_VERSION = "{version}"\n'
    ]
    for table, kinds in tables.items():
        for kind, suffix, what in ((TENSOR, "", "a tensor"), (SEQUENCE, "_SEQUENCE", "a tuple or list of tensors")):
            names = [name for name, found in kinds.items() if found == kind]
            if table == "TENSOR_ATTRIBUTES" and kind == SEQUENCE:
                continue
            parts.append(
                f"\n# {_DESCRIPTIONS[table]} is {what} (every overload).\n"
                f'{table}{suffix} = frozenset(\n    """{_names(names)}""".split()\n)\n'
            )
    return "".join(parts)


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], "w", encoding="utf-8") as handle:
        handle.write(tensor_api_module())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
