"""A seconds-long run of the benchmark harness (the benchmarks themselves are not tests)."""
import importlib.util
import json
import os

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_linear.py")


def test_bench_linear_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_linear", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--smoke", "--out", str(tmp_path), "--threads", "1"])
    assert {r["M"] for r in rows} == {1, 5}
    for r in rows:
        for m in ("ours_compiled", "ours_eager", "dense_bf16", "aten_int4pack"):
            assert r[m] > 0
    data = json.load(open(tmp_path / "bench_linear_smoke.json"))
    assert len(data["rows"]) == 2
    assert "| ours/dense |" in open(tmp_path / "bench_linear_smoke.md").read()


def test_bench_decode_smoke(tmp_path):
    path = os.path.join(os.path.dirname(BENCH), "bench_decode.py")
    spec = importlib.util.spec_from_file_location("bench_decode", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--smoke", "--out", str(tmp_path), "--threads", "1"])
    assert [r["M"] for r in rows] == [1, 8]
    for r in rows:
        assert r["ours_ms"] > 0 and r["aten_ms"] > 0 and 0 < r["ours_share"] and r["copies"] >= 2
    assert "| ours share |" in open(tmp_path / "bench_decode_smoke.md").read()
