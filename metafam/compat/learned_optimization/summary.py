"""`learned_optimization.summary`: named values pulled out of jitted, vmapped and scanned JAX code, and writers.

``summary(name, val, aggregation)`` inside a function marks ``val`` (it returns ``val``);
``with_summary_output_reduced(fn)(*args)`` returns ``(fn's output, metrics)`` with one entry per name, keyed
``"<aggregation>||<scope>/<name>"`` as in the reference, reduced over every occurrence of that name -- repeated
calls, the lanes of a `jax.vmap` and the steps of a `jax.lax.scan` inside ``fn``:

* ``mean``: the mean of all elements; ``collect``: all elements, flattened; ``sample``: one element drawn with the
  ``sample_rng_key=`` keyword of the wrapped call; ``tensor``: the value (stacked over scan steps); ``none``: a value
  of size 1 recorded once (ValueError otherwise).

How it works (no oryx): ``summary`` binds an identity primitive carrying the name and aggregation. It is bound only
while a ``with_summary_output_reduced`` call is tracing, so a program traced without one holds nothing extra; when
one is, the wrapper traces ``fn`` to a jaxpr and evaluates it, returning the marked values as extra outputs. Nested
``jit`` calls are inlined and ``scan`` bodies re-scanned with the marked values as extra per-step outputs, so
everything stays on the device (no host callback). Importing this module registers the primitive's evaluation,
lowering (the identity), batching and differentiation rules with JAX, as defining a pytree class registers it.

Values marked inside ``lax.cond`` / ``lax.switch`` branches and ``lax.while_loop`` bodies are collected as running
partial results (`_Partial`: the sum and the number of the marked elements, and the last marked value): ``mean``
counts only the branch that ran and every iteration that ran (NaN if none marked the name); the other aggregations
see the last value the taken branch marked (zeros if it marked none) or the last iteration's value. Under
``jax.vmap`` with a per-lane predicate JAX runs both branches, so both branches' values are collected. Not
collected: values marked in a ``while_loop``'s condition or inside custom-derivative functions. A function jitted on
its own keeps the trace of its first call: call it first inside the wrapper, or do not jit it separately.

``add_with_summary(fn)`` adds the keyword ``with_summary`` (False: ``(out, {})``, nothing collected).
``aggregate_metric_list`` / ``aggregate_metric`` merge such dicts on the host (or with ``use_jnp=True`` in JAX).
Writers: `InMemorySummaryWriter`, `PrintWriter`, `MultiWriter` and `TensorboardWriter` (= `JaxboardWriter`), which
without TensorFlow appends one JSON record per value to ``<log_dir>/summaries.jsonl`` (all-or-nothing lines).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import enum
import functools
import inspect
import json
import os
import types
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, NamedTuple, Sequence, Tuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as onp
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from metafam import io as mf_io
from metafam.compat.learned_optimization import profile

__all__ = ["ORYX_LOGGING", "F", "G", "PRNGKey", "current_summary_prefix", "summary_scope", "summary_decorator",
           "count_per_tags", "reset_summary_counter", "AggregationType", "summary", "sample_value",
           "aggregate_metric_list", "aggregate_metric", "with_summary_output_reduced", "add_with_summary",
           "tree_scalar_mean", "tree_step", "summarize_inner_params", "SummaryWriterBase", "InMemorySummaryWriter",
           "PrintWriter", "MultiWriter", "TensorboardWriter", "JaxboardWriter"]

F = TypeVar("F", bound=Callable)
G = TypeVar("G", bound=Callable)
PRNGKey = jax.Array

# LO's flag "summaries are recorded" (there: oryx is installed). metafam's collector always is.
ORYX_LOGGING = True
# LO's per-name counters, which made repeated names unique; metafam merges repeats in the trace, so none is kept.
count_per_tags: Mapping[str, int] = types.MappingProxyType({})

_scope: contextvars.ContextVar = contextvars.ContextVar("lo_summary_scope", default=())
_collecting: contextvars.ContextVar = contextvars.ContextVar("lo_summary_collecting", default=0)


class AggregationType(str, enum.Enum):
  """How the occurrences of one summary name are reduced to one value."""
  mean = "mean"  # pylint: disable=invalid-name
  sample = "sample"  # pylint: disable=invalid-name
  collect = "collect"  # pylint: disable=invalid-name
  none = "none"  # pylint: disable=invalid-name
  tensor = "tensor"  # pylint: disable=invalid-name


_AGGREGATIONS = tuple(a.value for a in AggregationType)

# ------------------------------------------------------------------------------------------- the marking primitive
_summary_p = jex_core.Primitive("lo_compat_summary")
_summary_p.def_impl(lambda x, *, name, aggregation: x)
_summary_p.def_abstract_eval(lambda x, *, name, aggregation: x)
mlir.register_lowering(_summary_p, lambda ctx, x, *, name, aggregation: [x])
batching.primitive_batchers[_summary_p] = lambda args, dims, **params: (_summary_p.bind(args[0], **params), dims[0])
ad.primitive_jvps[_summary_p] = lambda primals, tangents, **params: (_summary_p.bind(primals[0], **params),
                                                                     tangents[0])


def current_summary_prefix() -> str:
  """The "/"-joined names of the enclosing `summary_scope`s."""
  return "/".join(_scope.get())


@contextlib.contextmanager
def summary_scope(val: str):
  """Prefixes the names of the summaries made inside the block with ``val`` (nothing for an empty ``val``)."""
  token = _scope.set(_scope.get() + ((val,) if val else ()))
  try:
    yield
  finally:
    _scope.reset(token)


def summary_decorator(name: str) -> Callable[[F], F]:
  """A decorator running the function inside ``summary_scope(name)``."""
  def decorate(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      with summary_scope(name):
        return fn(*args, **kwargs)
    return wrapped
  return decorate


def reset_summary_counter() -> None:
  """Kept for LO's name: repeated names are merged per trace, so there is no counter to reset."""


