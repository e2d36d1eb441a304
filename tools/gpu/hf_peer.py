#!/usr/bin/env python3
"""hf_peer.py — the peer figure for lmserve's GPU benchmarks: the same
checkpoint and the same request shape through Hugging Face transformers'
generate (bf16 weights, greedy, every request forced to its full output
length), at batch sizes given on the command line. Prints one line per
batch size: output tokens/s, and the time per output step.

  python3 tools/gpu/hf_peer.py --model DIR [--input-len 128] [--output-len 128] [--batch 1 32]
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    vocab = m.config.vocab_size
    g = torch.Generator().manual_seed(1)
    print(f"transformers peer: {a.model}, {torch.cuda.get_device_name()}, bf16, "
          f"attention {m.config._attn_implementation}", flush=True)
    for bs in a.batch:
        ids = torch.randint(3, vocab, (bs, a.input_len), generator=g).cuda()
        ids[:, 0] = 2
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
        m.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = m.generate(ids, max_new_tokens=a.output_len, min_new_tokens=a.output_len, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        n = (out.shape[1] - a.input_len) * bs
        print(f"transformers generate batch {bs}: {n} output tokens in {dt:.3f} s: "
              f"{n / dt:.1f} tokens/s ({dt / a.output_len * 1e3:.2f} ms per step, prefill "
              f"included)", flush=True)


if __name__ == "__main__":
    main()
