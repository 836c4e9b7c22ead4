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
  * test suite: ``shakespeare_char_lstm_128_t32_b16`` (T = 32, E = 64, H = 128): 113,484 params;
    ``shakespeare_char_transformer_2x64_t32_b16`` (T = 32, d = 64, L = 2, 4 heads, M = 256): 111,948 params.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.datasets.base import Datasets
from metafam.datasets.text import shakespeare_char_datasets
from metafam.tasks._nn import activation_by_name
from metafam.tasks.base import Task
from metafam.tasks.conv import Activation, select_activation, smoothed_cross_entropy


class IRNN(hk.VanillaRNN):
  """A ReLU RNN whose recurrent weights start as ``gain * I`` (Le et al., 2015): ``h' = relu(W x + U h + b)``.

  Parameters for input size E and hidden H: ``(E + 1) * H + H * H`` plus ``H`` more with ``double_bias``.
  """

  def __init__(self, hidden_size: int, double_bias: bool = True, name: Optional[str] = None, gain: float = 1.0):
    super().__init__(hidden_size=hidden_size, double_bias=double_bias, name=name)
    self.gain = gain

  def __call__(self, inputs, prev_state):
    recurrent = hk.Linear(self.hidden_size, with_bias=self.double_bias, w_init=hk.initializers.Identity(self.gain))
    out = jax.nn.relu(hk.Linear(self.hidden_size)(inputs) + recurrent(prev_state))
    return out, out


def rnn_lm_forward(vocab_size: int, embed_size: int, core_fn: Callable[[], hk.RNNCore],
                   learned_initial_state: bool = False, w_init=None) -> hk.Transformed:
  """A haiku RNN LM ``forward(obs i32[B, T], embed_scale=1.0) -> logits f32[B, T, vocab_size]``.

  Embedding (``V * E``) -> the core ``core_fn()`` unrolled over time -> Linear(V) (``(H + 1) * V``). With
  ``learned_initial_state`` the core's initial state is a parameter (zeros at init, one copy per state leaf,
  shared across the batch). ``embed_scale`` multiplies the embedded inputs (may be traced). ``w_init`` (haiku's
  defaults if None) initializes the embedding table and the output weights.
  """

  def forward(obs, embed_scale=1.0):
    x = hk.Embed(vocab_size, embed_size, w_init=w_init, name="embed")(obs) * embed_scale
    core = core_fn()
    state = core.initial_state(obs.shape[0])
    if learned_initial_state:
      leaves, treedef = jax.tree.flatten(core.initial_state(1))
      learned = [hk.get_parameter(f"initial_state_{i}", leaf.shape, leaf.dtype, init=jnp.zeros)
                 for i, leaf in enumerate(leaves)]
      state = jax.tree.unflatten(treedef, [jnp.tile(v, (obs.shape[0],) + (1,) * (v.ndim - 1)) for v in learned])
    outputs, _ = hk.dynamic_unroll(core, x, state, time_major=False)
    return hk.Linear(vocab_size, w_init=w_init, name="logits")(outputs)

  return hk.without_apply_rng(hk.transform(forward))


def lstm_lm_forward(vocab_size: int, embed_size: int, hidden_size: int) -> hk.Transformed:
  """`rnn_lm_forward` with one haiku LSTM of ``hidden_size`` units (``4*H*(E + H) + 4*H`` parameters)."""
  return rnn_lm_forward(vocab_size, embed_size, lambda: hk.LSTM(hidden_size, name="lstm"))


def self_attention(x: jax.Array, num_heads: int, name: str, causal: bool = True, key_size: Optional[int] = None,
                   mask: Optional[jax.Array] = None, w_init=None, output_size: Optional[int] = None,
                   dropout_rate: float = 0.0, dropout_key: Optional[jax.Array] = None) -> jax.Array:
  """Multi-head self-attention of ``x f32[B, T, d]``: fused QKV projection (``(d + 1) * 3 * heads * key_size``
  parameters; ``key_size`` defaults to ``d / heads``), scaled dot products, an output projection to
  ``output_size`` (default ``d``; ``(heads * key_size + 1) * output_size``). ``causal`` lets position t attend to positions <= t only; ``mask`` (bool,
  broadcastable to ``[B, heads, T, T]``, e.g. ``[B, 1, 1, T]`` for padding) removes more keys. With a
  ``dropout_key``, attention weights are dropped at ``dropout_rate``."""
  batch, length, width = x.shape
  head = width // num_heads if key_size is None else int(key_size)
  qkv = hk.Linear(3 * num_heads * head, w_init=w_init, name=f"{name}_qkv")(x)
  qkv = qkv.reshape(batch, length, 3, num_heads, head)
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(head)
  keep = jnp.ones((length, length), bool) if not causal else jnp.tril(jnp.ones((length, length), bool))
  if mask is not None:
    keep = jnp.logical_and(keep, mask)
  weights = jax.nn.softmax(jnp.where(keep, logits, jnp.finfo(logits.dtype).min), axis=-1)
  if dropout_rate and dropout_key is not None:
    weights = hk.dropout(dropout_key, dropout_rate, weights)
  out = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(batch, length, num_heads * head)
  return hk.Linear(output_size or width, w_init=w_init, name=f"{name}_out")(out)


