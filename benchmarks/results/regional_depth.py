"""Decode step time of the tiny AWQ Llama (hidden 256, G 64, bf16), regional vs whole compile, by depth:

    python benchmarks/results/regional_depth.py MODE LAYERS     # MODE regional | whole | regional_nosa

one JSON line: the median over 8 pairs of (generate 66 tokens - generate 2 tokens) / 64, after two
warm-up generates. regional_nosa: Inductor's size_asserts off. The checkpoint is written to
/tmp/exp/tiny_L<LAYERS> on first use."""
import json, os, sys, time, statistics
import torch, transformers
from awq_inductor import testing, compile_for_generate, patch_transformers


def load_tiny(L: int):
    """The tiny AWQ Llama with L layers, loaded as a user would (written to /tmp/exp/tiny_L<L> first)."""
    ckpt = f"/tmp/exp/tiny_L{L}"
    if not os.path.exists(ckpt):
        cfg = testing.tiny_config("llama", hidden_size=256, intermediate_size=768, num_hidden_layers=L, max_position_embeddings=2048)
        testing.save_quantized(testing.build_float_model(cfg), ckpt, format="gemm", group_size=64)
    patch_transformers()
    return transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()


def main():
    mode, L = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(2)
    model = load_tiny(L)
    compile_for_generate(model, regional=(mode.startswith("regional")), **({"options": {"size_asserts": False}} if mode.endswith("nosa") else {}))
    ids = torch.randint(3, 200, (1, 16))
    def gen(n):
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t
    t0 = time.perf_counter(); gen(4); gen(4); compile_s = time.perf_counter() - t0
    steps = []
    for _ in range(8):
        a = gen(2); b = gen(66)
        steps.append((b - a) / 64 * 1e3)
    print(json.dumps({"mode": mode, "layers": L, "step_ms": round(statistics.median(steps), 4),
                      "steps": [round(s, 3) for s in steps], "compile_s": round(compile_s, 1)}), flush=True)


if __name__ == "__main__":
    main()
