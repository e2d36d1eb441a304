#!/usr/bin/env python3
"""make_fixtures.py — golden fixtures for lmserve's model runtime, made with
Hugging Face transformers (the reference implementation) in float32.

For each small random configuration below it builds transformers' own
Gemma3ForCausalLM / Gemma4ForCausalLM, re-initialises the weights so that
activations are far from zero, saves the checkpoint in Hugging Face layout,
and records:

  tests/fixtures/models/NAME/config.json            (save_pretrained)
  tests/fixtures/models/NAME/model.safetensors      (float32 weights)
  tests/fixtures/models/NAME/golden.safetensors     input_ids [T] (I64),
                                                    logits [T, V] (F32, every
                                                    prompt position, after the
                                                    final softcap),
                                                    greedy [N] (I64, greedy
                                                    continuation, no eos stop)

The C test tests/unit/worker/test-wk-golden.c compares lmserve's forward pass
with these (max |logit error| < 1e-3 of the logit range; greedy tokens exact;
prompt in one chunk, in several, and token by token) and skips loudly when
they are absent.

gemma4-assistant is the MTP assistant (Gemma4AssistantForCausalLM, ordered
embeddings) with its own small target:

  tests/fixtures/models/gemma4-assistant/target/    the target (Gemma4ForCausalLM,
                                                    window 64), as above
  tests/fixtures/models/gemma4-assistant/config.json, model.safetensors
  tests/fixtures/models/gemma4-assistant/golden.safetensors
      input_ids [T] (I64)         the prompt (T < window: no window cut, so the
                                  draft's sliding layers see every position)
      target_logits [V] (F32)     the target's logits at T-1
      h_in [B] (F32)              the target's final-normed hidden state at T-1
      tokens_in [K] (I64)         the token entering each draft step: the
                                  target's greedy token, then each draft
      logits [K, V] (F32)         the assistant's logits per step (ordered
                                  embeddings: the candidates' logits, every
                                  other entry the row minimum)
      h_out [K, B] (F32)          post_projection output per step (the next
                                  step's h_in)
      drafts [K] (I64)            argmax of each step's logits

Every draft step runs at position T-1 with the target's shared K/V (the last
non-shared sliding and full layers, from return_shared_kv_states) and
inputs_embeds = [target embed_tokens(token) (scaled), h_in];
tests/unit/worker/test-wk-draft-golden.c compares lmserve's wk_draft_step.

Needs torch and transformers (5.x, which has Gemma 4). Run from the source
tree root:   python3 tests/reference/make_fixtures.py [--out tests/fixtures/models]
"""
import argparse
import json
from collections.abc import Mapping
import math
import os
import sys

import torch
from safetensors.torch import save_file

VOCAB = 512
PROMPT_LEN = 48      # crosses the 16-token sliding window of every config
GREEDY_TOKENS = 16
SEED = 1234


def gemma3_config():
    from transformers import Gemma3TextConfig

    layer_types = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(6)]
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=16, layer_types=layer_types, max_position_embeddings=512,
        rms_norm_eps=1e-6, final_logit_softcapping=None, attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )
    try:  # transformers 5: RoPE per layer type
        return Gemma3TextConfig(
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            **common)
    except TypeError:  # older generation of fields
        return Gemma3TextConfig(rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                rope_scaling={"rope_type": "linear", "factor": 2.0}, **common)


def gemma4_config(moe, window=16, large=False):
    """E-series features (per-layer inputs, KV-shared layers, double-wide MLP), or
    with large the 26B's and 31B's: none of those, K as V on every full layer."""
    from transformers import Gemma4TextConfig

    layer_types = ["sliding_attention", "sliding_attention", "full_attention",
                   "sliding_attention", "sliding_attention", "full_attention"]
    extra = {}
    if moe:
        extra = dict(enable_moe_block=True, num_experts=4, top_k_experts=2,
                     moe_intermediate_size=32)
    if large:
        extra.update(num_kv_shared_layers=0, use_double_wide_mlp=False,
                     hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)
    else:
        extra.update(num_kv_shared_layers=2, use_double_wide_mlp=True,
                     hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB)
    return Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=window,
        layer_types=layer_types, final_logit_softcapping=30.0, max_position_embeddings=512, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=2, eos_token_id=1,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        **extra)


