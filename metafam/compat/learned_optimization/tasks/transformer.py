"""`learned_optimization.tasks.transformer`: the reference's transformer modules over metafam's blocks.

`Transformer` (token embedding without positions -> ``num_layers`` pre-LayerNorm causal blocks with 32-wide heads,
a 4x GELU MLP and ``VarianceScaling(2 / num_layers)`` weights -> LayerNorm -> Linear(vocab)) is
`metafam.tasks.language.transformer_lm_logits`; `CausalSelfAttention` is `metafam.tasks.language.self_attention`
(causal; self-attention only: ``key``/``value`` other than the query raise); `DenseBlock` is the MLP of a block.
Parameters of `Transformer` with width d, L layers, H heads, vocabulary V: ``V*d + L*(4*d + (d + 1)*96*H +
(32*H + 1)*d + (d + 1)*4d + (4d + 1)*d) + 2*d + (d + 1)*V``.
"""

from __future__ import annotations

from typing import Optional

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.tasks.language import self_attention, transformer_lm_logits

__all__ = ["CausalSelfAttention", "DenseBlock", "Transformer"]


class CausalSelfAttention(hk.Module):
  """Causal multi-head self-attention of ``query f32[B, T, D]`` to ``model_size`` (default ``heads * key_size``)."""

  def __init__(self, num_heads: int, key_size: int, w_init: Optional[hk.initializers.Initializer] = None,
               value_size: Optional[int] = None, model_size: Optional[int] = None, name: Optional[str] = None):
    super().__init__(name=name)
    if value_size not in (None, key_size):
      raise ValueError(f"value_size must equal key_size ({key_size}) in metafam's fused attention, got {value_size}.")
    self.num_heads, self.key_size = num_heads, key_size
    self.model_size = model_size or key_size * num_heads
    self.w_init = w_init or hk.initializers.VarianceScaling(1.0)

  def __call__(self, query: jax.Array, key: Optional[jax.Array] = None, value: Optional[jax.Array] = None,
               mask: Optional[jax.Array] = None) -> jax.Array:
    if query.ndim != 3:
      raise ValueError(f"query must be [B, T, D], got shape {query.shape}.")
    if (key is not None and key is not query) or (value is not None and value is not query):
      raise ValueError("CausalSelfAttention attends a sequence to itself: pass key=value=None (or the query).")
    return self_attention(query, self.num_heads, "attn", True, self.key_size,
                          None if mask is None else mask.astype(bool), self.w_init, self.model_size)


class DenseBlock(hk.Module):
  """``Linear(widening_factor * D) -> GELU -> Linear(D)``."""

  def __init__(self, widening_factor: int = 4, w_init=None, name: Optional[str] = None):
    super().__init__(name=name)
    self._widening_factor, self._w_init = widening_factor, w_init

  def __call__(self, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(hk.Linear(self._widening_factor * x.shape[-1], w_init=self._w_init)(x))
    return hk.Linear(x.shape[-1], w_init=self._w_init)(h)


class Transformer(hk.Module):
  """``Transformer(...)(tokens i32[B, T], mask bool[B, T] or None, is_training) -> logits f32[B, T, vocab]``;
  dropout (``dropout_rate``, haiku's rng) only when training."""

  def __init__(self, num_heads: int, num_layers: int, d_model: int, vocab_size: int, dropout_rate: float,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._num_heads, self._num_layers, self._d_model = num_heads, num_layers, d_model
    self._vocab_size, self._dropout_rate = vocab_size, dropout_rate

  def __call__(self, h: jax.Array, mask: Optional[jax.Array], is_training: bool) -> jax.Array:
    rate = self._dropout_rate if is_training else 0.0
    return transformer_lm_logits(
        h, self._vocab_size, h.shape[1], self._d_model, self._num_layers, self._num_heads, 4 * self._d_model,
        jax.nn.gelu, positions=False, key_size=32, w_init=hk.initializers.VarianceScaling(2.0 / self._num_layers),
        dropout_rate=rate, mask=None if mask is None else mask.astype(bool),
        dropout_key=hk.next_rng_key() if rate else None)
