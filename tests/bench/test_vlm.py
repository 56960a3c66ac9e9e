"""`specmm bench vlm` writes its reports as it goes: after every timed round, the sections so far, the last partial."""

from __future__ import annotations

import specmm.bench.vlm as bench_vlm
from specmm.cli import main


def test_bench_vlm_writes_the_sections_so_far_after_every_timed_round(tiny_zoo, tmp_path, monkeypatch):
    tiny_zoo("captioner-drafters")
    written = []
    real = bench_vlm.write_reports

    def record(reports, directory, stem):
        written.append([(r.name.rsplit(" ", 1)[-1], r.partial[:6]) for r in reports])
        return real(reports, directory, stem)

    monkeypatch.setattr(bench_vlm, "write_reports", record)
    code = main(["bench", "vlm", "--scale", "tiny", "--methods", "eagle", "--trees", "chain", "--scenes", "2",
                 "--batch-sizes", "1", "2", "--temperatures", "0", "--max-new-tokens", "4", "--repeats", "2",
                 "--out", str(tmp_path), "--name", "v"])
    assert code == 0
    assert written == [[("1", "1 of 2")], [("1", "2 of 2")], [("1", ""), ("2", "1 of 2")],
                       [("1", ""), ("2", "2 of 2")], [("1", ""), ("2", "")]]
    assert "Partial" not in (tmp_path / "v.md").read_text()