def summary(name: str, val: Any, aggregation: Any = AggregationType.mean) -> Any:
  """Marks ``val`` as the summary ``name``; returns ``val``. Outside a collecting trace it does nothing."""
  if not isinstance(name, str):
    raise ValueError(f"summary: name must be a str (the first argument), got {type(name).__name__}.")
  aggregation = AggregationType(aggregation).value if aggregation in _AGGREGATIONS else aggregation
  if aggregation not in _AGGREGATIONS:
    raise ValueError(f"summary: aggregation must be one of {_AGGREGATIONS}, got {aggregation!r}.")
  if "||" in name:
    raise ValueError(f"summary: name must not contain '||', got {name!r}.")
  if not _collecting.get():
    return val
  full_name = "/".join(_scope.get() + (name,))
  return _summary_p.bind(jnp.asarray(val), name=full_name, aggregation=aggregation)


# ---------------------------------------------------------------------------------------- collecting from a jaxpr

class _Partial(NamedTuple):
  """The marked values of one name inside a ``cond`` / ``while_loop``: the sum and the number of their elements and
  the last value (zeros when the path taken marked none; None when the branches mark different shapes)."""
  total: Any
  count: Any
  last: Any


def _as_partials(found: Sequence[Tuple[str, Any]], shapes: Mapping[str, Any]) -> Dict[str, _Partial]:
  """``found`` summarized per key of ``shapes`` (``{key: ShapeDtypeStruct or None}``), zeros for keys not found."""
  out = {}
  for key, shape in shapes.items():
    values = [v for k, v in found if k == key]
    parts = [v if isinstance(v, _Partial) else _Partial(jnp.sum(v), v.size, v) for v in values]
    total = sum((jnp.sum(jnp.asarray(p.total, jnp.float32)) for p in parts), jnp.zeros((), jnp.float32))
    count = sum((jnp.sum(jnp.asarray(p.count, jnp.float32)) for p in parts), jnp.zeros((), jnp.float32))
    last = None if shape is None else (jnp.asarray(parts[-1].last, shape.dtype) if parts
                                        else jnp.zeros(shape.shape, shape.dtype))
    out[key] = _Partial(total, count, last)
  return out


def _marked_shapes(fn: Callable, *args: Any) -> Dict[str, Any]:
  """``{key: ShapeDtypeStruct of its last marked value}`` of ``fn(*args) -> (outs, found)``, traced abstractly."""
  shapes: Dict[str, Any] = {}

  def probe(*a):
    _, found = fn(*a)
    for key, value in found:
      last = value.last if isinstance(value, _Partial) else value
      shapes[key] = None if last is None else jax.ShapeDtypeStruct(jnp.shape(last), jnp.result_type(last))
    return 0

  jax.eval_shape(probe, *args)
  return shapes