def causal_self_attention(x: jax.Array, num_heads: int, name: str) -> jax.Array:
  """`self_attention` with ``causal=True`` and the default key size."""
  return self_attention(x, num_heads, name, causal=True)


def transformer_block(x: jax.Array, index: int, num_heads: int, mlp_size: int, act: Activation,
                      causal: bool = True, key_size: Optional[int] = None, mask: Optional[jax.Array] = None,
                      w_init=None, dropout_rate: float = 0.0, dropout_key: Optional[jax.Array] = None,
                      attention_dropout_rate: float = 0.0) -> jax.Array:
  """One pre-LayerNorm block: ``x + attn(LN(x))`` then ``x + W2 act(W1 LN(x))`` (`self_attention`; MLP width
  ``mlp_size``). Dropout of rate ``dropout_rate`` on both residual branches, and ``attention_dropout_rate`` on the
  attention weights, when ``dropout_key`` is given.
  Parameters: ``4*d`` (two LayerNorms) + attention (see `self_attention`) + ``(d + 1)*M + (M + 1)*d``."""
  layer_norm = lambda name: hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name=name)
  drop = lambda h, j: (h if not dropout_rate or dropout_key is None
                       else hk.dropout(jax.random.fold_in(dropout_key, 2 * index + j), dropout_rate, h))
  width = x.shape[-1]
  attn_key = None if dropout_key is None else jax.random.fold_in(jax.random.fold_in(dropout_key, 2 ** 20), index)
  x = x + drop(self_attention(layer_norm(f"ln_attn_{index}")(x), num_heads, f"attn_{index}", causal, key_size,
                              mask, w_init, None, attention_dropout_rate, attn_key), 0)
  h = act(hk.Linear(mlp_size, w_init=w_init, name=f"mlp_in_{index}")(layer_norm(f"ln_mlp_{index}")(x)))
  return x + drop(hk.Linear(width, w_init=w_init, name=f"mlp_out_{index}")(h), 1)


def transformer_lm_forward(vocab_size: int, sequence_length: int, model_size: int = 64, num_layers: int = 2,
                           num_heads: int = 4, mlp_size: Optional[int] = None,
                           activations: Sequence[Activation] = (jax.nn.gelu,), positions: bool = True,
                           key_size: Optional[int] = None, dropout_rate: float = 0.0, w_init=None) -> hk.Transformed:
  """A pre-LayerNorm causal transformer ``forward(obs i32[B, T], activation_index=0, embed_scale=1.0, mask=None,
  dropout_key=None) -> logits``.

  ``T <= sequence_length`` (learned positions; none with ``positions=False``). The MLP activation is
  ``activations[activation_index]``, dispatched with `jax.lax.switch` when there are several; ``embed_scale``
  multiplies the token embeddings. Both may be traced. ``mask`` (bool ``[B, T]``) hides padding keys; dropout
  (``dropout_rate``) is applied when ``dropout_key`` is given; ``key_size`` and ``w_init`` as in `transformer_block`.
  """
  if key_size is None and model_size % num_heads:
    raise ValueError(f"model_size {model_size} must be divisible by num_heads {num_heads}.")
  mlp_size = 4 * model_size if mlp_size is None else mlp_size

  def forward(obs, activation_index=0, embed_scale=1.0, mask=None, dropout_key=None):
    return transformer_lm_logits(obs, vocab_size, sequence_length, model_size, num_layers, num_heads, mlp_size,
                                 select_activation(activations, activation_index), positions, key_size, w_init,
                                 dropout_rate, embed_scale, mask, dropout_key)

  return hk.without_apply_rng(hk.transform(forward))


def transformer_lm_logits(obs, vocab_size, sequence_length, model_size, num_layers, num_heads, mlp_size, act,
                          positions=True, key_size=None, w_init=None, dropout_rate=0.0, embed_scale=1.0, mask=None,
                          dropout_key=None) -> jax.Array:
  """The body of `transformer_lm_forward` (call inside a haiku transform): logits ``f32[B, T, vocab_size]``."""
  x = hk.Embed(vocab_size, model_size, name="embed")(obs) * embed_scale
  if positions:
    table = hk.get_parameter("position_embeddings", [sequence_length, model_size], x.dtype,
                             init=hk.initializers.TruncatedNormal())
    x = x + table[:obs.shape[1]]
  keys_mask = None if mask is None else mask[:, None, None, :]
  for i in range(num_layers):
    x = transformer_block(x, i, num_heads, mlp_size, act, True, key_size, keys_mask, w_init, dropout_rate,
                          dropout_key)
  x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name="ln_final")(x)
  return hk.Linear(vocab_size, name="logits")(x)


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
