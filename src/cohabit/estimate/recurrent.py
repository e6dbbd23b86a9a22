"""Per-sequence state of Mamba and linear-attention layers (hybrid models such as Qwen3-Next,
Jamba, Granite-4): read from config.json by `shape.py`, sized per rank by `kv.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cohabit.estimate.limits import opt_int, ratio


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearStateShape:
    """Per-sequence state of one linear-attention / Mamba layer (tp = 1), in elements: the
    causal-conv window `conv_elements` and the recurrent (SSM) state `ssm_elements`. Both are
    split over tensor-parallel ranks with the heads.

    Qwen3-Next (gated delta net, 32 value heads × 128 × 128, 16 key heads, conv kernel 4):
    conv 3 × (2 × 16 × 128 + 32 × 128) = 24,576; state 32 × 128 × 128 = 524,288.
    """

    conv_elements: int
    ssm_elements: int


def linear_state_from_config(
    cfg: Mapping[str, Any], *, hidden_size: int
) -> LinearStateShape | None:
    """The per-sequence state of linear-attention / Mamba layers, from the keys vLLM reads:
    Qwen3-Next's `linear_*`, Mamba2's `mamba_n_heads` / `mamba_d_head` / `ssm_state_size` /
    `mamba_n_groups`, Mamba1 / Jamba's `mamba_expand` × hidden channels of `mamba_d_state`."""
    v_heads = opt_int(cfg, "linear_num_value_heads")
    if v_heads:
        k_heads = opt_int(cfg, "linear_num_key_heads") or v_heads
        dk = opt_int(cfg, "linear_key_head_dim") or 128
        dv = opt_int(cfg, "linear_value_head_dim") or 128
        kernel = opt_int(cfg, "linear_conv_kernel_dim") or 4
        return LinearStateShape(
            conv_elements=(kernel - 1) * (2 * k_heads * dk + v_heads * dv),
            ssm_elements=v_heads * dk * dv,
        )
    d_state = opt_int(cfg, "ssm_state_size", "mamba_d_state", "state_size", "d_state")
    if not d_state:
        return None
    kernel = opt_int(cfg, "mamba_d_conv", "conv_kernel", "d_conv") or 4
    heads = opt_int(cfg, "mamba_n_heads")
    if heads:
        head_dim = opt_int(cfg, "mamba_d_head", "mamba_head_dim") or 64
        groups = opt_int(cfg, "mamba_n_groups", "n_groups") or 1
        width = heads * head_dim
        return LinearStateShape(
            conv_elements=(kernel - 1) * (width + 2 * groups * d_state),
            ssm_elements=width * d_state,
        )
    expand = cfg.get("mamba_expand", cfg.get("expand", 2))
    width = opt_int(cfg, "mamba_intermediate_size") or int(hidden_size * ratio(expand, 2))
    return LinearStateShape(conv_elements=(kernel - 1) * width, ssm_elements=width * d_state)
