"""The decode settings every tuning cache file of this machine chose (one file per kernel-source hash, so one per
checkout the tunings ran under), with the M = 1 timings of four settings at 2 threads and 1 thread:

    python benchmarks/results/decode_setting_history.py [~/.cache/awq_inductor/tuning]

(decode_layer_overhead_amx_1207.md)."""
import glob, json, os, sys, time

folder = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/awq_inductor/tuning")
for path in sorted(glob.glob(os.path.join(folder, "*.json")), key=os.path.getmtime):
    for key, v in json.load(open(path)).get("machine_params", {}).items():
        if not key.startswith("decode_setting/") or "w4a16" not in key:
            continue
        t = v.get("times_ms", {})
        ms = " ".join(f"{n} {t.get(n, float('nan')):.3f}" for n in ("0+int16", "2048+int16", "1024+int16+l2_4096", "0"))
        print(time.strftime("%m-%d %H:%M", time.gmtime(os.path.getmtime(path))), key,
              f"chose {v.get('bytes')} B int16 {v.get('int16_x')} l2 {v.get('l2_bytes')} | {ms} | 1 thread:",
              f"0+int16 {t.get('0+int16@1t', float('nan')):.3f} 2048+int16 {t.get('2048+int16@1t', float('nan')):.3f}")
