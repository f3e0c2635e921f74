"""The custom ops, one home: importing this package defines every ``torch.ops.awq.*`` op.

    int4_mm      awq::int4_mm*        the int4 GEMMs (one per entry of schemes.OPS)
    moe          awq::int4_moe*       all experts of a sparse-MoE layer (schemes.MOE_OPS)
    head_bf16    awq::bf16_linear     the bf16 lm_head's GEMV at decode
    head_int8    awq::int8_linear     the opt-in int8 lm_head
    attention    awq::decode_attention, awq::prefill_attention
    oracles      fp32 references of the ops (tests only, never the user path)
"""
from . import attention, head_bf16, head_int8, int4_mm, moe  # noqa: F401  (they define torch.ops.awq.*)
