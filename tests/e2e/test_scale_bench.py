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


def test_the_torch_floor_comes_off_both_sides_of_each_ratio():
    """--floor: Dynamo and AOTAutograd's time (backend="aot_eager") is taken off each row's
    compile, disk hit and Inductor time before the ratios are formed again."""

    def row(layers, seq, compile_s, floor_s, sweep, **more):
        cfg = {"layers": layers, "seq": seq}
        name = f"fwd L{layers} S{seq}"
        return (
            {"name": name, "config": cfg, "sweep": sweep, "compile_s": compile_s}
            | more
            | {"floor_s": floor_s}
        )

    rows = [
        row(1, 512, 4.0, 1.0, "both", cache_bytes=10, inductor_s=9.0),
        row(4, 512, 7.0, 2.0, "depth", hit_s=2.5, cache_bytes=30),
        row(1, 4096, 10.0, 1.0, "seq", cache_bytes=11),
    ]
    plain, less = scale_bench.ratios(rows), scale_bench.ratios(scale_bench._less_floor(rows))
    assert plain["depth"]["value"] == 7.0 / 4.0 and less["depth"]["value"] == 5.0 / 3.0
    assert less["seq_compile"]["value"] == 9.0 / 3.0
    assert plain["disk_hit"]["value"] == 2.5 / 7.0 and less["disk_hit"]["value"] == 0.5 / 5.0
    assert less["inductor"]["value"] == 3.0 / 8.0
    assert less["seq_size"] == plain["seq_size"]  # bytes have no floor
    assert rows[0]["compile_s"] == 4.0  # the rows themselves are left as they were
