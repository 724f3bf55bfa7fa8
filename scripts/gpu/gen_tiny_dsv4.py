#!/usr/bin/env python3
"""Write a tiny random-weight DeepSeek-V4 checkpoint that SGLang 0.5.17's
``srt/models/deepseek_v4.py`` loads with its real weight loader.

    python3 scripts/gpu/gen_tiny_dsv4.py OUT_DIR [--device cuda] [--layers 4] [--hidden 1024]
        [--vocab 65600] [--max-pos 131072] [--experts 16] [--topk 4]

Every layer type 0.5.17 has on SM90: compress ratios 0 (sliding window only), 4 (with the C4
indexer) and 128 (0.5.17 has no ratio-1/2 "low-ratio sources": MQALayer asserts
``compress_ratio in (0, 4, 128)``), mHC hyper-connections (hc_mult 4), MoE with the real
routing (hash routing on the first ``num_hash_layers`` layers via ``tid2eid``, then ungrouped
``sqrtsoftplus`` noaux_tc top-k with a correction bias) plus one shared expert.

Weight format, as the 0.5.17 loader expects it (FP8 e4m3 with 128x128 block scales,
``weight_scale_inv`` float32; ``quantization_config.quant_method = fp8``):
  * FP8 + scale: attention wq_a / wkv (fused to wqkv_a at load), wq_b, wo_a (the default
    SGLANG_OPT_FP8_WO_A_GEMM=1 needs wo_a FP8: deep_gemm.fp8_einsum), wo_b, the indexer's wq_b,
    routed experts (F8_E4M3 experts => the loader's probe picks is_fp4_experts=False, the
    "converted FP8" layout; the mxfp4 layout is the other option) and the shared expert.
  * bf16: embeddings, lm_head, the router gate, compressor wkv/wgate (fused to wkv_gate),
    indexer weights_proj, norms.
  * fp32: attn_sink, compressor ape + norm, hc_* (mHC) parameters, e_score_correction_bias.
  * int32: tid2eid (hash-routing table).
Names (``--naming native``, the default) are DeepSeek's own checkpoint layout, as the
published V4 checkpoints use it and ``DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format``
maps it: ``embed.weight``, ``layers.N.attn.wq_a.weight`` + ``.scale``, ``layers.N.ffn.experts.E.w1``,
``layers.N.ffn.gate.bias``, ``layers.N.attn_norm``, ``head.weight`` ...  This matters on SM90:
there SGLang turns SGLANG_OPT_FP8_WO_A_GEMM off (it needs sm100 or an explicit opt-in) and
dequantizes wo_a to bf16 at load, matching only ``.wo_a.scale`` (a ``.wo_a.weight_scale_inv``
is dropped with "not found in params_dict" and wo_a loads unscaled).  ``--naming sglang`` writes
SGLang's internal names instead (``model.layers.N.self_attn.wq_a.weight_scale_inv`` ...).

Head geometry is the real model's (the kernels fix it): 64 heads of 512 (448 nope + 64 rope;
FlashMLA's sparse FP8 decode specializes h_q in {64, 128}), indexer 64 x 128, top-k 512, window
128.  ``--device cuda`` draws the tensors on the GPU (seconds); CPU works too (slower).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

FP8 = torch.float8_e4m3fn
BLOCK = 128


def build_config(a: argparse.Namespace) -> dict:
    ratios = [0, 4, 128, 4, 128, 4, 0, 128][: a.layers] if a.layers <= 8 else \
        ([0] + [4, 128] * a.layers)[: a.layers]
    if a.ratios:
        ratios = [int(x) for x in a.ratios.split(",")]
        assert len(ratios) == a.layers and set(ratios) <= {0, 4, 128}, ratios
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "torch_dtype": "bfloat16",
        "vocab_size": a.vocab,
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 448,
        "v_head_dim": 512,
        "q_lora_rank": a.q_lora,
        "kv_lora_rank": 512,
        "o_lora_rank": a.o_lora,
        "o_groups": 8,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 512,
        "sliding_window": 128,
        "window_size": 128,
        "compress_ratios": ratios,
        "compress_rope_theta": 160000,
        "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": a.max_pos / 32768 if a.max_pos > 32768 else 1.0,
                         "original_max_position_embeddings": 32768,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": a.max_pos,
        "n_routed_experts": a.experts,
        "num_experts_per_tok": a.topk,
        "n_shared_experts": 1,
        "moe_intermediate_size": a.moe_inter,
        "intermediate_size": a.moe_inter * 2,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        # deepseek_v2.DeepseekV2MoE reads num_hash_layers; the sglang config class says n_hash_layers.
        "num_hash_layers": a.hash_layers,
        "n_hash_layers": a.hash_layers,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "initializer_range": 0.02,
        "attention_bias": False,
        "use_cache": True,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK]},
    }


class Writer:
    def __init__(self, device: str, seed: int) -> None:
        self.dev = torch.device(device)
        self.g = torch.Generator(device=self.dev)
        self.g.manual_seed(seed)
        self.t: dict[str, torch.Tensor] = {}

    def randn(self, *shape: int, std: float = 0.02, dtype=torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.g, device=self.dev) * std).to(dtype)

    def bf16(self, name: str, *shape: int, std: float = 0.02) -> None:
        self.t[name] = self.randn(*shape, std=std)

    def f32(self, name: str, *shape: int, std: float = 0.02) -> None:
        self.t[name] = self.randn(*shape, std=std, dtype=torch.float32)

    def ones(self, name: str, n: int, dtype=torch.bfloat16) -> None:
        self.t[name] = torch.ones(n, dtype=dtype, device=self.dev)

    def fp8(self, prefix: str, out: int, inp: int, std: float = 0.02, lead: tuple = ()) -> None:
        """FP8 e4m3 weight [*lead, out, inp] + float32 block scales weight_scale_inv
        [*lead, ceil(out/128), ceil(inp/128)]: dequantized weight ~ N(0, std)."""
        q = torch.randn(*lead, out, inp, generator=self.g, device=self.dev).clamp_(-4, 4)
        self.t[prefix + ".weight"] = q.to(FP8)
        s = (-(-out // BLOCK), -(-inp // BLOCK))
        self.t[prefix + ".weight_scale_inv"] = torch.full((*lead, *s), std, dtype=torch.float32,
                                                          device=self.dev)


def build_weights(cfg: dict, w: Writer) -> None:
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, hd, rope = cfg["num_attention_heads"], cfg["head_dim"], cfg["qk_rope_head_dim"]
    ql, G, R = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    ih, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
    E, K, I = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]  # noqa: E741 (the paper's names)
    hc = cfg["hc_mult"]
    mix_hc, hc_dim = (2 + hc) * hc, hc * H
    assert rope == 64 and hd == 512 and nh in (64, 128)
    for d in (H, ql, R, I):
        assert d % BLOCK == 0, f"{d} is not a multiple of {BLOCK}"

    w.bf16("model.embed_tokens.weight", V, H, std=1.0)
    w.bf16("lm_head.weight", V, H)
    w.ones("model.norm.weight", H)
    w.f32("model.hc_head_fn", hc, hc_dim)
    w.t["model.hc_head_base"] = torch.zeros(hc, dtype=torch.float32, device=w.dev)
    w.t["model.hc_head_scale"] = torch.ones(1, dtype=torch.float32, device=w.dev)

    def compressor(p: str, ratio: int, head_dim: int) -> None:
        coff = 2 if ratio == 4 else 1
        w.f32(p + ".ape", ratio, coff * head_dim)
        w.bf16(p + ".wkv.weight", coff * head_dim, H)
        w.bf16(p + ".wgate.weight", coff * head_dim, H)
        w.ones(p + ".norm.weight", head_dim, dtype=torch.float32)

    for L, ratio in enumerate(cfg["compress_ratios"][: cfg["num_hidden_layers"]]):
        p = f"model.layers.{L}"
        a = p + ".self_attn"
        w.t[a + ".attn_sink"] = torch.zeros(nh, dtype=torch.float32, device=w.dev)
        w.fp8(a + ".wq_a", ql, H)
        w.fp8(a + ".wkv", hd, H)
        w.ones(a + ".q_norm.weight", ql)
        w.ones(a + ".kv_norm.weight", hd)
        w.fp8(a + ".wq_b", nh * hd, ql)
        w.fp8(a + ".wo_a", G * R, nh * hd // G)
        w.fp8(a + ".wo_b", H, G * R)
        if ratio in (4, 128):
            compressor(a + ".compressor", ratio, hd)
        if ratio == 4:
            w.fp8(a + ".indexer.wq_b", ih * ihd, ql)
            w.bf16(a + ".indexer.weights_proj.weight", ih, H)
            compressor(a + ".indexer.compressor", 4, ihd)
        w.ones(p + ".input_layernorm.weight", H)
        w.ones(p + ".post_attention_layernorm.weight", H)
        for s in ("attn", "ffn"):
            w.f32(f"{p}.hc_{s}_fn", mix_hc, hc_dim)
            w.t[f"{p}.hc_{s}_base"] = torch.zeros(mix_hc, dtype=torch.float32, device=w.dev)
            w.t[f"{p}.hc_{s}_scale"] = torch.ones(3, dtype=torch.float32, device=w.dev)
        m = p + ".mlp"
        w.bf16(m + ".gate.weight", E, H)
        if L < cfg["num_hash_layers"]:
            tok = torch.arange(V, device=w.dev, dtype=torch.int64)[:, None]
            w.t[m + ".gate.tid2eid"] = ((tok * 7 + torch.arange(K, device=w.dev)[None, :] * (E // K or 1))
                                        % E).to(torch.int32)
        else:
            w.t[m + ".gate.e_score_correction_bias"] = torch.zeros(E, dtype=torch.float32, device=w.dev)
        for e in range(E):
            w.fp8(f"{m}.experts.{e}.gate_proj", I, H)
            w.fp8(f"{m}.experts.{e}.up_proj", I, H)
            w.fp8(f"{m}.experts.{e}.down_proj", H, I)
        w.fp8(m + ".shared_experts.gate_proj", I, H)
        w.fp8(m + ".shared_experts.up_proj", I, H)
        w.fp8(m + ".shared_experts.down_proj", H, I)


NATIVE_SUBS = [(".self_attn.", ".attn."), (".mlp.", ".ffn."), (".input_layernorm.", ".attn_norm."),
               (".post_attention_layernorm.", ".ffn_norm."), (".gate.e_score_correction_bias", ".gate.bias"),
               (".gate_proj.", ".w1."), (".down_proj.", ".w2."), (".up_proj.", ".w3.")]


def native_name(name: str) -> str:
    """SGLang-internal name -> DeepSeek's checkpoint name (the inverse of the loader's remap)."""
    top = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
           "model.norm.weight": "norm.weight"}
    if name in top:
        return top[name]
    name = name.removeprefix("model.")
    for a, b in NATIVE_SUBS:
        name = name.replace(a, b)
    if name.endswith(".weight_scale_inv"):
        name = name.removesuffix(".weight_scale_inv") + ".scale"
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ratios", default="", help="comma list, one per layer, of 0/4/128")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--q-lora", type=int, default=256)
    ap.add_argument("--o-lora", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=65600)
    ap.add_argument("--max-pos", type=int, default=131072)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--moe-inter", type=int, default=256)
    ap.add_argument("--hash-layers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--naming", choices=["native", "sglang"], default="native")
    a = ap.parse_args()
    t0 = time.time()
    from safetensors.torch import save_file

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = build_config(a)
    w = Writer(a.device, a.seed)
    build_weights(cfg, w)
    rename = native_name if a.naming == "native" else (lambda n: n)
    tensors = {rename(k): v.contiguous().cpu() for k, v in w.t.items()}
    assert len(tensors) == len(w.t)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
         "do_sample": True, "temperature": 1.0, "top_p": 1.0}, indent=2))
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    print(json.dumps({"out": str(out), "tensors": len(tensors), "bytes": nbytes,
                      "compress_ratios": cfg["compress_ratios"], "device": a.device, "naming": a.naming,
                      "seconds": round(time.time() - t0, 2)}))


if __name__ == "__main__":
    main()
