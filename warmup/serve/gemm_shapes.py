"""The dense GEMMs of a loaded model, each as the model's forward runs it: what the GEMM sweep
(:mod:`warmup.serve.gemm_sweep`) calls at every row count.

A GEMM's cuBLAS kernel depends on more than the weight's shape: the output's dtype and whether
the product is one GEMM or a batch of them pick other kernels.  So each shape runs through the
call the model makes:

* an unquantized linear layer through its own ``quant_method.apply`` (the backend SGLang would
  use, with the bias its forward would pass);
* an ``lm_head`` (at any depth, tied or not) through ``torch.matmul(x, W.T)``, as the logits
  processor does;
* a layer whose weight the model's own code multiplies instead of calling the layer
  (:data:`CALL_SITES`) through that code: DeepSeek-V4's compressors compute their KV scores
  with ``linear_bf16_fp32`` (bf16 in, fp32 out), and its attention multiplies ``wo_a`` as a
  grouped ``einsum``.  Swept through ``apply``, those layers would load kernels their forward
  never runs, and leave the ones it does run to the first requests;
* a router gate that owns its weight (:data:`GATES`: DeepSeek's ``MoEGate``, bf16 in, fp32
  out) through its own ``forward``, which picks SGLang's kernel for the row count.

A call site applies where its owner module has what that code reads; otherwise the layer is
swept as a linear layer, as before the site was known.  Quantized layers (FP8, DeepGEMM) are
not cuBLAS's and are never listed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

_FLOATS = ("torch.bfloat16", "torch.float16", "torch.float32")


@dataclass
class Shape:
    """One distinct GEMM of the model: how to run it at ``rows`` rows (its input is ``rows`` x
    ``in_features`` of ``dtype``; its output ``rows`` x ``out_features`` of ``out_dtype``)."""

    key: tuple
    label: str
    in_features: int
    out_features: int
    dtype: Any
    run: Callable[[Any], Any]
    max_rows: int = 0
    #: the only row counts to run up to ``learned_up_to`` (the load rows a start from the same
    #: caches learned; every row count above); None: every row count the sweep visits
    rows: frozenset[int] | None = None
    learned_up_to: int = 0
    #: the output's dtype where it is not the input's (a bf16 GEMM with an fp32 output)
    out_dtype: Any = None

    @property
    def key_text(self) -> str:
        """The shape's key as a record names it: what, weight shape, dtype, bias, backend."""
        return " ".join("x".join(map(str, k)) if isinstance(k, tuple) else str(k)
                        for k in self.key)

    @property
    def itemsize(self) -> int:
        """The bytes of one input element."""
        return self.dtype.itemsize

    @property
    def out_itemsize(self) -> int:
        """The bytes of one output element."""
        return (self.out_dtype or self.dtype).itemsize

    def row_bytes(self) -> int:
        """The bytes one row takes in the input and the output together."""
        return self.in_features * self.itemsize + self.out_features * self.out_itemsize


@dataclass(frozen=True)
class CallSite:
    """A GEMM the model's code runs on a linear layer's weight instead of calling the layer:
    the owner's attribute ``layer`` names the layer, ``needs`` what else the owner must have,
    ``build`` makes the shape's size and call from the owner and the weight (None where the
    owner does not hold what the code reads)."""

    what: str
    layer: str
    needs: tuple[str, ...]
    build: Callable[[Any, Any], tuple[int, int, Any, Callable[[Any], Any]] | None]


def _kv_score(owner: Any, w: Any) -> tuple[int, int, Any, Callable[[Any], Any]] | None:
    """DeepSeek-V4's compressor: ``_compute_wkv_gate(x)`` (SGLang 0.5.22 and later), else its
    module's ``linear_bf16_fp32(x, wkv_gate.weight)`` (0.5.17); an fp32 output."""
    import torch

    method = getattr(owner, "_compute_wkv_gate", None)
    if callable(method):
        run: Callable[[Any], Any] = method
    else:
        gemm = getattr(sys.modules.get(type(owner).__module__), "linear_bf16_fp32", None)
        if not callable(gemm):
            return None

        def run(x, gemm=gemm, w=w):
            return gemm(x, w)
    return w.shape[1], w.shape[0], torch.float32, run


def _grouped_wo_a(owner: Any, w: Any) -> tuple[int, int, Any, Callable[[Any], Any]] | None:
    """DeepSeek-V4's attention output: ``einsum("tgd,grd->tgr", o, wo_a)`` with ``o`` the
    tokens' ``n_local_groups`` groups of ``D`` and ``wo_a`` viewed as ``[G, o_lora_rank, D]``
    (SGLang's prefill path on Hopper, 0.5.17 to 0.5.23)."""
    import torch

    groups, rank = getattr(owner, "n_local_groups", None), getattr(owner, "o_lora_rank", None)
    if not (isinstance(groups, int) and isinstance(rank, int) and groups > 0 and rank > 0
            and w.shape[0] == groups * rank):
        return None
    width = w.shape[1]

    def run(x, w=w):
        return torch.einsum("tgd,grd->tgr", x.view(x.shape[0], groups, width),
                            w.view(groups, rank, width))
    return groups * width, groups * rank, None, run


#: the GEMMs SGLang's model code runs on a layer's weight (each is checked against the source of
#: the releases the project supports: tests/warmup/serve/test_gemm_shapes.py)
CALL_SITES = (
    CallSite("kv_score", "wkv_gate", ("compute_kv_score",), _kv_score),
    CallSite("grouped_einsum", "wo_a", ("n_local_groups", "o_lora_rank"), _grouped_wo_a),
)


