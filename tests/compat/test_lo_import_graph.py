"""The compat package's import graph has no circles.

Every `metafam.compat.learned_optimization` module's imports of other compat modules -- ``import`` / ``from ...
import`` statements anywhere in the module (deferred imports inside functions too) and
``importlib.import_module("...")`` calls with a literal name -- are read with `ast`, and the graph must have no
strongly connected component of more than one module. (Issue 41 broke the two there were: `tasks.base` <->
`tasks.fixed.all`, and `tasks.datasets.base` <-> `tasks.datasets.language`.)
"""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "metafam",
                    "compat", "learned_optimization")
PKG = "metafam.compat.learned_optimization"


def _modules():
  mods = {}
  for dirpath, _, filenames in os.walk(ROOT):
    for filename in filenames:
      if filename.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, filename), ROOT)[:-3].replace(os.sep, ".")
        name = PKG if rel == "__init__" else f"{PKG}.{rel[:-len('.__init__')] if rel.endswith('.__init__') else rel}"
        mods[name] = os.path.join(dirpath, filename)
  return mods


def import_graph():
  """``{module: set of compat modules it imports}``."""
  mods = _modules()
  graph = {}
  for name, path in mods.items():
    deps = set()
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PKG):
        for alias in node.names:
          sub = f"{node.module}.{alias.name}"
          deps.add(sub if sub in mods else node.module)
      elif isinstance(node, ast.Import):
        deps.update(a.name for a in node.names if a.name.startswith(PKG))
      elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args
            and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith(PKG)):
        deps.add(node.args[0].value)
    graph[name] = {d for d in deps if d in mods and d != name}
  return graph


def cycles(graph):
  """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
  for root in graph:
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter[0]
    counter[0] += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = counter[0]
          counter[0] += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph[child]))))
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
          found.append(sorted(component))
  return found


def test_cycle_finder_finds_a_planted_circle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_compat_modules_import_each_other_without_circles():
  graph = import_graph()
  assert f"{PKG}.tasks.base" in graph and f"{PKG}.tasks.datasets.language" in graph
  assert cycles(graph) == []
