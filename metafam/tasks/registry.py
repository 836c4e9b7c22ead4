"""Named tasks: a plain dict from name to a zero-argument constructor.

Constructors import their modules lazily, so listing names costs nothing and the core never imports haiku. Task
families have their own registry, `metafam.taskfamilies.registry`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from metafam._registry import lookup


class SuiteTask(NamedTuple):
  """A task of a benchmark suite (`metafam.benchmark.suites`): its zero-argument constructor and its horizon, the
  inner steps of one run."""
  build: Callable[[], Any]
  horizon: int


def _image_mlp(hidden_sizes, image_size, activation="relu"):
  def build():
    from metafam.tasks.image_mlp import ImageMLPTask
    suffix = "" if activation == "relu" else f"_{activation}"
    return ImageMLPTask(hidden_sizes, activation=activation, image_size=image_size,
                        name=f"fmnist_mlp_{image_size}x{image_size}_{'x'.join(map(str, hidden_sizes))}{suffix}")
  return build


def _conv(channels, image_size, in_channels=1):
  def build():
    from metafam.tasks.conv import ConvTask
    shape = f"{image_size}x{image_size}" + (f"x{in_channels}" if in_channels != 1 else "")
    return ConvTask(channels, image_size=image_size, in_channels=in_channels,
                    name=f"fmnist_conv_{shape}_{'x'.join(map(str, channels))}")
  return build


def _autoencoder(hidden_sizes, image_size):
  def build():
    from metafam.tasks.autoencoder import MLPAutoencoderTask
    return MLPAutoencoderTask(hidden_sizes, image_size=image_size,
                              name=f"fmnist_ae_{image_size}x{image_size}_{'x'.join(map(str, hidden_sizes))}")
  return build


def _vae(hidden_size, latent_size, image_size):
  def build():
    from metafam.tasks.autoencoder import VAETask
    return VAETask((hidden_size,), latent_size, (hidden_size,), image_size=image_size,
                   name=f"fmnist_vae_{image_size}x{image_size}_{hidden_size}_z{latent_size}")
  return build


def _lstm_lm(hidden_size, embed_size):
  def build():
    from metafam.tasks.language import LSTMLanguageModelTask
    return LSTMLanguageModelTask(hidden_size, embed_size, name=f"shakespeare_char_lstm_{hidden_size}")
  return build


def _transformer_lm(num_layers, model_size, num_heads):
  def build():
    from metafam.tasks.language import TransformerLanguageModelTask
    return TransformerLanguageModelTask(num_layers, model_size, num_heads,
                                        name=f"shakespeare_char_transformer_{num_layers}x{model_size}")
  return build


# -- the held-out benchmark suite's tasks (`HELDOUT_SUITE`): other widths, depths, resolutions, architectures, batch
# sizes and data (MNIST digits, text) than meta-training's 8x8 Fashion-MNIST MLPs; the batch size is part of the name.
def _images(dataset, batch_size, image_size):
  from metafam.datasets.images import fashion_mnist_datasets, mnist_digits_datasets
  return {"fmnist": fashion_mnist_datasets, "mnist": mnist_digits_datasets}[dataset](batch_size, image_size)


def _heldout_mlp(dataset, image_size, hidden_sizes, batch_size, activation="relu"):
  suffix = "" if activation == "relu" else f"_{activation}"
  name = f"{dataset}_mlp_{image_size}x{image_size}_{'x'.join(map(str, hidden_sizes))}{suffix}_b{batch_size}"

  def build():
    from metafam.tasks.image_mlp import ImageMLPTask
    return ImageMLPTask(hidden_sizes, activation=activation, datasets=_images(dataset, batch_size, image_size),
                        name=name)
  return build


def _heldout_conv(dataset, image_size, channels, batch_size, norm=None):
  suffix = "" if norm is None else "_" + norm.replace("_", "")
  name = f"{dataset}_conv_{image_size}x{image_size}_{'x'.join(map(str, channels))}{suffix}_b{batch_size}"

  def build():
    from metafam.tasks.conv import ConvTask
    return ConvTask(channels, datasets=_images(dataset, batch_size, image_size), norm=norm, name=name)
  return build


def _heldout_ae(dataset, image_size, hidden_sizes, batch_size):
  name = f"{dataset}_ae_{image_size}x{image_size}_{'x'.join(map(str, hidden_sizes))}_b{batch_size}"

  def build():
    from metafam.tasks.autoencoder import MLPAutoencoderTask
    return MLPAutoencoderTask(hidden_sizes, datasets=_images(dataset, batch_size, image_size), name=name)
  return build


def _heldout_vae(dataset, image_size, hidden_size, latent_size, batch_size):
  name = f"{dataset}_vae_{image_size}x{image_size}_{hidden_size}_z{latent_size}_b{batch_size}"

  def build():
    from metafam.tasks.autoencoder import VAETask
    return VAETask((hidden_size,), latent_size, (hidden_size,), datasets=_images(dataset, batch_size, image_size),
                   name=name)
  return build


def _heldout_mixer(dataset, image_size, patch_size, hidden_dim, num_blocks, batch_size):
  name = f"{dataset}_mixer_{image_size}x{image_size}_p{patch_size}_{hidden_dim}x{num_blocks}_b{batch_size}"

  def build():
    from metafam.tasks.vision import MLPMixerTask
    return MLPMixerTask(_images(dataset, batch_size, image_size), patch_size, hidden_dim, num_blocks,
                        tokens_mlp_dim=hidden_dim, channels_mlp_dim=2 * hidden_dim, name=name)
  return build


def _heldout_lm(kind, size, batch_size, sequence_length, num_layers=1, num_heads=2):
  shape = f"{size}" if kind == "lstm" else f"{num_layers}x{size}"
  name = f"shakespeare_char_{kind}_{shape}_t{sequence_length}_b{batch_size}"

  def build():
    from metafam.datasets.text import shakespeare_char_datasets
    from metafam.tasks.language import LSTMLanguageModelTask, TransformerLanguageModelTask
    data = shakespeare_char_datasets(batch_size, sequence_length)
    if kind == "lstm":
      return LSTMLanguageModelTask(size, size // 2, datasets=data, name=name)
    return TransformerLanguageModelTask(num_layers, size, num_heads, datasets=data, name=name)
  return build


# The heldout suite (`metafam.benchmark.suites`, "heldout"): name -> constructor and horizon (inner steps of one
# run), in the baselines' generation order. The one list of the suite's tasks: the suite, its horizons and its
# baselines (`metafam.benchmark.baselines`) are read from it, so a task is added here and nowhere else.
HELDOUT_SUITE: Dict[str, SuiteTask] = {
    "mnist_mlp_16x16_64_b32": SuiteTask(_heldout_mlp("mnist", 16, (64,), 32), 1000),  # 17,098 params
    "fmnist_mlp_16x16_64_b32": SuiteTask(_heldout_mlp("fmnist", 16, (64,), 32), 2000),  # 17,098 params
    "mnist_mlp_16x16_128_b256": SuiteTask(_heldout_mlp("mnist", 16, (128,), 256), 200),  # 34,186 params
    "mnist_vae_16x16_64_z8_b32": SuiteTask(_heldout_vae("mnist", 16, 64, 8, 32), 512),  # 34,704 params
    "fmnist_conv_16x16_8x16_b32": SuiteTask(_heldout_conv("fmnist", 16, (8, 16), 32), 200),  # 1,418 params
    "shakespeare_char_lstm_32_t32_b32": SuiteTask(_heldout_lm("lstm", 32, 32, 32), 320),  # 9,996 params
    "mnist_ae_28x28_64x16x64_b32": SuiteTask(_heldout_ae("mnist", 28, (64, 16, 64), 32), 200),  # 103,328 params
    "shakespeare_char_transformer_1x32_t16_b32": SuiteTask(  # 18,220 params
        _heldout_lm("transformer", 32, 32, 16), 200),
    "mnist_conv_16x16_8x16_layernorm_b32": SuiteTask(  # 1,466 params
        _heldout_conv("mnist", 16, (8, 16), 32, norm="layer_norm"), 200),
    "fmnist_mlp_28x28_32x32x32x32_b128": SuiteTask(  # 28,618 params
        _heldout_mlp("fmnist", 28, (32, 32, 32, 32), 128), 320),
    "fmnist_mlp_16x16_1024_b32": SuiteTask(_heldout_mlp("fmnist", 16, (1024,), 32), 200),  # 273,418 params
    "fmnist_ae_16x16_128x32x128_b32": SuiteTask(_heldout_ae("fmnist", 16, (128, 32, 128), 32), 320),  # 74,272 params
    "fmnist_mlp_28x28_64x64_tanh_b32": SuiteTask(  # 55,050 params
        _heldout_mlp("fmnist", 28, (64, 64), 32, "tanh"), 512),
    "mnist_mlp_28x28_128x128x128_b32": SuiteTask(_heldout_mlp("mnist", 28, (128, 128, 128), 32), 200),  # 134,794 params
    "mnist_mlp_16x16_256x256_gelu_b64": SuiteTask(  # 134,154 params
        _heldout_mlp("mnist", 16, (256, 256), 64, "gelu"), 200),
    "fmnist_vae_28x28_64_z8_b64": SuiteTask(_heldout_vae("fmnist", 28, 64, 8, 64), 200),  # 102,816 params
    "mnist_mixer_16x16_p4_32x2_b64": SuiteTask(_heldout_mixer("mnist", 16, 4, 32, 2, 64), 320),  # 11,722 params
}
HELDOUT_TASKS: Dict[str, Callable] = {name: task.build for name, task in HELDOUT_SUITE.items()}


def _quadratic(dim):
  def build():
    from metafam.tasks.quadratic import QuadraticTask
    return QuadraticTask(dim)
  return build


# -- the test suite's tasks (`TEST_SUITE`): evaluated once per shipped optimizer, never tuned on. Full-size data at
# the sizes people train: the whole Fashion-MNIST (60,000 training images at 28x28, read from
# ``$METAFAM_FASHION_MNIST_DIR`` or Debian's ``dataset-fashion-mnist`` package; nothing ships it) and the embedded
# Shakespeare corpus; 10^5-10^6 parameters except the convex model.
def _full_fmnist(batch_size):
  from metafam.datasets.images import fashion_mnist_datasets
  return fashion_mnist_datasets(batch_size, 28, data_dir="full")


def _test_mlp(hidden_sizes, batch_size, activation="relu"):
  suffix = "" if activation == "relu" else f"_{activation}"
  kind = f"mlp_28x28_{'x'.join(map(str, hidden_sizes))}" if hidden_sizes else "logreg_28x28"
  name = f"fmnist60k_{kind}{suffix}_b{batch_size}"

  def build():
    from metafam.tasks.image_mlp import ImageMLPTask
    return ImageMLPTask(hidden_sizes, activation=activation, datasets=_full_fmnist(batch_size), name=name)
  return build


def _test_conv(channels, batch_size):
  name = f"fmnist60k_conv_28x28_{'x'.join(map(str, channels))}_b{batch_size}"

  def build():
    from metafam.tasks.conv import ConvTask
    return ConvTask(channels, datasets=_full_fmnist(batch_size), name=name)
  return build


def _test_ae(hidden_sizes, batch_size):
  name = f"fmnist60k_ae_28x28_{'x'.join(map(str, hidden_sizes))}_b{batch_size}"

  def build():
    from metafam.tasks.autoencoder import MLPAutoencoderTask
    return MLPAutoencoderTask(hidden_sizes, datasets=_full_fmnist(batch_size), name=name)
  return build


def _test_vae(hidden_size, latent_size, batch_size):
  name = f"fmnist60k_vae_28x28_{hidden_size}_z{latent_size}_b{batch_size}"

  def build():
    from metafam.tasks.autoencoder import VAETask
    return VAETask((hidden_size,), latent_size, (hidden_size,), datasets=_full_fmnist(batch_size), name=name)
  return build


# The test suite (`metafam.benchmark.suites`, "test"): name -> constructor and horizon, in generation order (cheapest
# first, so a partial run covers the most tasks). The one list of the suite's tasks, as `HELDOUT_SUITE` is for heldout.
TEST_SUITE: Dict[str, SuiteTask] = {
    "fmnist60k_logreg_28x28_b128": SuiteTask(_test_mlp((), 128), 2000),  # 7,850 params
    "fmnist60k_mlp_28x28_128x128x128_b64": SuiteTask(_test_mlp((128, 128, 128), 64), 1000),  # 134,794 params
    "fmnist60k_mlp_28x28_128x128x128x128x128x128_tanh_b64": SuiteTask(  # 184,330 params
        _test_mlp((128,) * 6, 64, "tanh"), 1000),
    "fmnist60k_ae_28x28_128x32x128_b64": SuiteTask(_test_ae((128, 32, 128), 64), 1000),  # 209,968 params
    "fmnist60k_vae_28x28_128_z16_b64": SuiteTask(_test_vae(128, 16, 64), 1000),  # 207,920 params
    "fmnist60k_mlp_28x28_160x160x160x160_gelu_b64": SuiteTask(  # 204,490 params
        _test_mlp((160, 160, 160, 160), 64, "gelu"), 1000),
    "fmnist60k_mlp_28x28_384x96_b32": SuiteTask(_test_mlp((384, 96), 32), 1000),  # 339,370 params
    "fmnist60k_mlp_28x28_256x256_b128": SuiteTask(_test_mlp((256, 256), 128), 1000),  # 269,322 params
    "fmnist60k_mlp_28x28_512x512_b32": SuiteTask(_test_mlp((512, 512), 32), 1000),  # 669,706 params
    "fmnist60k_conv_28x28_16x32x64x128_b32": SuiteTask(_test_conv((16, 32, 64, 128), 32), 1000),  # 98,442 params
    "shakespeare_char_lstm_128_t32_b16": SuiteTask(_heldout_lm("lstm", 128, 16, 32), 1000),  # 113,484 params
    "shakespeare_char_transformer_2x64_t32_b16": SuiteTask(  # 111,948 params
        _heldout_lm("transformer", 64, 16, 32, 2, 4), 1000),
}
TEST_TASKS: Dict[str, Callable] = {name: task.build for name, task in TEST_SUITE.items()}


TASKS: Dict[str, Callable] = {
    "quadratic_10": _quadratic(10),  # 10 params
    "fmnist_mlp_8x8_32": _image_mlp((32,), 8),            # 2,410 params
    "fmnist_mlp_28x28_128x128": _image_mlp((128, 128), 28),  # 118,282 params
    "fmnist_mlp_8x8_64x64_tanh": _image_mlp((64, 64), 8, "tanh"),  # 8,970 params
    "fmnist_mlp_16x16_64_gelu": _image_mlp((64,), 16, "gelu"),  # 17,098 params
    "fmnist_mlp_16x16_128x32": _image_mlp((128, 32), 16),  # 37,354 params
    "fmnist_mlp_28x28_32_swish": _image_mlp((32,), 28, "swish"),  # 25,450 params
    "fmnist_conv_16x16_16x32": _conv((16, 32), 16),  # 5,130 params
    "fmnist_conv_28x28_16x32x32": _conv((16, 32, 32), 28),  # 14,378 params
    "fmnist_conv_32x32x3_16x32x64": _conv((16, 32, 64), 32, in_channels=3),  # 24,234 params (CIFAR-shaped)
    "fmnist_ae_8x8_32x8x32": _autoencoder((32, 8, 32), 8),  # 4,744 params
    "fmnist_ae_16x16_64x16x64": _autoencoder((64, 16, 64), 16),  # 35,216 params
    "fmnist_vae_8x8_32_z4": _vae(32, 4, 8),  # 4,616 params
    "fmnist_vae_16x16_64_z8": _vae(64, 8, 16),  # 34,704 params
    "shakespeare_char_lstm_64": _lstm_lm(64, 32),  # 32,204 params
    "shakespeare_char_transformer_2x64": _transformer_lm(2, 64, 4),  # 113,996 params
    **HELDOUT_TASKS,
    **TEST_TASKS,
}


def get_task(name: str):
  """Builds the registered task ``name``; `UnknownNameError` listing the valid names if there is none."""
  return lookup(TASKS, name, "task")()


# The tasks whose data the user supplies (metafam ships none of it): the data, in short (with the variable that
# supplies it) and in full (how to supply it).
USER_DATA_SOURCES: Dict[str, Tuple[str, str]] = {
    "full Fashion-MNIST": ("$METAFAM_FASHION_MNIST_DIR", "the full Fashion-MNIST: set $METAFAM_FASHION_MNIST_DIR to the "
                           "directory of its four IDX files, or install Debian's dataset-fashion-mnist "
                           "(/usr/share/datasets/fashion-mnist)")}
USER_DATA: Dict[str, str] = {name: "full Fashion-MNIST" for name in TEST_TASKS if name.startswith("fmnist60k_")}


def needs_user_data(name: str) -> Optional[Tuple[str, str]]:
  """``(short, full)``: what registered task ``name`` needs from the user (the data and the variable that supplies
  it; how to supply them), or None when its data ship with metafam."""
  return USER_DATA_SOURCES[USER_DATA[name]] if name in USER_DATA else None


def check_task_data(name: str) -> None:
  """FileNotFoundError (naming the task, the data and how to supply them) when the user data that task ``name``
  needs cannot be found; reads no data (a cheap check before anything is created)."""
  if name not in USER_DATA:
    return
  from metafam.datasets.images import DEBIAN_FASHION_MNIST_DIR, FASHION_MNIST_ENV, resolve_data_dir
  import os
  try:
    resolve_data_dir(None, FASHION_MNIST_ENV, DEBIAN_FASHION_MNIST_DIR)
  except FileNotFoundError as e:
    found = f"{e}" if os.environ.get(FASHION_MNIST_ENV) else "neither is there."
    raise FileNotFoundError(f"task {name} needs {USER_DATA_SOURCES[USER_DATA[name]][1]}; {found}") from None


def list_tasks() -> List[str]:
  return sorted(TASKS)
