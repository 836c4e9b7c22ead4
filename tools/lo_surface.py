"""The import surface of google/learned_optimization ("LO"), read with `ast`, and the compat layer's coverage.

    python tools/lo_surface.py --reference_src /tmp/lo_src [--commit 32186aa]   # writes the data file
    python tools/lo_surface.py --report [--modules PREFIX]                        # coverage per module

The first form reads every non-test module of an LO checkout (a directory holding `learned_optimization/`), and the
test modules in `IMPORTED_TEST_MODULES` (research code imports their classes), without importing them and writes
`tests/compat/data/lo_public_names.json`: for each module every module-level name -- functions, classes and
assignments, public and private (``_name``; dunder names such as ``__all__`` are not names of the API), and names
re-exported from other LO modules (``from x import *`` re-exports x's public names only) -- with ``"private":
true`` on the private ones and, for functions and
classes, their signatures (parameter names, kinds and whether a default exists; for a class, its ``__init__`` or
its dataclass / NamedTuple fields; ``null`` when the class inherits its constructor). Only these facts are kept,
no LO code. The LO commit is recorded (from `git`, or `--commit` when the checkout has no history). The folders
in `SKIPPED_DIRS` are left out, as the issue scopes them out.

`--report` imports each listed module under `metafam.compat.learned_optimization` and prints, per module, the
names that resolve with a compatible signature (`signature_problems`) over the total, public and private apart;
`--missing` also lists the names that do not; `tests/compat/test_lo_surface.py` asserts the same with its
exclusions (each with its reason).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional

PREFIX = "learned_optimization"
NEW_PREFIX = "metafam.compat.learned_optimization"
DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "compat", "data",
                         "lo_public_names.json")
# Folders of LO the issue leaves out of the compat surface.
SKIPPED_DIRS = ("launchers", "population", "continuous_eval", "examples")
# Test modules of LO whose names research code imports (e.g. to subclass `vit_test.VITTest`).
IMPORTED_TEST_MODULES = ("tasks.fixed.vit_test",)

_KINDS = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD")
_DATACLASS_DECORATORS = ("dataclass", "struct.dataclass", "flax.struct.dataclass", "dataclasses.dataclass")


# ------------------------------------------------------------------------------------------------ reading LO's source

def _function_signature(node: ast.AST, drop_first: bool = False) -> List[Dict[str, Any]]:
  """``[{"name", "kind", "default"}]`` of a `def`, in order (``drop_first``: a method's ``self`` / ``cls``)."""
  args = node.args
  positional = list(args.posonlyargs) + list(args.args)
  n_defaults = len(args.defaults)
  params = []
  for i, arg in enumerate(positional):
    kind = "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
    params.append({"name": arg.arg, "kind": kind, "default": i >= len(positional) - n_defaults})
  if drop_first and params:
    params = params[1:]
  if args.vararg is not None:
    params.append({"name": args.vararg.arg, "kind": "VAR_POSITIONAL", "default": False})
  for arg, default in zip(args.kwonlyargs, args.kw_defaults):
    params.append({"name": arg.arg, "kind": "KEYWORD_ONLY", "default": default is not None})
  if args.kwarg is not None:
    params.append({"name": args.kwarg.arg, "kind": "VAR_KEYWORD", "default": False})
  return params


def _dotted(node: ast.AST) -> str:
  if isinstance(node, ast.Call):
    return _dotted(node.func)
  if isinstance(node, ast.Attribute):
    return _dotted(node.value) + "." + node.attr
  if isinstance(node, ast.Name):
    return node.id
  return ""


def _field_has_default(value: Optional[ast.expr]) -> bool:
  """Whether a dataclass field's right-hand side gives it a default: ``x: int = 3`` does; ``x: int =
  field(pytree_node=False)`` (dataclasses' or flax's ``field``) only with a ``default`` or ``default_factory``."""
  if value is None:
    return False
  if isinstance(value, ast.Call) and _dotted(value.func).split(".")[-1] == "field":
    return any(k.arg in ("default", "default_factory") for k in value.keywords)
  return True


def _class_signature(node: ast.ClassDef) -> Optional[List[Dict[str, Any]]]:
  """The constructor's parameters: ``__init__`` if the class defines one, else its fields when it is a dataclass
  or a NamedTuple, else None (inherited; not checked)."""
  for item in node.body:
    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__":
      return _function_signature(item, drop_first=True)
  is_fields = (any(_dotted(d) in _DATACLASS_DECORATORS for d in node.decorator_list)
               or any(_dotted(b).endswith("NamedTuple") for b in node.bases))
  if not is_fields:
    return None
  return [{"name": item.target.id, "kind": "POSITIONAL_OR_KEYWORD", "default": _field_has_default(item.value)}
          for item in node.body
          if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
          and "ClassVar" not in ast.dump(item.annotation)]


def _assigned_names(targets) -> List[str]:
  """The module-level names an assignment binds (names, possibly inside tuples / lists / starred targets)."""
  out: List[str] = []
  for target in targets:
    if isinstance(target, ast.Name):
      out.append(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
      out.extend(_assigned_names(target.elts))
    elif isinstance(target, ast.Starred):
      out.extend(_assigned_names([target.value]))
  return out


def _public(name: str) -> bool:
  return not name.startswith("_")


def _api_name(name: str) -> bool:
  """A module-level name of the API: any but dunder names (``__all__``, ``__version__``...)."""
  return not (name.startswith("__") and name.endswith("__"))


def _entry(kind: str, name: str, **fields: Any) -> Dict[str, Any]:
  entry = {"type": kind, "signature": None, **fields}
  if not _public(name):
    entry["private"] = True
  return entry


def _top_level(body: List[ast.stmt]):
  """Module-level statements, descending into `if` / `try` blocks (conditional definitions)."""
  for node in body:
    if isinstance(node, ast.If):
      yield from _top_level(node.body)
      yield from _top_level(node.orelse)
    elif isinstance(node, ast.Try):
      for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
        yield from _top_level(block)
    else:
      yield node


def _is_lo_module(root: str, dotted: str) -> bool:
  path = os.path.join(root, *dotted.split("."))
  return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


def module_surface(root: str, module: str, source: str) -> Dict[str, Any]:
  """``{name: {"type": "function"|"class"|"value"|"reexport", "signature": ..., ["private": True]}}`` of one
  module's names (`_api_name`)."""
  names: Dict[str, Any] = {}
  for node in _top_level(ast.parse(source).body):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _api_name(node.name):
      names[node.name] = _entry("function", node.name, signature=_function_signature(node))
    elif isinstance(node, ast.ClassDef) and _api_name(node.name):
      names[node.name] = _entry("class", node.name, signature=_class_signature(node))
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for leaf in _assigned_names(targets):  # `x = ...`, `x, y = ...`; not `other.attr = ...` or `d[k] = ...`
        if _api_name(leaf) and leaf not in names:
          names[leaf] = _entry("value", leaf)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
        node.module == PREFIX or node.module.startswith(PREFIX + ".")):
      for alias in node.names:
        name = alias.asname or alias.name
        if name == "*":  # expanded by `read_surface` once the source module's names are known
          names.setdefault("*", {"type": "star", "from": []})["from"].append(node.module)
          continue
        if _api_name(name) and not _is_lo_module(root, f"{node.module}.{alias.name}") and name not in names:
          names[name] = _entry("reexport", name, **{"from": f"{node.module}.{alias.name}"})
  return names


def read_surface(reference_src: str) -> Dict[str, Dict[str, Any]]:
  """``{module (dotted, relative to the package): names}`` for every non-test module outside `SKIPPED_DIRS` and the
  modules of `IMPORTED_TEST_MODULES`."""
  package = os.path.join(reference_src, PREFIX)
  if not os.path.isfile(os.path.join(package, "__init__.py")):
    raise SystemExit(f"--reference_src: {reference_src!r} holds no {PREFIX}/__init__.py (pass an LO checkout).")
  modules = {}
  for dirpath, dirnames, filenames in os.walk(package):
    rel_dir = os.path.relpath(dirpath, package)
    dirnames[:] = sorted(d for d in dirnames if not (rel_dir == "." and d in SKIPPED_DIRS))
    for filename in sorted(filenames):
      parts = [] if rel_dir == "." else rel_dir.split(os.sep)
      is_test = filename.endswith("_test.py") or filename.startswith("test_")
      if not filename.endswith(".py") or (is_test and ".".join(parts + [filename[:-3]]) not in IMPORTED_TEST_MODULES):
        continue
      if filename != "__init__.py":
        parts.append(filename[:-3])
      if not parts:
        continue  # the package's own __init__ (licence header only)
      with open(os.path.join(dirpath, filename), encoding="utf-8") as f:
        modules[".".join(parts)] = module_surface(reference_src, ".".join(parts), f.read())
  for names in modules.values():  # `from learned_optimization.x import *`: x's public names, re-exported
    for source in names.pop("*", {"from": []})["from"]:
      for name in modules.get(source[len(PREFIX) + 1:], {}):
        if _public(name):
          names.setdefault(name, _entry("reexport", name, **{"from": f"{source}.{name}"}))
  return dict(sorted(modules.items()))


def _commit_of(reference_src: str, given: Optional[str]) -> str:
  if given:
    return given
  try:
    return subprocess.run(["git", "-C", reference_src, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    raise SystemExit("--commit: the checkout has no git history; pass the LO commit it was taken from.") from None


def write_atomic(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- checking the compat

def load_data(path: str = DATA_FILE) -> Dict[str, Any]:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def signature_problems(reference: Optional[List[Dict[str, Any]]], obj: Any) -> List[str]:
  """Why ``obj``'s signature cannot take every call LO's ``reference`` parameters allow ([] when it can).

  Every LO parameter must exist in ``obj`` under the same name and kind, at the same position when it can be
  passed positionally, with a default where LO has one; LO's ``*args`` / ``**kwargs`` need ``obj``'s; a parameter
  ``obj`` adds must be defaulted (or variadic).
  """
  if reference is None:
    return []
  try:
    params = list(inspect.signature(obj).parameters.values())
  except (TypeError, ValueError) as e:
    return [f"no signature ({e})"]
  by_name = {p.name: p for p in params}
  kinds = {p.kind.name for p in params}
  positional = [p.name for p in params if p.kind.name in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
  problems = []
  lo_positional = [p["name"] for p in reference if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
  for p in reference:
    if p["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):
      if p["kind"] not in kinds:
        problems.append(f"no {'*args' if p['kind'] == 'VAR_POSITIONAL' else '**kwargs'}")
      continue
    mine = by_name.get(p["name"])
    if mine is None:
      problems.append(f"missing parameter {p['name']!r}")
      continue
    if p["kind"] == "POSITIONAL_OR_KEYWORD" and mine.kind.name != "POSITIONAL_OR_KEYWORD":
      problems.append(f"{p['name']!r} is {mine.kind.name}, LO's is {p['kind']}")
    elif p["kind"] == "KEYWORD_ONLY" and mine.kind.name not in ("KEYWORD_ONLY", "POSITIONAL_OR_KEYWORD"):
      problems.append(f"{p['name']!r} is {mine.kind.name}, LO's is {p['kind']}")
    if (p["name"] in lo_positional and p["name"] in positional
        and positional.index(p["name"]) != lo_positional.index(p["name"])):
      problems.append(f"{p['name']!r} at position {positional.index(p['name'])}, LO's at "
                      f"{lo_positional.index(p['name'])}")
    if p["default"] and mine.default is inspect.Parameter.empty:
      problems.append(f"{p['name']!r} has no default (LO's has)")
  lo_names = {p["name"] for p in reference}
  for mine in params:
    if (mine.name not in lo_names and mine.default is inspect.Parameter.empty
        and mine.kind.name not in ("VAR_POSITIONAL", "VAR_KEYWORD")):
      problems.append(f"extra required parameter {mine.name!r}")
  return problems


def check_module(module: str, names: Dict[str, Any]) -> Dict[str, List[str]]:
  """``{name: problems}`` for one LO module under the compat prefix (``{"": [error]}`` if it does not import)."""
  try:
    mod = importlib.import_module(f"{NEW_PREFIX}.{module}")
  except Exception as e:  # pylint: disable=broad-except  # any import failure is a finding
    return {"": [f"import failed: {type(e).__name__}: {e}"]}
  result = {}
  for name, info in names.items():
    if not hasattr(mod, name):
      result[name] = ["missing"]
      continue
    obj = getattr(mod, name)
    result[name] = signature_problems(info["signature"], obj) if info["type"] in ("function", "class") else []
  return result


def report(data: Dict[str, Any], prefix: str = "", missing: bool = False) -> int:
  """Prints covered / total names per module, public and private apart (``missing``: also the names not covered,
  each with its problems)."""
  totals = {"public": [0, 0], "private": [0, 0]}
  print(f"LO commit {data['commit']}; a name is covered when it resolves with a compatible signature.")
  print(f"{'module':58s} public covered/total   private covered/total")
  for module, names in data["modules"].items():
    if not module.startswith(prefix):
      continue
    result = check_module(module, names)
    row = {}
    for kind in totals:
      mine = [n for n in names if bool(names[n].get("private")) == (kind == "private")]
      covered = 0 if "" in result else sum(not result[n] for n in mine)
      row[kind] = (covered, len(mine))
      totals[kind][0] += covered
      totals[kind][1] += len(mine)
    print(f"{module:58s} {row['public'][0]:6d} / {row['public'][1]:4d}   {row['private'][0]:6d} / "
          f"{row['private'][1]:4d}{'  (import fails)' if '' in result else ''}")
    if missing:
      for name, problems in result.items():
        if problems:
          print(f"    {name or '<module>'}: {'; '.join(problems)}")
  print(f"{'total':58s} {totals['public'][0]:6d} / {totals['public'][1]:4d}   {totals['private'][0]:6d} / "
        f"{totals['private'][1]:4d}")
  return 0


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--reference_src", help="an LO checkout (holds learned_optimization/); writes the data file")
  parser.add_argument("--commit", help="the LO commit of the checkout, when it has no git history")
  parser.add_argument("--out", default=DATA_FILE, help="the data file (default: %(default)s)")
  parser.add_argument("--report", action="store_true", help="print the compat coverage per module")
  parser.add_argument("--modules", default="", help="with --report: only modules starting with this prefix")
  parser.add_argument("--missing", action="store_true", help="with --report: list the names not covered")
  args = parser.parse_args(argv)
  if not args.reference_src and not args.report:
    parser.error("pass --reference_src (write the data file) and/or --report")
  if args.reference_src:
    data = {"source": "google/learned_optimization", "commit": _commit_of(args.reference_src, args.commit),
            "skipped_dirs": list(SKIPPED_DIRS), "modules": read_surface(args.reference_src)}
    write_atomic(args.out, json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"wrote {args.out}: {len(data['modules'])} modules, "
          f"{sum(len(v) for v in data['modules'].values())} names")
  if args.report:
    return report(load_data(args.out), args.modules, args.missing)
  return 0


if __name__ == "__main__":
  # Check this checkout's metafam (not another installed copy): the repository root goes first on the path.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main())