def _cond_collect(params: Mapping[str, Any], invals: Sequence[Any]) -> Tuple[List[Any], List[Tuple]]:
  """A cond / switch whose branches also return the partial results of every name any branch marks."""
  branches = params["branches"]
  index, operands = invals[0], list(invals[1:])
  run = [functools.partial(lambda b, *ops: _eval_collect(b.jaxpr, b.consts, list(ops)), b) for b in branches]
  shapes: Dict[str, Any] = {}
  for fn in run:
    for key, shape in _marked_shapes(fn, *operands).items():
      same = key not in shapes or (shape is not None and shapes[key] is not None and shape == shapes[key])
      shapes[key] = shape if same else None
  if not shapes:
    return list(jax.lax.switch(index, [lambda *ops, f=fn: f(*ops)[0] for fn in run], *operands)), []

  def branch(fn, *ops):
    outs, found = fn(*ops)
    return outs, _as_partials(found, shapes)

  outs, partials = jax.lax.switch(index, [functools.partial(branch, fn) for fn in run], *operands)
  return list(outs), list(partials.items())


def _while_collect(params: Mapping[str, Any], invals: Sequence[Any]) -> Tuple[List[Any], List[Tuple]]:
  """A while_loop whose carry also accumulates the partial results of the names its body marks."""
  cond, body = params["cond_jaxpr"], params["body_jaxpr"]
  n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
  cond_consts, body_consts, init = invals[:n_cond], invals[n_cond:n_cond + n_body], list(invals[n_cond + n_body:])

  def run_body(carry):
    return _eval_collect(body.jaxpr, body.consts, list(body_consts) + list(carry))

  shapes = _marked_shapes(run_body, init)

  def cond_fn(state):
    return _eval_collect(cond.jaxpr, cond.consts, list(cond_consts) + list(state[0]))[0][0]

  def body_fn(state):
    carry, acc = state
    outs, found = run_body(carry)
    new = _as_partials(found, shapes)
    return list(outs), {k: _Partial(acc[k].total + new[k].total, acc[k].count + new[k].count,
                                     new[k].last if shapes[k] is not None else None) for k in shapes}

  start = _as_partials([], shapes)
  carry, acc = jax.lax.while_loop(cond_fn, body_fn, (init, start))
  return list(carry), list(acc.items())

def _eval_collect(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> Tuple[List[Any], List[Tuple]]:
  """Evaluates ``jaxpr`` and returns ``(outputs, [(key, value), ...])`` for the marked values in it."""
  env: Dict[Any, Any] = {}
  found: List[Tuple[str, Any]] = []

  def read(v):
    return v.val if isinstance(v, jex_core.Literal) else env[v]

  for var, val in zip(jaxpr.constvars, consts):
    env[var] = val
  for var, val in zip(jaxpr.invars, args):
    env[var] = val
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    if eqn.primitive is _summary_p:
      found.append((f"{eqn.params['aggregation']}||{eqn.params['name']}", invals[0]))
      outvals = invals
    elif name in ("pjit", "jit", "closed_call"):
      inner = eqn.params["jaxpr" if "jaxpr" in eqn.params else "call_jaxpr"]
      outvals, inner_found = _eval_collect(inner.jaxpr, inner.consts, invals)
      found.extend(inner_found)
    elif name == "scan":
      outvals, inner_found = _scan_collect(eqn.params, invals)
      found.extend(inner_found)
    elif name == "cond":
      outvals, inner_found = _cond_collect(eqn.params, invals)
      found.extend(inner_found)
    elif name == "while":
      outvals, inner_found = _while_collect(eqn.params, invals)
      found.extend(inner_found)
    else:
      with eqn.ctx.manager:
        outvals = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
      outvals = outvals if eqn.primitive.multiple_results else [outvals]
    for var, val in zip(eqn.outvars, outvals):
      env[var] = val
  return [read(v) for v in jaxpr.outvars], found


def _scan_collect(params: Mapping[str, Any], invals: Sequence[Any]) -> Tuple[List[Any], List[Tuple]]:
  """A scan whose body's marked values become extra stacked outputs (one entry per step)."""
  body = params["jaxpr"]
  if "num_consts" in params:
    n_consts, n_carry = params["num_consts"], params["num_carry"]
  else:  # JAX 0.12 and later: the operand groups (consts, carry, xs) as flat trees
    n_consts, n_carry = (len(list(group.vals)) for group in list(params["ft_in"].unpack())[:2])
  consts, carry, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]
  keys: List[str] = []

  def step(c, x):
    outs, found = _eval_collect(body.jaxpr, body.consts, list(consts) + list(c) + list(x))
    keys[:] = [k for k, _ in found]
    return outs[:n_carry], (outs[n_carry:], [v for _, v in found])

  carry_out, (ys, marked) = jax.lax.scan(step, list(carry), list(xs), length=params["length"],
                                         reverse=params["reverse"], unroll=params["unroll"])
  return list(carry_out) + list(ys), list(zip(keys, marked))


