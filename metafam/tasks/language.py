"""Character-level language models (dm-haiku): an LSTM and a small causal transformer.

Batches are ``{"obs": i32[B, T], "target": i32[B, T]}`` (next-character prediction, e.g. the embedded Shakespeare
of `metafam.datasets.text.shakespeare_char_datasets`). The loss is the mean per-token softmax cross-entropy, the aux
output holds the per-token accuracy, and `normalizer` divides by ``log(vocab_size)`` (uniform prediction -> 1.0).

Parameters, with vocabulary V, embedding E, hidden H, model width d, L layers, MLP width M, context T:

  * LSTM: ``V*E`` (embedding) + ``4*H*(E + H) + 4*H`` (one haiku LSTM) + ``(H + 1)*V`` (output).
  * transformer: ``V*d + T*d`` (token and learned position embeddings) + ``L * (4*d + (d + 1)*3*d + (d + 1)*d +
    (d + 1)*M + (M + 1)*d)`` (two LayerNorms, fused QKV, attention output, MLP) + ``2*d`` (final LayerNorm) +
    ``(d + 1)*V``.

Registered (Shakespeare, V = 76, T = 64, batch 32):

  * ``shakespeare_char_lstm_64``: E = 32, H = 64: 32,204 params.
  * ``shakespeare_char_transformer_2x64``: d = 64, L = 2, 4 heads, M = 256, GELU: 113,996 params.
  * heldout suite: ``shakespeare_char_lstm_32_t32_b32`` (T = 32, E = 16, H = 32): 9,996 params;
    ``shakespeare_char_transformer_1x32_t16_b32`` (T = 16, d = 32, L = 1, 2 heads, M = 128): 18,220 params.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.datasets.base import Datasets
from metafam.datasets.text import shakespeare_char_datasets
from metafam.tasks._nn import activation_by_name
from metafam.tasks.base import Task
from metafam.tasks.conv import Activation, select_activation, smoothed_cross_entropy


def lstm_lm_forward(vocab_size: int, embed_size: int, hidden_size: int) -> hk.Transformed:
  """A haiku LSTM LM ``forward(obs i32[B, T], embed_scale=1.0) -> logits f32[B, T, vocab_size]``.

  ``embed_scale`` multiplies the embedded inputs (may be traced).
  """

  def forward(obs, embed_scale=1.0):
    x = hk.Embed(vocab_size, embed_size, name="embed")(obs) * embed_scale
    core = hk.LSTM(hidden_size, name="lstm")
    outputs, _ = hk.dynamic_unroll(core, x, core.initial_state(obs.shape[0]), time_major=False)
    return hk.Linear(vocab_size, name="logits")(outputs)

  return hk.without_apply_rng(hk.transform(forward))


def causal_self_attention(x: jax.Array, num_heads: int, name: str) -> jax.Array:
  """Multi-head causal self-attention of ``x f32[B, T, d]`` (fused QKV projection, output projection)."""
  batch, length, width = x.shape
  head = width // num_heads
  qkv = hk.Linear(3 * width, name=f"{name}_qkv")(x).reshape(batch, length, 3, num_heads, head)
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(head)
  causal = jnp.tril(jnp.ones((length, length), bool))
  weights = jax.nn.softmax(jnp.where(causal, logits, jnp.finfo(logits.dtype).min), axis=-1)
  out = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(batch, length, width)
  return hk.Linear(width, name=f"{name}_out")(out)


def transformer_lm_forward(vocab_size: int, sequence_length: int, model_size: int = 64, num_layers: int = 2,
                           num_heads: int = 4, mlp_size: Optional[int] = None,
                           activations: Sequence[Activation] = (jax.nn.gelu,)) -> hk.Transformed:
  """A pre-LayerNorm causal transformer ``forward(obs i32[B, T], activation_index=0, embed_scale=1.0) -> logits``.

  ``T <= sequence_length`` (learned positions). The MLP activation is ``activations[activation_index]``, dispatched
  with `jax.lax.switch` when there are several; ``embed_scale`` multiplies the token embeddings. Both may be traced.
  """
  if model_size % num_heads:
    raise ValueError(f"model_size {model_size} must be divisible by num_heads {num_heads}.")
  mlp_size = 4 * model_size if mlp_size is None else mlp_size

  def forward(obs, activation_index=0, embed_scale=1.0):
    act = select_activation(activations, activation_index)
    x = hk.Embed(vocab_size, model_size, name="embed")(obs) * embed_scale
    positions = hk.get_parameter("position_embeddings", [sequence_length, model_size], x.dtype,
                                 init=hk.initializers.TruncatedNormal())
    x = x + positions[:obs.shape[1]]
    layer_norm = lambda name: hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name=name)
    for i in range(num_layers):
      x = x + causal_self_attention(layer_norm(f"ln_attn_{i}")(x), num_heads, name=f"attn_{i}")
      h = act(hk.Linear(mlp_size, name=f"mlp_in_{i}")(layer_norm(f"ln_mlp_{i}")(x)))
      x = x + hk.Linear(model_size, name=f"mlp_out_{i}")(h)
    return hk.Linear(vocab_size, name="logits")(layer_norm("ln_final")(x))

  return hk.without_apply_rng(hk.transform(forward))


def token_cross_entropy_and_accuracy(logits: jax.Array, targets: jax.Array, smoothing=0.0):
  """(mean per-token cross-entropy, optionally label-smoothed; mean per-token accuracy)."""
  loss = smoothed_cross_entropy(logits, targets, smoothing)
  accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32))
  return loss, accuracy


class LanguageModelTask(Task):
  """A next-token language model on a `Datasets` of ``{"obs", "target"}`` batches; subclasses set ``self.net``.

  Args:
    datasets: the data; defaults to the embedded Shakespeare with ``batch_size`` and ``sequence_length``.
    batch_size, sequence_length: used only to build the default datasets.
  """

  def __init__(self, datasets: Optional[Datasets] = None, batch_size: int = 32, sequence_length: int = 64):
    self.datasets = datasets if datasets is not None else shakespeare_char_datasets(batch_size, sequence_length)
    if "vocab_size" not in self.datasets.extra_info:
      raise ValueError("language-model datasets must give extra_info['vocab_size'].")
    self.vocab_size = int(self.datasets.extra_info["vocab_size"])
    self.sequence_length = int(self.datasets.abstract_batch["obs"].shape[1])

  def init(self, key):
    obs = self.datasets.abstract_batch["obs"]
    return self.net.init(key, jnp.zeros(obs.shape, obs.dtype))

  def loss_and_aux(self, params, key, batch):
    loss, accuracy = token_cross_entropy_and_accuracy(self.net.apply(params, batch["obs"]), batch["target"])
    return loss, {"accuracy": accuracy}

  def normalizer(self, loss):
    return loss / jnp.log(self.vocab_size)


class LSTMLanguageModelTask(LanguageModelTask):
  """Character LSTM LM: embedding (E) -> one LSTM layer (H) -> Linear(V) (parameters: see the module docstring)."""

  def __init__(self, hidden_size: int = 64, embed_size: int = 32, datasets: Optional[Datasets] = None,
               batch_size: int = 32, sequence_length: int = 64, name: Optional[str] = None):
    super().__init__(datasets, batch_size, sequence_length)
    self.hidden_size, self.embed_size = int(hidden_size), int(embed_size)
    self.net = lstm_lm_forward(self.vocab_size, self.embed_size, self.hidden_size)
    self.name = name or f"LSTMLM_{self.hidden_size}"


class TransformerLanguageModelTask(LanguageModelTask):
  """Character transformer LM: token + position embeddings -> L pre-LN causal blocks -> LayerNorm -> Linear(V).

  Parameters: see the module docstring; ``mlp_size`` defaults to ``4 * model_size``.
  """

  def __init__(self, num_layers: int = 2, model_size: int = 64, num_heads: int = 4, mlp_size: Optional[int] = None,
               activation: str = "gelu", datasets: Optional[Datasets] = None, batch_size: int = 32,
               sequence_length: int = 64, name: Optional[str] = None):
    super().__init__(datasets, batch_size, sequence_length)
    self.num_layers, self.model_size, self.num_heads = int(num_layers), int(model_size), int(num_heads)
    self.mlp_size = 4 * self.model_size if mlp_size is None else int(mlp_size)
    self.activation = activation
    self.net = transformer_lm_forward(self.vocab_size, self.sequence_length, self.model_size, self.num_layers,
                                      self.num_heads, self.mlp_size, [activation_by_name(activation)])
    self.name = name or f"TransformerLM_{self.num_layers}x{self.model_size}"
