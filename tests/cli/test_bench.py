"""`specmm bench ...` holds a lock on its report while it runs: a second run writing the same report is refused."""

from __future__ import annotations

from specmm.cli import main
from specmm.cli.common import report_lock


def test_a_second_benchmark_writing_the_same_report_is_refused(tmp_path, capsys):
    with report_lock(tmp_path, "core-random-cpu"):
        assert main(["bench", "core", "--random", "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "specmm: error: --out/--name:" in err and "core-random-cpu" in err and "(PID" in err
    assert list(tmp_path.glob("*.json")) == []