def _is_unquantized(module: Any) -> bool:
    method = getattr(module, "quant_method", None)
    return method is not None and type(method).__name__ == "UnquantizedLinearMethod"


def _floating_weight(module: Any) -> Any:
    w = getattr(module, "weight", None)
    if w is None or getattr(w, "dim", lambda: 0)() != 2 or str(w.dtype) not in _FLOATS:
        return None
    return w


def _tp_rank(module: Any) -> int:
    rank = getattr(module, "tp_rank", None)
    if isinstance(rank, int):
        return rank
    group = getattr(module, "tp_group", None)
    if group is not None:
        try:
            from sglang.srt.layers.linear import get_group_rank_size

            return int(get_group_rank_size(group)[0])
        except Exception:  # noqa: BLE001 - an SGLang without it: rank 0's bias
            pass
    return 0


def _bias(module: Any) -> Any:
    """The bias SGLang's forward hands to the GEMM: none with ``skip_bias_add``, and none on a
    row-parallel layer's ranks above 0 (rank 0 adds it once); a GEMM with a bias is another
    cuBLAS kernel."""
    bias = getattr(module, "bias", None)
    if bias is None or getattr(module, "skip_bias_add", False):
        return None
    if type(module).__name__ == "RowParallelLinear" and _tp_rank(module) > 0:
        return None
    return bias


def _quantized_head(head: Any) -> bool:
    method = getattr(head, "quant_method", None)
    return method is not None and type(method).__name__ not in ("UnquantizedEmbeddingMethod",
                                                                "UnquantizedLinearMethod")


def _site_shapes(name: str, owner: Any, device_type: str) -> list[tuple[Any, Shape]]:
    """The call sites ``owner`` holds, each with the layer it takes the weight of."""
    found = []
    for site in CALL_SITES:
        layer = getattr(owner, site.layer, None)
        if layer is None or not all(hasattr(owner, n) for n in site.needs) \
                or not _is_unquantized(layer):
            continue
        w = _floating_weight(layer)
        if w is None or w.device.type != device_type:
            continue
        built = site.build(owner, w)
        if built is None:
            continue
        in_f, out_f, out_dtype, run = built
        key = (site.what, tuple(w.shape), str(w.dtype), False, type(owner).__qualname__)
        label = f"{name}.{site.layer} {tuple(w.shape)}".lstrip(".")
        found.append((layer, Shape(key, label, in_f, out_f, w.dtype, run, out_dtype=out_dtype)))
    return found


#: the router gates that own their weight and whose ``forward(hidden_states)`` is the GEMM
#: (SGLang's DeepSeek-V2/V3/V4 ``MoEGate``: bf16 in, fp32 out, cuBLAS above its small-batch
#: kernel's rows)
GATES = ("MoEGate",)


def _one_argument(forward: Any) -> bool:
    """Whether ``forward`` can be called with the hidden states alone."""
    import inspect

    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return bool(positional) and all(p.default is not p.empty for p in params[1:]
                                    if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def _gate_shape(name: str, module: Any, device_type: str) -> Shape | None:
    """``module`` as a router gate of :data:`GATES`, run through its own ``forward``."""
    import torch

    if type(module).__name__ not in GATES or getattr(module, "quant_method", None) is not None:
        return None
    w = _floating_weight(module)
    if w is None or w.device.type != device_type or not _one_argument(module.forward):
        return None
    key = ("router_gate", tuple(w.shape), str(w.dtype), False, type(module).__qualname__)

    def run(x, forward=module.forward):
        return forward(x)
    return Shape(key, f"{name} {tuple(w.shape)}", w.shape[1], w.shape[0], w.dtype, run,
                 out_dtype=torch.float32)


def _layer_shape(name: str, module: Any, device_type: str, lm_head: bool) -> Shape | None:
    """``module`` as a linear layer or an LM head, if it is one this sweep runs."""
    import torch

    w = _floating_weight(module)
    if w is None or w.device.type != device_type:
        return None
    if _is_unquantized(module):
        bias = _bias(module)
        key = ("linear", tuple(w.shape), str(w.dtype), bias is not None,
               type(module.quant_method).__qualname__)

        def run_linear(x, module=module, bias=bias):
            return module.quant_method.apply(module, x, bias)
        run: Callable[[Any], Any] = run_linear
    elif lm_head and name.rpartition(".")[2] == "lm_head" and not _quantized_head(module):
        key = ("linear", tuple(w.shape), str(w.dtype), False, "UnquantizedLinearMethod")

        def run_head(x, w=w):
            return torch.matmul(x, w.T)
        run = run_head
    else:
        return None
    return Shape(key, f"{name} {tuple(w.shape)}", w.shape[1], w.shape[0], w.dtype, run)


def model_shapes(model: Any, device_type: str = "cuda", *, lm_head: bool = True) -> list[Shape]:
    """The distinct dense GEMMs of ``model`` on ``device_type``, each run as the model's forward
    runs it (the module's docstring)."""
    shapes: dict[tuple, Shape] = {}
    taken: set[int] = set()  # layers a call site runs: not also swept as linear layers
    # every name of a shared module: a tied LM head is also ``model.embed_tokens``; an owner
    # comes before its layers
    for name, module in model.named_modules(remove_duplicate=False):
        for layer, site in _site_shapes(name, module, device_type):
            taken.add(id(layer))
            shapes.setdefault(site.key, site)
        if id(module) in taken:
            continue
        shape = _gate_shape(name, module, device_type) \
            or _layer_shape(name, module, device_type, lm_head)
        if shape is not None:
            shapes.setdefault(shape.key, shape)
    return list(shapes.values())
