"""The depth/size compile benchmark (tools/scale_bench.py) at its quick size: every row and
ratio is reported, in the table and the JSON. Wall times are reported, never compared here:
these machines are noisy."""

import json

from tools import scale_bench


def test_scale_bench_quick_reports_every_row_and_ratio(tmp_path, capsys):
    out = tmp_path / "scale.json"
    assert scale_bench.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["fwd L1 S256", "fwd L2 S256", "fwd L1 S128"]
    assert [r["sweep"] for r in rows.values()] == ["both", "depth", "seq"]
    for r in rows.values():
        assert not r.get("failed"), r
        assert r["compiles"] > 0 and r["cache_entries"] > 0 and r["cache_bytes"] > 0
        assert r["graphs"] and all(n > 0 for n in r["graphs"].values())
        assert r["step_ms"] > 0 and 0 < r["mfu"] < 1
        assert r["fallback_nodes"] == {} and r["compiler_errors"] == {}
    assert "hit_s" in rows["fwd L2 S256"]  # the deepest row's new process found every graph
    assert result["ratios"]["inductor"] is None  # not asked for
    for key in ("depth", "seq_compile", "seq_size", "disk_hit"):
        assert result["ratios"][key]["value"] > 0, key
    table = capsys.readouterr().out
    for name in rows:
        assert name in table
    for name, _, _ in scale_bench.TARGETS.values():
        assert name in table
