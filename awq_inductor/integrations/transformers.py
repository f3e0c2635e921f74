"""Load AWQ / GPTQ int4 checkpoints with transformers 5.x on CPU, straight into :class:`AWQLinear`.

    import awq_inductor
    awq_inductor.patch_transformers()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)

How it hooks transformers (checked against 5.24): ``register_quantizer("awq")`` refuses an existing
name, so :func:`patch_transformers` overwrites the module-level dicts that
``transformers.quantizers.auto.get_hf_quantizer`` reads at call time:

* ``AUTO_QUANTIZER_MAPPING["awq"|"gptq"]`` -> :class:`AwqInductorQuantizer` /
  :class:`GptqInductorQuantizer` (``HfQuantizer`` subclasses; no gptqmodel / autoawq / optimum).
* ``AUTO_QUANTIZATION_CONFIG_MAPPING["awq"]`` -> :class:`AwqConfig` (same class name as the stock
  one, so ``from_pretrained(..., quantization_config=AwqConfig(...))`` keeps working); it maps the
  legacy on-disk tags ``exllama``/``ipex`` to ``gemm`` (same tensors) and rejects ``marlin`` with
  a message that says why.

``PreTrainedModel.from_pretrained`` then calls, in this order:

1. ``validate_environment`` (no-op: nothing to import), ``update_dtype`` (kept);
2. ``preprocess_model`` -> ``_process_model_before_weight_loading(model, checkpoint_files=...)``:
   every ``nn.Linear`` not in ``modules_to_not_convert`` (plus transformers' default skips:
   ``lm_head``, tied and last modules) becomes a :class:`CheckpointInt4Linear` holding buffers
   with the checkpoint's names, shapes and dtypes; ``mlp.act`` of the architectures in
   ``families.FAMILIES`` (``act_scales``) becomes :class:`ScaledActivation`. The safetensors headers are
   read (no tensor data) and checked against those modules: a quantized tensor with no module to
   receive it (per-expert MoE keys, unknown modules), a missing ``qweight``/``qzeros``/
   ``scales``/``bias``, or a tensor of the wrong shape raises :class:`CheckpointError` naming
   the tensors, before anything is loaded;
3. the stock loader copies the tensors into those buffers bit-exactly;
4. ``postprocess_model`` -> ``_process_model_after_weight_loading``: every parameter and
   persistent buffer of the model must carry transformers' ``_is_hf_initialized`` mark (set only
   on loaded tensors); anything left randomly initialised raises :class:`CheckpointError` naming
   it. Then :func:`awq_inductor.transform.convert` builds the :class:`AWQLinear` modules and fuses
   q/k/v and gate/up.

``save_pretrained`` goes through ``get_state_dict_and_metadata``: fused modules are split again and
every :class:`AWQLinear` is packed back into the checkpoint's own format (``formats.pack_awq`` /
``pack_gptq``) under the original module names, so the saved folder loads again like the original
one (through this patch, or through any other AWQ/GPTQ loader).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

import transformers
import transformers.quantizers.auto as qauto
from transformers.quantizers.base import HfQuantizer
from transformers.quantizers.quantizers_utils import should_convert_module
from transformers.utils import quantization_config as qc

from .. import experts_structure, families, formats, transform
from ..nn import CheckpointInt4Linear, CheckpointMoEExperts, ScaledActivation
from ..schemes import scheme_for
from ..transform.model_pass import LM_HEAD_CHOICES

#: The tensors an int4 module of any registered format stores (checkpoint keys ending in these
#: must land in an int4 module).
_QUANT_SUFFIXES = tuple(sorted({t for f in formats.FORMATS.values() for t in f.tensors} | {"g_idx"}))


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """What :func:`patch_transformers` was asked for: the quantizer classes carry it, each quantizer
    (one per ``from_pretrained``) keeps the value it was created with and applies it after loading."""

    act_quant: Optional[str] = None
    lm_head: Optional[str] = "bf16"


class CheckpointError(ValueError):
    """A checkpoint that would load wrongly (missing, unexpected or misshapen tensors)."""


# ---------------------------------------------------------------------------------------------
# Checkpoint inspection
# ---------------------------------------------------------------------------------------------
_ST_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32,
              "I16": torch.int16, "I64": torch.int64, "U8": torch.uint8, "I8": torch.int8, "F64": torch.float64}


_ST_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I16": 2, "I64": 8, "U8": 1, "I8": 1, "F64": 8,
                "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def read_checkpoint_headers(checkpoint_files: Optional[Iterable[str]]
                            ) -> Optional[Dict[str, Tuple[Tuple[int, ...], Optional[torch.dtype], str]]]:
    """{key: (shape, dtype, file)} from the safetensors headers (no tensor data); None if unknown.

    Each file is checked against its header before anything is loaded: a truncated file (header
    or tensor data cut short), an unreadable header, or a tensor whose byte range does not match
    its shape and dtype raises :class:`CheckpointError` naming the file and the tensor."""
    if not checkpoint_files:
        return None
    out = {}
    for path in checkpoint_files:
        if not str(path).endswith(".safetensors"):
            return None
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            n = int.from_bytes(f.read(8), "little")
            if n > size - 8:
                raise CheckpointError(f"{path}: truncated safetensors file: the header needs {n} bytes, "
                                      f"the file has {size - 8} after the length prefix")
            try:
                header = json.loads(f.read(n))
            except ValueError as e:
                raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from e
        data = size - 8 - n
        for k, v in header.items():
            if k == "__metadata__":
                continue
            try:
                shape, dt, (b, e) = tuple(int(x) for x in v["shape"]), str(v["dtype"]), v["data_offsets"]
            except (KeyError, TypeError, ValueError) as err:
                raise CheckpointError(f"{path}: tensor {k}: malformed header entry {v!r}") from err
            numel = 1
            for d in shape:
                numel *= d
            want = numel * _ST_ITEMSIZE.get(dt, 0)
            if dt in _ST_ITEMSIZE and e - b != want:
                raise CheckpointError(f"{path}: tensor {k}: {dt} {list(shape)} needs {want} bytes, "
                                      f"its data_offsets [{b}, {e}] hold {e - b}")
            if e > data:
                raise CheckpointError(f"{path}: truncated safetensors file: tensor {k} needs data bytes "
                                      f"[{b}, {e}), the file holds {data}")
            out[k] = (shape, _ST_DTYPES.get(dt), str(path))
    return out


def read_checkpoint_header(checkpoint_files: Optional[Iterable[str]]) -> Optional[Dict[str, Tuple[Tuple[int, ...], Optional[torch.dtype]]]]:
    """{key: (shape, dtype)} from the safetensors headers (no tensor data); None if unknown."""
    h = read_checkpoint_headers(checkpoint_files)
    return None if h is None else {k: (shape, dt) for k, (shape, dt, _) in h.items()}


def check_loaded_int4_tensors(model) -> None:
    """After the tensors are loaded, before conversion: scales (and float zeros, bias) of every
    int4 placeholder must be finite; raise :class:`CheckpointError` naming file and tensor."""
    for name, mod in model.named_modules():
        if not isinstance(mod, CheckpointInt4Linear):
            continue
        qz = getattr(mod, "qzeros", None)
        names = [mod.checkpoint_format.scales_tensor, "bias"] + (["qzeros"] if qz is not None and qz.is_floating_point() else [])
        for t in names:
            v = getattr(mod, t, None)
            if v is None or v.device.type == "meta":
                continue
            bad = ~torch.isfinite(v)
            if bool(bad.any()):
                ckey, path = getattr(mod, "_awq_ckpt", {}).get(t, (f"{name}.{t}", "the checkpoint"))
                idx = [int(i) for i in bad.nonzero()[0]]
                raise CheckpointError(
                    f"{path}: tensor {ckey}: expected finite values, got {int(bad.sum())} NaN/Inf "
                    f"(first at index {idx}: {v[tuple(idx)].item()})")


def _map_key(key: str, names: set, prefix: str) -> str:
    """Checkpoint key -> model name, allowing a missing or extra base-model prefix."""
    if key in names or not prefix:
        return key
    if key.startswith(prefix + ".") and key[len(prefix) + 1:] in names:
        return key[len(prefix) + 1:]
    if f"{prefix}.{key}" in names:
        return f"{prefix}.{key}"
    return key


def _rename_key(key: str, model_type: Optional[str]) -> str:
    return families.rename_key(key, model_type)


def _insert_moe_placeholders(model, skip, header: Optional[dict], first: str = "qweight") -> None:
    """Each transformers experts module (3-D ``gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I],
    recognised by structure: :func:`awq_inductor.experts_structure.silu_gated_experts`, whatever
    its class is called) whose checkpoint stores int4 experts becomes a
    :class:`CheckpointMoEExperts`: per-expert keys (``experts.0.gate_proj.qweight``: one
    ``nn.Linear`` per expert and projection, names from ``families.expert_names``) or fused 3-D keys
    (``experts.gate_up_proj.qweight`` [E, ...]: one stacked linear per projection); the int4
    placeholder pass then treats them like any linear (shape / missing-tensor checks). Experts in
    ``modules_to_not_convert`` or stored in floating point keep transformers' module. A module with
    3-D ``gate_up_proj`` / ``down_proj`` that computes something else (biases, another activation,
    a transposed layout, another forward) while the checkpoint holds int4 experts for it raises
    :class:`CheckpointError` naming the module, its class and what differs. Without a readable
    header: per-expert keys for the modules that pass the structural test."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    mt = getattr(model.config, "model_type", None)
    keys = None if header is None else {_rename_key(k, mt) for k in header}
    names = families.expert_names(mt)

    def stored(key: str) -> bool:
        return bool({key, f"{prefix}.{key}", key.partition(".")[2]} & keys)

    for name, mod in list(model.named_modules()):
        if not experts_structure.looks_like_experts(mod) or not should_convert_module(name, skip):
            continue
        fused = keys is not None and stored(f"{name}.{families.FUSED_EXPERT_NAMES[0]}.{first}")
        if keys is not None and not fused and not stored(f"{name}.0.{names[0]}.{first}"):
            continue  # experts stored in floating point: transformers loads them as they are
        ok, why = experts_structure.silu_gated_experts(mod)
        if not ok:
            if keys is None:
                continue
            raise CheckpointError(
                f"awq_inductor: {name} ({type(mod).__name__}): the checkpoint stores int4 experts for it, but "
                f"this experts module does not compute sum_k w * down(SiLU(gate) * up) as awq::int4_moe does: "
                f"{'; '.join(why)}. List it in modules_to_not_convert to load it in floating point.")
        E, two_i, H = mod.gate_up_proj.shape
        with torch.device("meta"):
            model.set_submodule(name, CheckpointMoEExperts(E, H, two_i // 2, names, fused=fused))


def _ignored_on_load(model) -> List["re.Pattern"]:
    """transformers' ``_keys_to_ignore_on_load_unexpected`` (e.g. DeepSeek-V3's multi-token-prediction
    layer 61, GLM-4-MoE's 46 / 92): checkpoint keys transformers drops silently."""
    pats = getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []
    return [re.compile(p) for p in pats]


def _fmt_list(items: List[str], limit: int = 12) -> str:
    items = sorted(items)
    s = ", ".join(items[:limit])
    return s + (f", ... ({len(items)} in all)" if len(items) > limit else "")


# ---------------------------------------------------------------------------------------------
# Quantizers and config
# ---------------------------------------------------------------------------------------------
class AwqConfig(qc.AwqConfig):
    """transformers' AwqConfig, accepting the on-disk aliases exllama/ipex (= gemm tensors) and
    llm-awq (= gemv_fast tensors) and refusing marlin clearly."""

    def post_init(self):
        fmt = str(getattr(self.format, "value", self.format)).lower()
        if fmt != "llm-awq":  # (transformers' own config knows llm-awq; the rest is ours)
            self.format = formats.awq_format(fmt).name  # exllama / ipex -> gemm; marlin refused by name
        super().post_init()


class _InductorQuantizer(HfQuantizer):
    """What AWQ and GPTQ loading share: placeholders before loading, header checks, convert after."""

    requires_calibration = True

    def validate_environment(self, *args, **kwargs):
        self.checkpoint_format()  # a config we cannot run is refused before anything is loaded

    def update_device_map(self, device_map):
        return device_map

    def is_serializable(self):
        return True

    @property
    def is_trainable(self):
        return False

    @property
    def is_compileable(self):
        return True

    #: set by :func:`patch_transformers`; each instance keeps the value it was created with
    options = LoadOptions()

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self.options = type(self).options

    def checkpoint_spec(self) -> formats.QuantSpec:
        """The checkpoint's format and group size, recognised by :mod:`awq_inductor.formats` from its quantization config."""
        try:
            return formats.from_quantization_config(self.quantization_config.to_dict())
        except formats.UnsupportedCheckpoint as e:
            raise CheckpointError(f"config.json: {e}") from e

    def checkpoint_format(self) -> formats.CheckpointFormat:
        return self.checkpoint_spec().format

    def _process_model_before_weight_loading(self, model, **kwargs):
        cfg = self.quantization_config
        fmt, group_size = self.checkpoint_spec()
        linears = [(n, type(m)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        # compressed-tensors ignore / targets, AutoRound 16-bit layers / block_name_to_quantize
        config_skips = fmt.skipped_modules(cfg.to_dict(), linears)
        # routers of DeepSeek-V3 / GLM-4-MoE (``mlp.gate``, fp32 with their e_score_correction_bias) are in
        # the strict fp32 list; they are not nn.Linear, but keep anything listed there out of int4 anyway
        fp32 = list(getattr(model, "_keep_in_fp32_modules", None) or []) + \
            list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
        skip = self.get_modules_to_not_convert(model, list(getattr(cfg, "modules_to_not_convert", None) or []) +
                                               config_skips, fp32 or None, add_default_skips=True)
        self.modules_to_not_convert = skip
        headers = read_checkpoint_headers(kwargs.get("checkpoint_files"))
        header = None if headers is None else {k: v[:2] for k, v in headers.items()}
        _insert_moe_placeholders(model, skip, header, fmt.tensors[0])  # qweight / weight_packed
        mt = getattr(model.config, "model_type", None)
        names = set()
        for name, _ in model.named_modules():
            names.add(name)
        prefix = getattr(model, "base_model_prefix", "") or ""
        hkeys = {}
        if header is not None:
            for k, v in header.items():
                mod_name, _, leaf = _rename_key(k, mt).rpartition(".")
                hkeys[f"{_map_key(mod_name, names, prefix)}.{leaf}"] = (k, v)
        placeholders = {}
        for name, mod in list(model.named_modules()):
            if type(mod) is not nn.Linear and not (isinstance(mod, nn.Linear) and type(mod).forward is nn.Linear.forward):
                continue
            if not should_convert_module(name, skip):
                continue
            if header is not None and f"{name}.{fmt.tensors[0]}" not in hkeys and f"{name}.weight" in hkeys:
                continue  # stored unquantized (e.g. a router listed nowhere): load as nn.Linear
            dtypes = {}
            has_gidx = False
            stored_names = fmt.tensors + ("bias", "g_idx")
            if header is not None:
                for t in stored_names:
                    if f"{name}.{t}" in hkeys and hkeys[f"{name}.{t}"][1][1] is not None:
                        dtypes[t] = hkeys[f"{name}.{t}"][1][1]
                has_gidx = f"{name}.g_idx" in hkeys
            with torch.device("meta"):
                ph = CheckpointInt4Linear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                                          group_size=group_size, format=fmt, dtypes=dtypes, g_idx=has_gidx,
                                          num_experts=getattr(mod, "awq_num_experts", None))
            if headers is not None:  # checkpoint key and file of each tensor, for error messages
                ph._awq_ckpt = {t: (hkeys[f"{name}.{t}"][0], headers[hkeys[f"{name}.{t}"][0]][2])
                                for t in stored_names if f"{name}.{t}" in hkeys}
            model.set_submodule(name, ph)
            placeholders[name] = ph
        if not placeholders:
            raise CheckpointError("awq_inductor: no nn.Linear module of this model is quantized "
                                  f"(modules_to_not_convert={sorted(skip)})")
        act_modules = self._wrap_act_scales(model, header is not None and hkeys)
        if header is not None:
            self._check_header(model, hkeys, placeholders, act_modules)

    def _wrap_act_scales(self, model, hkeys):
        act_scales = families.family(getattr(model.config, "model_type", None)).act_scales
        if act_scales is None:
            return set()
        act_name, before_name = act_scales
        wrapped = set()
        for name, mod in list(model.named_modules()):
            act = getattr(mod, act_name, None) if isinstance(mod, nn.Module) else None
            before = getattr(mod, before_name, None)
            if act is None or before is None or not isinstance(act, nn.Module) or isinstance(act, ScaledActivation):
                continue
            full = f"{name}.{act_name}" if name else act_name
            if hkeys and f"{full}.scales" not in hkeys:
                continue  # this checkpoint has no act scales here
            dt = hkeys[f"{full}.scales"][1][1] if hkeys else torch.float16
            with torch.device("meta"):
                mod._modules[act_name] = ScaledActivation(act, before.out_features, dtype=dt or torch.float16)
            wrapped.add(full)
        return wrapped

    def _check_header(self, model, hkeys, placeholders, act_modules):
        problems = []
        unexpected = []
        ignored = _ignored_on_load(model)
        for mkey, (ckey, (shape, dt)) in hkeys.items():
            mod_name, _, leaf = mkey.rpartition(".")
            if leaf not in _QUANT_SUFFIXES or any(p.search(ckey) for p in ignored):
                continue
            if mod_name in placeholders or (leaf == "scales" and mod_name in act_modules):
                continue
            unexpected.append(ckey)
        if unexpected:
            moe = [k for k in unexpected if re.search(r"\.experts\.\d+\.", k)]
            hint = (" Per-expert MoE weights: experts beyond the config's expert count, per-expert names other "
                    f"than {'/'.join(families.expert_names(getattr(model.config, 'model_type', None)))}, or no "
                    "experts module with 3-D gate_up_proj / down_proj at that path." if moe else "")
            raise CheckpointError(
                f"awq_inductor: {len(unexpected)} quantized checkpoint tensors have no int4 linear module to "
                f"load into and would be dropped (leaving layers randomly initialised): {_fmt_list(unexpected)}.{hint}")
        for name, ph in placeholders.items():
            exp = ph.expected_shapes(bias=ph.bias is not None, g_idx=False)
            want_dt = ph.checkpoint_format.dtypes()
            files = getattr(ph, "_awq_ckpt", {})
            for t, (shape, _) in exp.items():
                key = f"{name}.{t}"
                where = f"{files[t][1]}: " if t in files else ""
                if key not in hkeys:
                    problems.append(f"{key}: missing from the checkpoint")
                elif tuple(hkeys[key][1][0]) != tuple(shape):
                    problems.append(f"{where}{hkeys[key][0]}: expected shape {list(shape)} for format "
                                    f"{ph.format!r}, got {list(hkeys[key][1][0])}")
                elif hkeys[key][1][1] not in want_dt[t][1]:
                    problems.append(f"{where}{hkeys[key][0]}: expected dtype {want_dt[t][0]} for format "
                                    f"{ph.format!r}, got {hkeys[key][1][1]}")
        if problems:
            raise CheckpointError("awq_inductor: checkpoint does not match the model "
                                  f"({len(problems)} problems): " + "; ".join(problems[:12]))

    def _process_model_after_weight_loading(self, model, **kwargs):
        check_loaded_int4_tensors(model)
        not_loaded = [k for k, v in model.state_dict(keep_vars=True).items()
                      if not getattr(v, "_is_hf_initialized", False)]
        # tied weights share the tensor of their source, which carries the mark
        if not_loaded:
            raise CheckpointError(
                f"awq_inductor: {len(not_loaded)} model tensors were not found in the checkpoint and would be "
                f"randomly initialised: {_fmt_list(not_loaded)}")
        transform.convert(model, act_quant=self.options.act_quant, lm_head=self.options.lm_head)
        return model

    def get_state_dict_and_metadata(self, model):
        return transform.checkpoint_state_dict(model, self.checkpoint_format().name), {}


class AwqInductorQuantizer(_InductorQuantizer):
    """AWQ (gemm / gemv / gemv_fast) on CPU through awq_inductor."""


class GptqInductorQuantizer(_InductorQuantizer):
    """GPTQ (desc_act=False, checkpoint_format gptq / gptq_v2) on CPU through awq_inductor."""

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        if not self.pre_quantized:
            raise NotImplementedError("awq_inductor: only loading pre-quantized GPTQ checkpoints is supported")



class CompressedTensorsConfig(qc.QuantizationConfigMixin):
    """A compressed-tensors ``quantization_config`` kept as its JSON fields. transformers 5.24's own
    class raises ImportError in ``__init__`` without the compressed-tensors package (while parsing
    config.json, before any quantizer is looked up), so :func:`patch_transformers` maps
    ``compressed-tensors`` to this one; :mod:`awq_inductor.formats.compressed_tensors` reads the fields."""

    def __init__(self, **kwargs):
        kwargs.setdefault("quant_method", "compressed-tensors")
        for k, v in kwargs.items():
            setattr(self, k, v)

    @classmethod
    def from_dict(cls, config_dict, return_unused_kwargs=False, **kwargs):
        config = cls(**{**config_dict, **kwargs})
        return (config, {}) if return_unused_kwargs else config

    def to_dict(self):
        d = dict(vars(self))
        d["quant_method"] = str(getattr(d["quant_method"], "value", d["quant_method"]))
        return d

    def get_loading_attributes(self):
        return {}


#: quant_method -> our quantizer class (a registered format's method without an entry gets the base class)
QUANTIZERS = {"awq": AwqInductorQuantizer, "gptq": GptqInductorQuantizer}


def patch_transformers(act_quant: Optional[str] = None, lm_head: Optional[str] = "bf16") -> None:
    """Make transformers 5.x load AWQ and GPTQ int4 checkpoints on CPU into awq_inductor modules.

    Idempotent. ``act_quant`` picks the scheme every loaded int4 linear (and fused SiLU-gated MLP)
    is packed for: ``None`` (W4A16: bf16/fp16/fp32 activations) or ``"int8"`` (W4A8: activations
    quantized per token to int8 inside the kernel). ``lm_head``: ``"bf16"`` (default: a bf16 head runs
    our GEMV at decode, ``convert``'s default), None (the checkpoint's float head untouched) or
    ``"int8"`` (quantized per output channel at load time, ``convert(model, lm_head="int8")``) or
    ``"int4"`` (quantized per group to int4 at load time, our W4A16 op).
    """
    scheme_for(act_quant)  # validates the choice
    if lm_head not in LM_HEAD_CHOICES:
        raise ValueError(f"lm_head: expected one of {LM_HEAD_CHOICES}, got {lm_head!r}")
    major = int(transformers.__version__.split(".")[0])
    if major != 5:
        raise RuntimeError(f"awq_inductor needs transformers 5.x, found {transformers.__version__}")
    for method in formats.quant_methods():  # every quant_method of a registered checkpoint format
        qauto.AUTO_QUANTIZER_MAPPING[method] = QUANTIZERS.get(method, _InductorQuantizer)
    qauto.AUTO_QUANTIZATION_CONFIG_MAPPING["awq"] = AwqConfig
    qauto.AUTO_QUANTIZATION_CONFIG_MAPPING["compressed-tensors"] = CompressedTensorsConfig
    _InductorQuantizer.options = LoadOptions(act_quant, lm_head)