def reinit(model, gemma3):
    """Weights with unit-scale activations: linear N(0, 1/fan_in), norms
    around their neutral value, router scales and layer scalars spread."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point():
                continue
            if name.endswith("layer_scalar"):
                p.copy_(0.7 + 0.3 * torch.rand(p.shape, generator=g))
            elif name.endswith("per_expert_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("router.scale") or ("norm" in name and p.dim() == 1):
                center = 0.0 if gemma3 else 1.0
                p.copy_(center + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            # other 1-D buffers (rotary tables, embed scales) stay as built


def build(name, out_dir):
    torch.manual_seed(SEED)
    if name == "gemma3":
        from transformers import Gemma3ForCausalLM as cls
        cfg = gemma3_config()
    else:
        from transformers import Gemma4ForCausalLM as cls
        cfg = gemma4_config(moe=(name == "gemma4-moe"), large=(name == "gemma4-large"))
    cfg._attn_implementation = "eager"  # plain softmax attention in float32
    model = cls(cfg).float().eval()
    reinit(model, name == "gemma3")
    if hasattr(model, "tie_weights"):
        model.tie_weights()

    gen = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(3, VOCAB, (PROMPT_LEN,), generator=gen)
    ids[0] = 2  # <bos>
    with torch.no_grad():
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
        seq = ids.clone()
        greedy = []
        for _ in range(GREEDY_TOKENS):  # full recompute: no cache involved
            nxt = int(model(input_ids=seq[None], use_cache=False).logits[0, -1].argmax())
            greedy.append(nxt)
            seq = torch.cat([seq, torch.tensor([nxt])])

    path = os.path.join(out_dir, name)
    os.makedirs(path, exist_ok=True)
    try:
        model.save_pretrained(path, safe_serialization=True)
    except TypeError:  # releases where safetensors is the only format
        model.save_pretrained(path)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        sys.exit(f"{path}: save_pretrained wrote no model.safetensors")
    for extra in ("generation_config.json",):
        p = os.path.join(path, extra)
        if os.path.exists(p):
            os.remove(p)
    save_file({
        "input_ids": ids.to(torch.int64).contiguous(),
        "logits": logits.contiguous(),
        "greedy": torch.tensor(greedy, dtype=torch.int64),
    }, os.path.join(path, "golden.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        mt = json.load(f).get("model_type")
    print(f"{path}: {mt}, prompt {PROMPT_LEN}, logits {tuple(logits.shape)}, greedy {greedy}")


ASSIST_PROMPT_LEN = 40   # < the target's window of 64
ASSIST_STEPS = 4
ASSIST_CENTROIDS = 16    # 512 / 16 = 32 ids per centroid
ASSIST_TOP_K = 4         # 128 candidates


def assistant_config():
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=64,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        num_kv_shared_layers=4, use_double_wide_mlp=False, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, final_logit_softcapping=None,
        max_position_embeddings=512, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        })
    return Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=64, use_ordered_embeddings=True,
        num_centroids=ASSIST_CENTROIDS, centroid_intermediate_top_k=ASSIST_TOP_K,
        tie_word_embeddings=True)


def save_model(model, path):
    os.makedirs(path, exist_ok=True)
    try:
        model.save_pretrained(path, safe_serialization=True)
    except TypeError:
        model.save_pretrained(path)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        sys.exit(f"{path}: save_pretrained wrote no model.safetensors")
    p = os.path.join(path, "generation_config.json")
    if os.path.exists(p):
        os.remove(p)


def build_assistant(out_dir):
    """The MTP assistant's draft steps over its target's shared K/V."""
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    torch.manual_seed(SEED)
    tcfg = gemma4_config(moe=False, window=64)
    tcfg._attn_implementation = "eager"
    target = Gemma4ForCausalLM(tcfg).float().eval()
    reinit(target, False)
    if hasattr(target, "tie_weights"):
        target.tie_weights()
    acfg = assistant_config()
    acfg._attn_implementation = "eager"
    acfg.get_text_config()._attn_implementation = "eager"
    assistant = Gemma4AssistantForCausalLM(acfg).float().eval()
    reinit(assistant, False)
    g = torch.Generator().manual_seed(SEED + 2)
    assistant.masked_embedding.token_ordering.copy_(torch.randperm(VOCAB, generator=g))
    if hasattr(assistant, "tie_weights"):
        assistant.tie_weights()

    gen = torch.Generator().manual_seed(SEED + 3)
    ids = torch.randint(3, VOCAB, (ASSIST_PROMPT_LEN,), generator=gen)
    ids[0] = 2
    p = ASSIST_PROMPT_LEN - 1
    with torch.no_grad():
        out = target.model(input_ids=ids[None], use_cache=False, return_shared_kv_states=True)
        skv = out.shared_kv_states  # {"sliding_attention": (K, V), "full_attention": (K, V)}
        # a dict or another mapping (transformers 5.17 returns a UserDict)
        keys = set(skv.keys()) if isinstance(skv, Mapping) else None
        if keys is None or not {"sliding_attention", "full_attention"} <= keys:
            sys.exit("this transformers does not return the shared K/V by layer type: "
                     f"{type(skv).__name__} {sorted(map(str, keys)) if keys else ''}")
        h = out.last_hidden_state[:, -1:].float()  # [1, 1, B], after the final norm
        target_logits = target(input_ids=ids[None], use_cache=False).logits[0, -1].float()
        tok = int(target_logits.argmax())
        h_in0 = h[0, 0].clone()
        toks_in, logits, h_out, drafts = [], [], [], []
        for _ in range(ASSIST_STEPS):
            e = target.model.embed_tokens(torch.tensor([[tok]]))  # scaled by sqrt(B)
            o = assistant(inputs_embeds=torch.cat([e.float(), h], dim=-1),
                          position_ids=torch.tensor([[p]]), shared_kv_states=skv,
                          attention_mask=None)
            row = o.logits[0, 0].float()
            toks_in.append(tok)
            logits.append(row)
            h = o.last_hidden_state.float()  # post_projection: the next step's h_in
            h_out.append(h[0, 0].clone())
            tok = int(row.argmax())
            drafts.append(tok)

    path = os.path.join(out_dir, "gemma4-assistant")
    save_model(target, os.path.join(path, "target"))
    save_model(assistant, path)
    save_file({
        "input_ids": ids.to(torch.int64).contiguous(),
        "target_logits": target_logits.contiguous(),
        "h_in": h_in0.contiguous(),
        "tokens_in": torch.tensor(toks_in, dtype=torch.int64),
        "logits": torch.stack(logits).contiguous(),
        "h_out": torch.stack(h_out).contiguous(),
        "drafts": torch.tensor(drafts, dtype=torch.int64),
    }, os.path.join(path, "golden.safetensors"))
    print(f"{path}: gemma4_assistant, prompt {ASSIST_PROMPT_LEN}, tokens in {toks_in}, "
          f"drafts {drafts}")


NAMES = ["gemma3", "gemma4", "gemma4-moe", "gemma4-large", "gemma4-assistant"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join("tests", "fixtures", "models"))
    ap.add_argument("--only", choices=NAMES, action="append")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    for name in args.only or NAMES:
        if name == "gemma4-assistant":
            build_assistant(args.out)
        else:
            build(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
