"""The CPU peers ``bench_e2e.py`` times beside us, on GGUF files of the same weights
(:mod:`gguf_export`): llama.cpp through ``llama-cpp-python`` (optional; build it from source, see
``../shared/design/peers.md``) and ik_llama.cpp through a ``llama-bench`` binary the user built
(``--llama-bench PATH``; its source is not ours to ship or script). Never runtime or test
dependencies. Each timer returns (prefill tok/s, decode tok/s) or None after one line saying why
the row is skipped.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import List, Optional, Tuple

Speeds = Optional[Tuple[float, float]]


def llamacpp(gguf_path: str, prompt: List[int], new_tokens: int, threads: int, repeats: int = 5) -> Speeds:
    """llama.cpp via llama-cpp-python, in a child Python process (:func:`_time_llamacpp`): a crash
    there costs the row, not the run (on the AMX Xeon, 2026-12-03, its second model in one process
    died of SIGILL and took the whole benchmark with it)."""
    request = json.dumps({"gguf": gguf_path, "prompt": list(prompt), "new_tokens": new_tokens, "threads": threads,
                          "repeats": repeats})
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--llamacpp", request],
                         capture_output=True, text=True)
    reply = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    if not reply:
        why = f"signal {signal.Signals(-out.returncode).name}" if out.returncode < 0 else f"exit {out.returncode}"
        print(f"  llama.cpp row skipped: its process ended with {why}: {out.stderr.strip()[-300:]}", flush=True)
        return None
    result = json.loads(reply[0])
    if "skipped" in result:
        print(f"  llama.cpp row skipped: {result['skipped']}", flush=True)
        return None
    return result["prefill"], result["decode"]


def _time_llamacpp(gguf_path: str, prompt: List[int], new_tokens: int, threads: int, repeats: int) -> dict:
    """In the child: prefill = ``eval`` of the prompt after a reset, decode = the ``new_tokens - 1``
    one-token ``eval`` calls after it; ``repeats`` back-to-back pairs after a warm-up pair, medians
    (the protocol of our ``bench``)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (build it from source: "
                           "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install llama-cpp-python)"}
    llm = Llama(model_path=gguf_path, n_ctx=len(prompt) + new_tokens + 8, n_batch=max(512, len(prompt)),
                n_ubatch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    steps = max(new_tokens - 1, 1)

    def pair() -> Tuple[float, float]:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for _ in range(steps):
            llm.eval([prompt[-1]])
        return t1 - t0, time.perf_counter() - t1

    pair()
    pairs = [pair() for _ in range(repeats)]
    return {"prefill": len(prompt) / statistics.median(p for p, _ in pairs),
            "decode": steps / statistics.median(d for _, d in pairs)}


def _library_path(binary: str) -> str:
    """LD_LIBRARY_PATH for a llama-bench in ``<build>/bin``: its own dir, ``<build>/src`` and
    ``<build>/ggml/src`` (a shared-library build), then what was set."""
    bin_dir = os.path.dirname(os.path.abspath(binary))
    build = os.path.dirname(bin_dir)
    dirs = [bin_dir, os.path.join(build, "src"), os.path.join(build, "ggml", "src")]
    return os.pathsep.join([d for d in dirs if os.path.isdir(d)] + [os.environ.get("LD_LIBRARY_PATH", "")])


def parse_llama_bench(text: str) -> Tuple[float, float]:
    """(prefill, decode) tok/s from ``llama-bench -o json`` output: the ``avg_ts`` of the entry with
    ``n_prompt > 0, n_gen == 0`` and of the generation entry with the longest prompt before it
    (``-gp``'s ``tg N@pp M``: the generation after a prompt, timed alone)."""
    rows = json.loads(text[text.index("["):])
    pp = [r["avg_ts"] for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
    tg = sorted((r for r in rows if r.get("n_gen", 0) > 0), key=lambda r: r.get("n_prompt", 0))
    if not pp or not tg:
        raise ValueError(f"llama-bench output: expected a prompt and a generation entry, got {len(rows)} rows")
    return float(pp[0]), float(tg[-1]["avg_ts"])


def _generates_after_prompt(binary: str, env: dict) -> bool:
    """Whether this llama-bench has ik_llama.cpp's ``-gp <pp,tg>`` (generation after a prompt)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, env=env)
    return "-gp <pp,tg>" in out.stdout + out.stderr


def llama_bench(binary: Optional[str], gguf_path: str, prompt_len: int, new_tokens: int, threads: int,
                repeats: int = 3) -> Speeds:
    """ik_llama.cpp (or llama.cpp) via its ``llama-bench``: ``-p prompt_len -n 0 -gp
    prompt_len,new_tokens -t threads -r repeats -rtr 1`` (run-time repacking into its interleaved-row
    layouts: ik_llama.cpp's fast path), JSON output. Decode is ``-gp``'s: the ``new_tokens`` generated
    after a ``prompt_len`` prompt, as our rows and llama.cpp's decode (``-n`` alone generates into an
    empty cache: on the 4-layer Llama-7B shape, Zen 4, tg32 49.0, tg32@pp512 46.2, tg32@pp2048 43.0
    tok/s); a binary without ``-gp`` runs ``-n new_tokens``, said in one line."""
    if not binary:
        print("  ik_llama.cpp row skipped: no --llama-bench PATH (a llama-bench binary you built)", flush=True)
        return None
    if not os.access(binary, os.X_OK):
        print(f"  ik_llama.cpp row skipped: --llama-bench {binary} is not an executable file", flush=True)
        return None
    env = dict(os.environ, LD_LIBRARY_PATH=_library_path(binary))
    if _generates_after_prompt(binary, env):
        generate = ["-n", "0", "-gp", f"{prompt_len},{new_tokens}"]
    else:
        print(f"  {binary} has no -gp: its decode row generates into an empty cache (-n {new_tokens}), "
              f"ours after the {prompt_len}-token prompt", flush=True)
        generate = ["-n", str(new_tokens)]
    cmd = [binary, "-m", gguf_path, "-p", str(prompt_len), *generate, "-t", str(threads),
           "-r", str(repeats), "-rtr", "1", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        print(f"  ik_llama.cpp row skipped: {' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-300:]}",
              flush=True)
        return None
    return parse_llama_bench(out.stdout)


if __name__ == "__main__" and sys.argv[1:2] == ["--llamacpp"]:
    args = json.loads(sys.argv[2])
    print(json.dumps(_time_llamacpp(args["gguf"], args["prompt"], args["new_tokens"], args["threads"], args["repeats"])))
