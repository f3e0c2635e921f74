"""python benchmarks/results/demo_cold.py: one cold run of `python -m awq_inductor` (fresh HOME, TMPDIR and
TORCHINDUCTOR_CACHE_DIR); prints seconds to the load line, to the 32 generated tokens, and the whole job."""
import os, subprocess, sys, tempfile, time, json
d = tempfile.mkdtemp(prefix="democold"); os.makedirs(d + "/tmp")
env = dict(os.environ, HOME=d, TMPDIR=d + "/tmp", TORCHINDUCTOR_CACHE_DIR=d + "/ind", PYTHONUNBUFFERED="1")
t0 = time.perf_counter(); marks = {}
p = subprocess.Popen([sys.executable, "-m", "awq_inductor"], cwd="/tmp", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
for line in p.stdout:
    t = time.perf_counter() - t0
    if "loaded LlamaForCausalLM" in line: marks["loaded"] = round(t, 2)
    if "32 tokens in" in line: marks["first_32_tokens"] = round(t, 2)
p.wait(); marks["whole_job"] = round(time.perf_counter() - t0, 2); marks["rc"] = p.returncode
print(json.dumps(marks))
subprocess.run(["rm", "-rf", d])
