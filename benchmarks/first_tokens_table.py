"""The markdown table of benchmarks/results/compile_first_tokens.jsonl (compile_first_tokens.sh):

    python benchmarks/first_tokens_table.py benchmarks/results/compile_first_tokens.jsonl

One row per (layers, mode): the first ``generate`` of 32 tokens cold and warm (seconds), and where the
cold one went (Dynamo's metrics: bytecode tracing, the backend call with AOT + Inductor lowering +
C++ compile waits, C++ compiles waited for; our native builds and tuning, which run at load or in
the prebuild thread), the Dynamo graphs, the load average and other processes' CPU seconds."""
import json
import sys


def main(path: str) -> str:
    runs = {}
    for line in open(path):
        rec = json.loads(line)
        r = rec["r"]
        runs.setdefault((r["layers"], r["mode"]), {})[rec["phase"]] = r
    out = ["| layers | mode | cold first 32 tokens s | warm s | cold: import / load s | cold: Dynamo tracing "
           "/ backend (AOT + Inductor + C++) / C++ waited / native builds / tuning s | graphs | load avg "
           "cold, warm | others' CPU s cold, warm |", "|---|---|---|---|---|---|---|---|---|"]
    for (layers, mode), ph in sorted(runs.items()):
        c, w = ph.get("cold", {}), ph.get("warm", {})
        p = c.get("phases", {})
        parts = [p.get(k, 0.0) for k in ("bytecode_tracing", "OutputGraph.call_user_compiler", "async_compile.wait",
                                         "native_build_s", "tune_s")]
        out.append(f"| {layers} | {mode} | {c.get('first_generate_s')} | {w.get('first_generate_s')} | "
                   f"{c.get('import_s')} / {c.get('load_s')} | " + " / ".join(f"{x:.1f}" for x in parts) +
                   f" | {w.get('graphs', c.get('graphs'))} | {c.get('load_avg')}, {w.get('load_avg')} | "
                   f"{c.get('others_cpu_s')}, {w.get('others_cpu_s')} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(main(sys.argv[1]))