def _reduce(key: str, values: Sequence[Any], sample_key: Any) -> Any:
  """One metric from the occurrences ``values`` of ``key`` (``sample_key``: this key's own random key)."""
  aggregation = key.split("||")[0]
  if aggregation == "mean":
    total = sum(jnp.sum(v.total) if isinstance(v, _Partial) else jnp.sum(v) for v in values)
    return total / sum(jnp.sum(v.count) if isinstance(v, _Partial) else v.size for v in values)
  if any(isinstance(v, _Partial) and v.last is None for v in values):
    raise ValueError(f"summary {key!r} ({aggregation}) is marked with different shapes in the branches of a cond.")
  values = [jnp.asarray(v.last) if isinstance(v, _Partial) else v for v in values]
  flat = jnp.concatenate([jnp.ravel(v) for v in values])
  if aggregation == "collect":
    return flat
  if aggregation == "sample":
    if sample_key is None:
      raise ValueError(f"summary {key!r} samples its value: pass sample_rng_key= to the wrapped function.")
    return flat[jax.random.randint(sample_key, (), 0, flat.size)]
  if len(values) != 1:
    raise ValueError(f"summary {key!r} ({aggregation}) must be recorded once, got {len(values)} occurrences.")
  if aggregation == "none":
    if values[0].size != 1:
      raise ValueError(f"summary {key!r} (none) must be of size 1, got shape {values[0].shape}.")
    return jnp.reshape(values[0], ())
  return values[0]


def with_summary_output_reduced(fn: F, static_argnums: Sequence[int] = ()) -> G:
  """``fn`` returning ``(output, metrics)``: the summaries made inside it, reduced per their aggregation.

  The wrapped function takes positional arguments (those at ``static_argnums`` are not traced) and the keyword
  ``sample_rng_key`` (needed when a ``sample`` summary is made).
  """
  static_argnums = tuple(static_argnums)

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    sample_key = kwargs.pop("sample_rng_key", None)
    if kwargs:
      raise TypeError(f"with_summary_output_reduced: only positional arguments, got keywords {sorted(kwargs)}.")
    dynamic = [a for i, a in enumerate(args) if i not in static_argnums]

    def traced(*dyn):
      it = iter(dyn)
      return fn(*[a if i in static_argnums else next(it) for i, a in enumerate(args)])

    token = _collecting.set(_collecting.get() + 1)
    try:
      closed, out_shape = jax.make_jaxpr(traced, return_shape=True)(*dynamic)
    finally:
      _collecting.reset(token)
    outs, found = _eval_collect(closed.jaxpr, closed.consts, jax.tree.leaves(dynamic))
    grouped: Dict[str, List[Any]] = collections.defaultdict(list)
    for key, value in found:
      grouped[key].append(value if isinstance(value, _Partial) else jnp.asarray(value))
    metrics = {key: _reduce(key, values, None if sample_key is None else jax.random.fold_in(sample_key, i))
               for i, (key, values) in enumerate(grouped.items())}
    return jax.tree.unflatten(jax.tree.structure(out_shape), outs), metrics

  return wrapped


