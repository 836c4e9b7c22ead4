"""`learned_optimization.research.general_lopt.pretrained_optimizers`: the reference's published learned optimizers
(VeLO and its predecessors) by name, with weights read from this machine instead of a cloud bucket.

Each name in `opt_names` and in `BASELINES` is a function ``name(path=None, lopt=None)`` returning the learned
optimizer with its weights loaded (an `Optimizer` of the reference's interface), as the reference's zero-argument
functions do; `prefab` uses ``aug12_continue_on_bigger_2xbs_200kstep_bigproblem_v2_5620`` (VeLO) by default.

Where the weights are looked up, first hit wins:

1. ``path``: the file itself;
2. the directory in the environment variable ``METAFAM_VELO_WEIGHTS``, laid out like the reference's bucket
   (``gs://gresearch/learned_optimization/pretrained_lopts/``): ``<dir>/<name>/params`` for the names of
   `opt_names`, ``<dir>/no_config/<file>.checkpoint`` for `BASELINES`.

metafam downloads nothing: copy the files there yourself (for example ``gsutil cp
gs://gresearch/learned_optimization/pretrained_lopts/<name>/params <dir>/<name>/params``). Without them the error
names the paths tried and this layout. Files are flax-msgpack (`metafam.compat.flax_msgpack`: read without
running code; needs ``pip install 'metafam[msgpack]'``); meta-parameters with a NaN or an infinity are refused.

Architecture: the reference rebuilds each optimizer of `opt_names` from a ``config.gin`` next to its weights; metafam
does not execute gin files and uses VeLO's published configuration (`VELO_CONFIG`: ``HyperV2(lstm_hidden_size=512,
param_inits=256, use_bugged_loss_features=False)``, the ``large_scale_phase*`` configs) unless ``lopt=`` gives
another learned optimizer. A file of another architecture or size does not fit and is refused, naming the first
differing entry. `BASELINES` use the reference's own loader configuration (`BASELINE_CONFIG`).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, List, Optional

import jax

from metafam.compat.learned_optimization.research.general_lopt.hyper_v2 import HyperV2
from metafam.compat import flax_msgpack as _flax
from metafam.runs import checkpoint as _checkpoint

ENV_VAR = "METAFAM_VELO_WEIGHTS"
BUCKET = "gs://gresearch/learned_optimization/pretrained_lopts/"
VELO_CONFIG = dict(lstm_hidden_size=512, param_inits=256, use_bugged_loss_features=False)
BASELINE_CONFIG = dict(lstm_hidden_size=512, param_inits=256, use_bugged_next_lstm_state=True)

opt_names: List[str] = [
    'march20_2022_march18_parametric_v4_dz',
    'march20_2022_march18_parametric_tg_7class_676',
    'march20_2022_march20_parametric_sm_275',
    'march23_2022_march20_parametric_sm_3931',
    'march30_2022_march27_parametric_v3_2998',
    'march31_2022_march27_parametric_v3_3917',
    'april4_2022_april1_bigcluster_v3_4448',
    'april5_2022_april1_bigcluster_v3_5363',
    'april7_2022_april1_bigcluster_v3_8291',
    'april17_2022_april1_bigcluster_v3_12801',
    'april22_2022_april21_bigcluster_lossclip_1016',
    'april22_2022_april21_bigcluster_lossclip_2992',
    'april22_2022_april21_bigcluster_lossclip_1260',
    'april22_2022_april21_bigcluster_lossclip_1861',
    'april22_2022_april21_bigcluster_lossclip_1859',
    'april22_2022_april21_bigcluster_lossclip_1858',
    'april22_2022_april21_bigcluster_lossclip_1857',
    'april22_2022_april21_bigcluster_lossclip_1860_seed2',
    'april24_2022_april23_bigcluster_renormalize2_583',
    'april24_2022_march27_parametric_v3_29584',
    'april22_2022_april21_bigcluster_lossclip_1860',
    'april15_2022_april1_smallcluster_v3_17819',
    'may3_2022_april28_clusterv2_5787',
    'may3_2022_april28_clusterv2_5371',
    'may27_2022_may9_bigcluster_8rep_10529',
    'may27_2022_may9_bigcluster_8rep_9931',
    'may27_2022_may9_bigcluster_8rep_10147',
    'may27_2022_may9_bigcluster_8rep_17012',
    'may27_2022_may9_bigcluster_8rep_17010',
    'may27_2022_may9_bigcluster_8rep_17015',
    'jun11_jun10_16x4_speedconfirm_rb_983',
    'may27_2022_jamesnomop__best_arch2__wd0.0_bbnormFalse_stepmult0_nomstep0.001_rep0',
    'may27_2022_jamesnomop__best_arch2__wd0.0_bbnormFalse_stepmult0_nomstep0.001_rep1',
    'may27_2022_jamesnomop__best_arch2__wd0.0_bbnormFalse_stepmult0.001_nomstep0.0_rep0',
    'may27_2022_jamesnomop__best_arch2__wd0.0_bbnormFalse_stepmult0.001_nomstep0.0_rep1',
    'may27_2022_jamesnomop__best_arch2__wd0.0_bbnormTrue_stepmult0.001_nomstep0.001_rep0',
    'may27_2022_jamesnomop__best_arch2__wd0.0_bbnormTrue_stepmult0.001_nomstep0.001_rep1',
    'may27_2022_jamesnomop__best_arch2__wd1.0_bbnormTrue_stepmult0.001_nomstep0.001_rep0',
    'may27_2022_jamesnomop__best_arch2__wd1.0_bbnormTrue_stepmult0.001_nomstep0.001_rep1',
    'may27_2022_jamesnomop__best_arch2__wd0.1_bbnormTrue_stepmult0.001_nomstep0.001_rep0',
    'may27_2022_jamesnomop__best_arch2__wd0.1_bbnormTrue_stepmult0.001_nomstep0.001_rep1',
    'may27_2022_jamesnomop__best_arch2__wd0.5_bbnormTrue_stepmult0.001_nomstep0.001_rep0',
    'may27_2022_jamesnomop__best_arch2__wd0.5_bbnormTrue_stepmult0.001_nomstep0.001_rep1',
    'may27_2022_smallscaletransfer_may8_smallscale_hyperlstm_fulles_sign_es__lr0.001_rep0__eval_all_params_1616',
    'may27_2022_smallscaletransfer_may8_smallscale_hyperlstm_fulles_sign_es__lr0.001_rep1__eval_all_params_1600',
    'may27_2022_smallscaletransfer_may8_smallscale_hyperlstm_sharednoise__lr3e-05_rep0__eval_all_params_1000',
    'may27_2022_smallscaletransfer_may13_nnadam__lr0.0001_rep2__eval_all_params_4013',
    'may27_2022_smallscaletransfer_may22_nominal_rmsprecondition_evel_smallerstep__lr3e-05_rep0__eval_all_params_1000',
    'may27_2022_smallscaletransfer_may13_nominal_hyperv2_adam3e4_v2__lr3e-05_rep1__eval_all_params_1000',
    'may27_2022_smallscaletransfer_may13_nominal_hyperv2_nnadam__lr3e-05_rep0__eval_all_params_1000',
    'may27_2022_smallscaletransfer_may13_nominal_hyperv2_nnadam__lr3e-05_rep1__eval_all_params_1000',
    'may27_2022_smallscaletransfer_may22_nominal_weightdecay__lr3e-05_rep0__eval_all_params_1000',
    'jun29_vlcluster_shortlength_pretrain_extend_1109',
    'jun29_vlcluster_shortlength_pretrain_extend_1150',
    'jun29_vlcluster_shortlength_pretrain_extend_1409',
    'jun29_vlcluster_shortlength_pretrain_extend_1605',
    'jun28_bigcluster_8rep_jf_biggerdatafinetune_812',
    'jun28_bigcluster_8rep_jf_biggerdatafinetune_3015',
    'jun28_bigcluster_8rep_jf_biggerdatafinetune_6941',
    'aug1_jul18_continue_on_bigger_2753',
    'aug1_jul18_continue_on_bigger_2xbs_morestale_5031',
    'aug1_jul18_continue_on_bigger_2xbs_morestale_5064',
    'aug1_jul18_continue_on_bigger_2xbs_morestale_3784',
    'aug1_jul18_continue_on_bigger_2xbs_morestale_3858',
    'aug1_jul18_continue_on_bigger_2xbs_morestale_7442',
    'aug1_jul18_continue_on_bigger_smallerlr_534',
    'aug1_jul18_continue_on_bigger_smallerlr_1265',
    'aug1_jul18_continue_on_bigger_2801',
    'aug1_jul18_continue_on_bigger_8814',
    'aug1_may9_bigcluster_8rep_17048',
    'aug5_aug2_continue_on_bigger_2xbs_200kstep_106',
    'aug5_aug2_continue_on_bigger_2xbs_200kstep_2363',
    'aug5_aug2_continue_on_bigger_2xbs_200kstep_8814',
    'jun26_bigcluster_8rep_jf_1e3lr_2906',
    'jul18_continue_on_bigger_2xbs_morestale_9264',
    'aug12_continue_on_bigger_2xbs_200kstep_bigproblem_v2_5620',
    'aug26_aug12_continue_on_bigger_2xbs_200kstep_bigproblem_v2_1397'
]

# name -> file under <dir>/no_config/ (the reference's ``_pretrained_lopt_load_baseline`` optimizers).
BASELINES: Dict[str, str] = {
    "aug11_aug4_trunc10per_avg": "aug11_aug4_trunc10per_avg.checkpoint",
    "aug11_aug4_trunc10per_last": "aug11_aug4_trunc10per_last.checkpoint",
    "sep14_sep10_compare_valid": "sep14_sep10_compare_valid_path.checkpoint",
    "sep14_sep10_compare2": "sep14_sep10_compare2.checkpoint",
    "sep14_sep10_compare2_v2": "sep14_sep10_compare2_v2.checkpoint",
    "sep14_aug20run_prior0": "sep14_aug20run_prior0.checkpoint",
}


def _public(name: str) -> str:
  return name.replace(".", "_").replace("-", "_")


_BY_PUBLIC_NAME = {_public(n): n for n in opt_names}


def weights_path(name: str, path: Optional[str] = None) -> str:
  """The weights file of optimizer ``name`` (module docstring), or FileNotFoundError saying where to put it."""
  if path is not None:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"weights of {name}: no file at {path!r}.")
    return path
  relative = os.path.join("no_config", BASELINES[name]) if name in BASELINES else os.path.join(name, "params")
  root = os.environ.get(ENV_VAR)
  if root and os.path.isfile(os.path.join(root, relative)):
    return os.path.join(root, relative)
  tried = f"{os.path.join(root, relative)!r} (from ${ENV_VAR})" if root else f"nothing: ${ENV_VAR} is not set"
  raise FileNotFoundError(
      f"no weights for the pretrained learned optimizer {name}: tried {tried}. metafam downloads nothing; copy "
      f"{BUCKET}{relative} to <dir>/{relative} and set {ENV_VAR}=<dir>, or pass path='/path/to/that/file'.")


def load_theta(lopt: Any, path: str) -> Any:
  """Meta-parameters for ``lopt`` from a learned_optimization parameter file (checked: structure, shapes, finite)."""
  like = jax.eval_shape(lopt.init, jax.random.key(0))
  theta = _flax.restore(like, _flax.plain_theta(_flax.load(path)), where=path)
  _checkpoint.check_finite(theta, path, "meta-parameter theta")
  return jax.tree.map(lambda x, w: jax.numpy.asarray(x, w.dtype), theta, like)


def load_pretrained(name: str, path: Optional[str] = None, lopt: Optional[Any] = None):
  """The pretrained optimizer ``name`` (a name of `opt_names` or `BASELINES`) with its weights."""
  if name not in BASELINES and name not in opt_names:
    raise ValueError(f"unknown pretrained optimizer {name!r}; see opt_names and BASELINES.")
  file = weights_path(name, path)
  if lopt is None:
    lopt = HyperV2(**(BASELINE_CONFIG if name in BASELINES else VELO_CONFIG))
  return lopt.opt_fn(load_theta(lopt, file))


def __getattr__(attr: str) -> Callable[..., Any]:
  name = _BY_PUBLIC_NAME.get(attr, attr if attr in BASELINES else None)
  if name is None:
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
  fn = functools.partial(load_pretrained, name)
  fn.__name__ = attr
  return fn


def __dir__() -> List[str]:
  return sorted(set(globals()) | set(_BY_PUBLIC_NAME) | set(BASELINES))
