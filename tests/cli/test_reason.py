"""`specmm reason` writes one JSON line per prompt, refuses to overwrite, and resumes."""

from __future__ import annotations

import json

from specmm.cli import main


def test_reason_writes_rollouts_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    out = tmp_path / "rollouts.jsonl"
    args = ["reason", "--scale", "tiny", "--policy", "random", "--threshold", "0.5", "--max-new-tokens", "12",
            "--max-step-tokens", "4", "--batch-size", "2", "--out", str(out)]
    assert main([*args, "--problems", "3"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in lines] == [0, 1, 2]
    for r in lines:
        assert len(r["completion_ids"]) == len(r["source"]) == len(r["behaviour_logprobs"]) <= 12
        assert r["step_spans"][-1][1] == len(r["completion_ids"]) and not r["exact"]
    assert main([*args, "--problems", "5"]) == 2  # the file exists and --resume was not given
    assert "--out" in capsys.readouterr().err
    assert main([*args, "--problems", "5", "--resume"]) == 0
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert again[:3] == lines and [r["index"] for r in again[3:]] == [3, 4]