def add_with_summary(fn: F, static_argnums: Sequence[int] = ()) -> G:
  """``fn`` with the keyword ``with_summary`` (default False) and a second output, the metrics dict (``{}``
  without summaries). Its signature gains ``with_summary`` so ``jax.jit(..., static_argnames=...)`` accepts it."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with_summary = kwargs.pop("with_summary", False)
    if with_summary:
      return with_summary_output_reduced(fn, static_argnums)(*args, **kwargs)
    kwargs.pop("sample_rng_key", None)
    return fn(*args, **kwargs), {}

  signature = inspect.signature(fn)
  parameters = list(signature.parameters.values())
  if "with_summary" not in signature.parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters):
    parameters.append(inspect.Parameter("with_summary", inspect.Parameter.KEYWORD_ONLY, default=False))
  wrapped.__signature__ = signature.replace(parameters=parameters)
  return wrapped


# ------------------------------------------------------------------------------------------------- host-side merge

def sample_value(key: PRNGKey, val: Any) -> Any:
  """One element of ``val``, uniformly at random."""
  val = jnp.asarray(val)
  return jnp.ravel(val)[jax.random.randint(key, (), 0, val.size)]


def aggregate_metric(k: str, vs: Sequence[Any], use_jnp: bool = False, key: Any = None) -> Any:
  """The values ``vs`` of the metric ``k`` (``"<aggregation>||name"``) combined per its aggregation; a mean is
  weighted by the values' sizes."""
  if "||" not in k:
    raise ValueError(f"aggregate_metric: key must be '<aggregation>||<name>', got {k!r}.")
  xnp = jnp if use_jnp else onp
  aggregation = k.split("||")[0]
  vs = [xnp.asarray(v) for v in vs]
  if aggregation == "mean":
    return xnp.sum(xnp.stack([xnp.sum(v) for v in vs])) / sum(int(onp.prod(v.shape)) for v in vs)
  if aggregation == "sample":
    flat = xnp.concatenate([xnp.ravel(v) for v in vs])
    if use_jnp:
      if key is None:
        raise ValueError("aggregate_metric: a sample aggregation with use_jnp=True needs key.")
      return flat[jax.random.randint(key, (), 0, flat.size)]
    return flat[onp.random.default_rng().integers(flat.size)]
  if aggregation == "collect":
    return xnp.concatenate([xnp.ravel(v) for v in vs])
  if aggregation in ("tensor", "none"):
    if len(vs) != 1:
      raise ValueError(f"aggregate_metric: {k!r} ({aggregation}) needs exactly one value, got {len(vs)}.")
    if aggregation == "none" and vs[0].size != 1:
      raise ValueError(f"aggregate_metric: {k!r} (none) must be of size 1, got shape {vs[0].shape}.")
    return vs[0] if aggregation == "tensor" else xnp.reshape(vs[0], ())
  raise ValueError(f"aggregate_metric: unknown aggregation {aggregation!r} in {k!r} (one of {_AGGREGATIONS}).")


@profile.wrap()
def aggregate_metric_list(metric_list: Sequence[Mapping[str, Any]], use_jnp: bool = False,
                          key: Any = None) -> MutableMapping[str, Any]:
  """Merges a list of metric dicts into one (a ``___<n>`` suffix of a key is dropped first)."""
  grouped: Dict[str, List[Any]] = collections.defaultdict(list)
  for metrics in metric_list:
    for k, v in metrics.items():
      grouped[k.split("___")[0]].append(v)
  keys = jax.random.split(key, len(grouped)) if use_jnp and key is not None else [None] * len(grouped)
  return {k: aggregate_metric(k, vs, use_jnp=use_jnp, key=kk) for (k, vs), kk in zip(grouped.items(), keys)}


def tree_scalar_mean(prefix: str, values: Any) -> None:
  """A ``mean`` summary ``prefix/<i>`` of each leaf of ``values``."""
  for i, leaf in enumerate(jax.tree.leaves(values)):
    summary(f"{prefix}/{i}", jnp.mean(leaf))


def tree_step(prefix: str, values: Any) -> None:
  """A ``mean`` summary ``prefix/<i>_avg_step_size`` (mean absolute value) of each leaf of ``values``."""
  for i, leaf in enumerate(jax.tree.leaves(values)):
    summary(f"{prefix}/{i}_avg_step_size", jnp.mean(jnp.abs(leaf)))


