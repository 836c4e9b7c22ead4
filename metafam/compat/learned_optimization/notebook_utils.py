"""`learned_optimization.notebook_utils`: plotting and smoothing helpers for notebooks.

``category_10`` / ``category_20`` are the Tableau 10 / 20 palettes (matplotlib's ``tab10`` / ``tab20``) as hex
strings; ``colors_for_num`` picks ``num`` colors from them (more than 20: evenly spaced hues, with ``categorical``
False: viridis); ``ema`` is an exponential moving average; ``similar_colors`` colors runs by their folder name with
the ``_rep<k>`` suffix removed; ``legend_to_side`` puts a matplotlib legend right of the axes. matplotlib is only
imported by the functions that draw.
"""

from __future__ import annotations

import colorsys
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from metafam.compat.learned_optimization import py_utils

__all__ = ["Color", "category_10", "category_20", "colors_for_num", "ema", "threaded_tqdm_map", "threaded_map",
           "similar_colors", "legend_to_side"]

Color = Any

category_10 = "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf".split()
category_20 = ("#1f77b4 #aec7e8 #ff7f0e #ffbb78 #2ca02c #98df8a #d62728 #ff9896 #9467bd #c5b0d5 #8c564b #c49c94 "
               "#e377c2 #f7b6d2 #7f7f7f #c7c7c7 #bcbd22 #dbdb8d #17becf #9edae5").split()


def colors_for_num(num: int, rep: int = 1, stride: Optional[int] = None, categorical: bool = True):
  """Colors for ``num`` lines: each repeated ``rep`` times, or with ``stride`` the first ``stride`` colors cycled."""
  if not categorical:
    from matplotlib import cm  # pylint: disable=g-import-not-at-top
    return [cm.viridis(i / num) for i in range(num)]
  if num <= 10:
    palette = category_10
  elif num <= 20:
    palette = category_20
  else:
    palette = [colorsys.hls_to_rgb(i / num, 0.3, 0.8) for i in range(num)]
  if stride is not None:
    return list(palette[:stride]) * 10
  return [c for c in palette for _ in range(rep)]


def ema(data: Any, alpha: float, ignore_nan: bool = False) -> np.ndarray:
  """``x[0] = data[0]``, ``x[i] = alpha x[i-1] + (1 - alpha) data[i]``; with ``ignore_nan`` a NaN keeps ``x[i-1]``."""
  data = np.asarray(data)
  if data.shape[0] == 0:
    return data
  out = np.zeros_like(data)
  out[0] = data[0]
  for i in range(1, data.shape[0]):
    if ignore_nan and np.isnan(data[i]):
      out[i] = out[i - 1]
    else:
      out[i] = alpha * out[i - 1] + (1 - alpha) * data[i]
  return out


threaded_tqdm_map = py_utils.threaded_tqdm_map


def threaded_map(threads: int, func: Callable[[Any], Any], data: Sequence[Any]) -> Sequence[Any]:
  """`py_utils.threaded_tqdm_map` without the requirement of a progress bar (same results, same order)."""
  return py_utils.threaded_tqdm_map(threads, func, data)


def _strip_rep(folder: str) -> str:
  return "_rep".join(folder.split("_rep")[:-1]) if "_rep" in folder else folder


def similar_colors(folders: Sequence[str], remove_trailing_subfolder_number: Optional[int] = None
                   ) -> Tuple[Sequence[Color], Sequence[Tuple[str, Color]]]:
  """``(color per folder, [(label, color)])``: folders equal up to ``_rep<k>`` (and, with
  ``remove_trailing_subfolder_number=n``, keeping only their n-th last path part) share a color."""
  if remove_trailing_subfolder_number is not None and remove_trailing_subfolder_number < 1:
    raise ValueError("similar_colors: remove_trailing_subfolder_number must be a positive int or None, got "
                     f"{remove_trailing_subfolder_number!r}.")

  def key(folder):
    folder = _strip_rep(folder)
    return folder.split("/")[-remove_trailing_subfolder_number] if remove_trailing_subfolder_number else folder

  uniques = sorted(set(key(f) for f in folders))
  palette = colors_for_num(len(uniques))
  color_of = {u: palette[i] for i, u in enumerate(uniques)}
  return [color_of[key(f)] for f in folders], list(color_of.items())


def legend_to_side(*args, ax=None, rescale: bool = True, **kwargs):
  """``ax.legend`` placed right of the axes (``rescale``: shrink the axes to 80% width to make room)."""
  if ax is None:
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
    ax = plt.gca()
  if rescale:
    box = ax.get_position()
    ax.set_position([box.x0, box.y0, box.width * 0.8, box.height])
  return ax.legend(*args, loc="center left", bbox_to_anchor=(1, 0.5), **kwargs)