def _nested_to_names(ss: Any) -> List[Tuple[str, Any]]:
  """``[(path, leaf)]`` of a (nested) mapping of parameters, paths joined with "/" (a bare array: ``"params"``)."""
  if not isinstance(ss, Mapping):
    return [("params", ss)]
  return [("/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path), leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(ss)]


def summarize_inner_params(params: Any) -> None:
  """``<path>/mean`` and ``<path>/mean_abs`` summaries of each leaf of a (nested dict of) parameters."""
  for name, leaf in _nested_to_names(params):
    summary(f"{name}/mean", jnp.mean(leaf))
    summary(f"{name}/mean_abs", jnp.mean(jnp.abs(leaf)))


# ----------------------------------------------------------------------------------------------------------- writers

class SummaryWriterBase:
  """A destination for host-side values: ``scalar``, ``histogram``, ``tensor`` (name, value, step) and ``flush``."""

  def scalar(self, name, value, step):
    raise NotImplementedError

  def histogram(self, name, value, step):
    raise NotImplementedError

  def tensor(self, name, value, step):
    raise NotImplementedError

  def flush(self):
    raise NotImplementedError


class InMemorySummaryWriter(SummaryWriterBase):
  """Keeps every value: ``data[name] == (steps, values)`` as lists of numpy arrays."""

  def __init__(self):
    self.data = collections.defaultdict(lambda: ([], []))

  def scalar(self, name, value, step):
    self.data[name][0].append(onp.asarray(step))
    self.data[name][1].append(onp.asarray(value))

  histogram = scalar
  tensor = scalar

  def flush(self):
    pass


class PrintWriter(SummaryWriterBase):
  """Prints ``"<step>] <name>=<value>"`` for the names ``filter_fn`` accepts."""

  def __init__(self, filter_fn: Callable[[str], bool] = lambda tag: True):
    self.filter_fn = filter_fn

  def scalar(self, name, value, step):
    if self.filter_fn(name):
      print(f"{step}] {name}={value}")

  histogram = scalar

  def tensor(self, name, value, step):
    if self.filter_fn(name):
      print(f"{step}] {name}=Tensor: {onp.shape(value)}")

  def flush(self):
    pass


class MultiWriter(SummaryWriterBase):
  """Sends every call to each of ``writers``."""

  def __init__(self, *writers: SummaryWriterBase):
    self.writers = writers

  def scalar(self, name, value, step):
    for w in self.writers:
      w.scalar(name, value, step)

  def histogram(self, name, value, step):
    for w in self.writers:
      w.histogram(name, value, step)

  def tensor(self, name, value, step):
    for w in self.writers:
      w.tensor(name, value, step)

  def flush(self):
    for w in self.writers:
      w.flush()


class TensorboardWriter(SummaryWriterBase):
  """Writes ``{"kind", "name", "step", "value"}`` JSON lines to ``<log_dir>/summaries.jsonl``, each appended
  all-or-nothing (no TensorFlow event files: metafam has no TensorFlow). Histograms store the flattened values."""

  def __init__(self, log_dir: str):
    self.log_dir = os.fspath(log_dir)
    os.makedirs(self.log_dir, exist_ok=True)
    self.path = os.path.join(self.log_dir, "summaries.jsonl")

  def _write(self, kind, name, value, step):
    record = {"kind": kind, "name": str(name), "step": int(step), "value": value}
    mf_io.append_line(self.path, json.dumps(record))

  def scalar(self, name, value, step):
    self._write("scalar", name, float(onp.asarray(value)), step)

  def histogram(self, name, value, step, bins=None):
    del bins
    self._write("histogram", name, onp.ravel(onp.asarray(value, dtype=onp.float64)).tolist(), step)

  def tensor(self, name, value, step):
    self._write("tensor", name, onp.asarray(value, dtype=onp.float64).tolist(), step)

  def text(self, name, textdata, step):
    if not isinstance(textdata, (str, bytes)):
      raise ValueError(f"text: textdata must be str or bytes, got {type(textdata).__name__}.")
    self._write("text", name, textdata.decode() if isinstance(textdata, bytes) else textdata, step)

  def flush(self):
    pass

  def close(self):
    pass


JaxboardWriter = TensorboardWriter
