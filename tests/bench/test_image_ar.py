"""`specmm bench image_ar` end to end on the micro `imagegen` build: every method, report files, grids."""

import json

import pytest

from specmm.cli import main
from specmm.image_ar.janus import stock_generate_problem


def test_bench_image_ar_writes_report_with_every_method(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    out = tmp_path / "bench"
    assert main(["bench", "image_ar", "--scale", "tiny", "--images", "4", "--batch-sizes", "2", "--window", "4",
                 "--top-k", "8", "--out", str(out), "--name", "t"]) == 0
    report = json.loads((out / "t.json").read_text())
    methods = [r["method"] for r in report["rows"]]
    assert methods == [f"{m} (bs 2)" for m in ("ar", "exact", "sjd", "lantern", "lantern++", "gsd", "gsd-drafter")]
    rows = {r["method"].split(" ")[0]: r for r in report["rows"]}
    assert rows["ar"]["mean_accepted"] == 1.0
    assert rows["exact"]["matched"] is True and rows["sjd"]["matched"] is True  # greedy tokens equal AR's
    assert all(r["mean_accepted"] >= 1.0 for r in report["rows"])
    assert (out / "t-grid-gsd.png").is_file() and (out / "t-grid-lanternpp.png").is_file()
    assert "KID" in (out / "t.md").read_text()


def test_bench_image_ar_interleaves_methods_batch_by_batch_and_resumes_after_the_last_saved_batch(tmp_path,
                                                                                                  monkeypatch):
    """Methods take turns batch by batch (so a drift in machine speed hits all alike); a run killed mid-way
    resumes after the last batch it saved, without redoing the reference set, and ends with the same rows as an
    uninterrupted run."""
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    out = tmp_path / "bench"
    args = ["bench", "image_ar", "--scale", "tiny", "--images", "4", "--batch-sizes", "2", "--window", "4",
            "--methods", "ar,sjd", "--out", str(out)]
    from specmm.bench import image_ar

    real = image_ar._sample_chunk
    calls = []

    def killed_at_the_sixth(sampler, chunk, start, *a, **kw):
        calls.append((type(sampler.proposer).__name__, start))
        if len(calls) == 6:  # reference set (2 batches), then ar, sjd on batch 0, ar on batch 2, sjd: killed
            raise KeyboardInterrupt
        return real(sampler, chunk, start, *a, **kw)

    monkeypatch.setattr(image_ar, "_sample_chunk", killed_at_the_sixth)
    try:
        main([*args, "--name", "r"])
    except KeyboardInterrupt:
        pass
    assert [start for _, start in calls] == [0, 2, 0, 0, 2, 2]
    assert calls[2][0] != calls[3][0]  # the two methods alternate
    monkeypatch.setattr(image_ar, "_sample_chunk", lambda *a, **kw: calls.append("again") or real(*a, **kw))
    assert main([*args, "--name", "r", "--resume"]) == 0
    assert calls[6:] == ["again", "again"]  # only the unsaved batch, once per method
    assert not (out / "r.partial").exists()
    assert main([*args, "--name", "whole"]) == 0
    resumed, whole = (json.loads((out / f"{n}.json").read_text())["rows"] for n in ("r", "whole"))
    assert [r["method"] for r in resumed] == ["ar (bs 2)", "sjd (bs 2)"]
    for a, b in zip(resumed, whole):
        assert a["mean_accepted"] == b["mean_accepted"] and a["matched"] == b["matched"]
        assert a["extra"]["FID"] == b["extra"]["FID"] and a["extra"]["class acc"] == b["extra"]["class acc"]


def test_bench_image_ar_resume_skips_finished_batch_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    args = ["bench", "image_ar", "--scale", "tiny", "--images", "2", "--batch-sizes", "1", "2", "--window", "4",
            "--methods", "ar,sjd", "--out", str(tmp_path / "bench"), "--name", "r"]
    from specmm.bench import image_ar

    real, calls = image_ar._sample_chunk, []

    def killed_in_the_second_batch_size(sampler, chunk, start, *a, **kw):
        calls.append(len(chunk))
        if len(calls) == 8:  # batch size 1: reference (2), both methods (4); batch size 2: reference, ar: killed
            raise KeyboardInterrupt
        return real(sampler, chunk, start, *a, **kw)

    monkeypatch.setattr(image_ar, "_sample_chunk", killed_in_the_second_batch_size)
    assert main(args) == 130  # Ctrl-C: one line, exit 130
    monkeypatch.setattr(image_ar, "_sample_chunk", lambda s, chunk, *a, **kw: calls.append(("again", len(chunk)))
                        or real(s, chunk, *a, **kw))
    assert main([*args, "--resume"]) == 0
    assert calls[8:] == [("again", 2), ("again", 2)]  # batch size 2's two methods only
    rows = json.loads((tmp_path / "bench" / "r.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["ar (bs 1)", "sjd (bs 1)", "ar (bs 2)", "sjd (bs 2)"]


def test_bench_image_ar_compile_adds_compiled_rows_and_a_compiled_ar_baseline(tmp_path, monkeypatch):
    """--compile: every method again compiled (dynamo's eager backend here: capture without codegen), compile time
    from the warm-up only, the speedup against the faster AR row, a round split for the speculative rows; in bf16
    (the GPU run's --dtype), where SJD's compiled greedy tokens still equal greedy AR's."""
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("specmm.core.compiled.BACKEND", "eager")
    out = tmp_path / "bench"
    assert main(["bench", "image_ar", "--scale", "tiny", "--images", "3", "--batch-sizes", "2", "--window", "4",
                 "--methods", "ar,sjd", "--top-k", "8", "--dtype", "bfloat16", "--compile", "--out", str(out),
                 "--name", "c"]) == 0
    report = json.loads((out / "c.json").read_text())
    assert report["setup"]["GPT and drafter dtype"] == "torch.bfloat16"
    rows = {r["method"]: r for r in report["rows"]}
    assert list(rows) == ["ar (bs 2)", "sjd (bs 2)", "ar, compiled (bs 2)", "sjd, compiled (bs 2)"]
    assert [r["baseline"] for r in rows.values()] == [True, False, True, False]
    assert [r["compiled"] for r in rows.values()] == [False, False, True, True]
    compiled = [rows["ar, compiled (bs 2)"], rows["sjd, compiled (bs 2)"]]
    assert all(r["compile_s"] > 0 and r["timed_compiles"] == 0 for r in compiled)  # 3 images: batches of 2 and 1
    assert rows["ar (bs 2)"]["compile_s"] == 0.0 and rows["sjd, compiled (bs 2)"]["matched"] is True
    best = max((r for r in rows.values() if r["baseline"]), key=lambda r: r["speedup"])
    assert best["speedup_vs_best_ar"] == 1.0
    assert all(r["speedup_vs_best_ar"] == r["speedup"] / best["speedup"] for r in rows.values())
    assert set(rows["sjd, compiled (bs 2)"]["round_ms"]) == {"draft", "verify", "accept_commit", "other"}
    assert rows["ar, compiled (bs 2)"]["round_ms"] == {}


@pytest.mark.skipif(bool(stock_generate_problem()), reason=str(stock_generate_problem()))
def test_bench_image_ar_on_a_janus_folder_compares_with_its_generate(tmp_path, capsys, monkeypatch):
    from tests.image_ar.stock import janus_processor, tiny_janus

    folder, out = tmp_path / "janus", tmp_path / "bench"
    tiny_janus(dtype=__import__("torch").float32).save_pretrained(folder)
    janus_processor().save_pretrained(folder)
    assert main(["bench", "image_ar", "--model", str(folder), "--batch-sizes", "2", "--window", "4",
                 "--cfg-scale", "3", "--out", str(out), "--name", "j"]) == 0
    report = json.loads((out / "j.json").read_text())
    rows = {r["method"].split(" ")[0]: r for r in report["rows"]}
    assert list(rows) == ["hf", "ar", "exact", "sjd", "gsd"] and rows["hf"]["baseline"]
    assert all(rows[m]["matched"] for m in ("ar", "exact", "sjd"))  # greedy tokens equal HF generate's
    assert all(r["mean_accepted"] >= 1.0 and r["median_s"] > 0 for r in report["rows"])
    assert any("meaningless" in note for note in report["notes"]) and "meaningless" in capsys.readouterr().out
    monkeypatch.setattr("specmm.core.compiled.BACKEND", "eager")  # dynamo's graphs, no codegen: the suite's time
    assert main(["bench", "image_ar", "--model", str(folder), "--batch-sizes", "2", "--window", "4", "--methods", "sjd",
                 "--cfg-scale", "3", "--compile", "--out", str(out), "--name", "jc"]) == 0
    rows = {r["method"]: r for r in json.loads((out / "jc.json").read_text())["rows"]}
    assert [r["compiled"] for r in rows.values()] == [False, True, False, True]
    hf_compiled = rows["hf generate, static cache + torch.compile (bs 2)"]  # its language model ran compiled
    assert hf_compiled["baseline"] and hf_compiled["matched"] and hf_compiled["compile_s"] > 0
    assert rows["sjd, compiled (bs 2)"]["matched"] and rows["sjd, compiled (bs 2)"]["compile_s"] > 0


@pytest.mark.skipif(bool(stock_generate_problem()), reason=str(stock_generate_problem()))
def test_bench_image_ar_on_a_janus_folder_reports_each_batch_size_and_resumes_after_the_last(tmp_path, monkeypatch):
    """Killed in its second batch size, the run has written the first's report (marked partial); --resume times
    only the second and writes the whole report; a run with other settings may not resume it."""
    import specmm.bench.image_stock as stock
    from tests.image_ar.stock import janus_processor, tiny_janus

    folder, out = tmp_path / "janus", tmp_path / "bench"
    tiny_janus(dtype=__import__("torch").float32).save_pretrained(folder)
    janus_processor().save_pretrained(folder)
    real, timed = stock.run_benchmark, []

    def killed_in_the_second(methods, *a, **kw):
        timed.append(methods[0].name)
        if len(timed) == 2:
            raise RuntimeError("killed")
        return real(methods, *a, **kw)

    monkeypatch.setattr(stock, "run_benchmark", killed_in_the_second)
    args = ["bench", "image_ar", "--model", str(folder), "--batch-sizes", "1", "2", "--methods", "sjd", "--window",
            "4", "--cfg-scale", "3", "--out", str(out), "--name", "r"]
    with pytest.raises(RuntimeError, match="killed"):
        main(args)
    report = json.loads((out / "r.json").read_text())
    assert report["partial"] == "batch sizes 2 not run yet"
    assert [r["method"] for r in report["rows"]] == ["hf generate (bs 1)", "sjd (bs 1)"]
    assert main([*args, "--resume", "--window", "5"]) == 2  # other settings: refused, nothing run
    timed.clear()
    monkeypatch.setattr(stock, "run_benchmark", lambda methods, *a, **kw: timed.append(methods[0].name) or real(
        methods, *a, **kw))
    assert main([*args, "--resume"]) == 0
    assert timed == ["hf generate (bs 2)"]
    report = json.loads((out / "r.json").read_text())
    assert report["partial"] == "" and len(report["rows"]) == 4 and all(r["matched"] for r in report["rows"])
    assert not (out / "r.partial").exists()


def test_bench_image_ar_on_an_emu3_folder_at_a_latent_size(tmp_path, monkeypatch, capsys):
    """An Emu3 folder: HF's row is `generate` with the docs' constraint function, eager and with HF's static cache
    and auto-compile (compiled: HF kept its compiled call); specmm's lossless rows give its tokens."""
    import torch

    from tests.image_ar.stock import janus_processor, tiny_janus
    from tests.image_ar.test_emu3 import tiny_emu3, tiny_processor

    model = tiny_emu3(codes=6, seed=3, dtype=torch.float32)
    folder, out = tmp_path / "emu3", tmp_path / "bench"
    model.save_pretrained(folder)
    tiny_processor(model).save_pretrained(folder)
    monkeypatch.setattr("specmm.core.compiled.BACKEND", "eager")
    assert main(["bench", "image_ar", "--model", str(folder), "--latent-size", "2x3", "--batch-sizes", "2",
                 "--methods", "ar,sjd", "--window", "4", "--cfg-scale", "3", "--compile", "--out", str(out),
                 "--name", "e"]) == 0
    rows = {r["method"]: r for r in json.loads((out / "e.json").read_text())["rows"]}
    assert [(r["baseline"], r["compiled"]) for r in rows.values()] == [(True, False), (True, True)] + [
        (False, False), (False, True)] * 2
    assert all(r["matched"] and r["new_tokens"] == 2 * 6 for r in rows.values())
    janus = tmp_path / "janus"
    tiny_janus(dtype=torch.float32).save_pretrained(janus)
    janus_processor().save_pretrained(janus)
    assert main(["bench", "image_ar", "--model", str(janus), "--latent-size", "2x2", "--out", str(out)]) == 2
    assert "--latent-size: JanusForConditionalGeneration generates images of one size" in capsys.readouterr().err
    monkeypatch.setattr("specmm.image_ar.janus.stock_generate_problem", lambda: "HF's Janus generate is broken here")
    assert main(["bench", "image_ar", "--model", str(janus), "--out", str(out)]) == 2  # no reference: refused
    assert "--model: HF's Janus generate is broken here" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["bench", "image_ar", "--latent-size", "2x2", "--out", str(out)]) == 2
    assert "--latent-size: for a stock generator folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "image_ar", "--latent-size", "2", "--out", str(out)])
    assert "expected HxW in latent tokens" in capsys.readouterr().err
    monkeypatch.setattr("specmm.image_ar.models.image_model_for", lambda *a, **kw: object())  # an adapter without
    assert main(["bench", "image_ar", "--model", str(folder), "--out", str(out)]) == 2  # HF's call is refused
    assert "adapter has no hf_generate" in capsys.readouterr().err


def test_bench_image_ar_draft_chain_gives_drafter_rows_a_chain(tmp_path, monkeypatch):
    """--draft-chain K: exact SD and LANTERN draft a chain of K (at most K + 1 tokens per forward), exact still
    reproduces greedy AR; Jacobi rows keep their window."""
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    from specmm.image_ar import methods

    trees, real = {}, methods.make_sampler

    def spy(lg, method, drafter=None, **kw):
        sampler = real(lg, method, drafter, **kw)
        trees[method] = sampler.tree
        return sampler

    monkeypatch.setattr(methods, "make_sampler", spy)
    out = tmp_path / "bench"
    assert main(["bench", "image_ar", "--scale", "tiny", "--images", "2", "--batch-sizes", "2", "--window", "4",
                 "--methods", "ar,exact,sjd,lantern", "--top-k", "8", "--draft-chain", "3", "--out", str(out),
                 "--name", "d"]) == 0
    assert trees["exact"].kind == "chain" and trees["exact"].num_nodes == 4 and trees["lantern"].num_nodes == 4
    assert trees["sjd"].num_nodes == 4 and trees["ar"] is None  # the Jacobi window of 4: a chain of 3 as before
    rows = {r["method"].split(" ")[0]: r for r in json.loads((out / "d.json").read_text())["rows"]}
    assert rows["exact"]["matched"] is True
    assert all(1.0 <= rows[m]["mean_accepted"] <= 4.0 for m in ("exact", "lantern"))
    assert "draft a chain of 3 tokens" in (out / "d.md").read_text()


def test_bench_image_ar_draft_chain_per_batch_size(tmp_path, monkeypatch):
    """--draft-chain 3 1 with --batch-sizes 1 2: each batch size's drafter rows draft their own chain."""
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    from specmm.image_ar import methods

    depths, real = [], methods.make_sampler

    def spy(lg, method, drafter=None, **kw):
        sampler = real(lg, method, drafter, **kw)
        depths.append((method, sampler.tree.depth if sampler.tree else None))
        return sampler

    monkeypatch.setattr(methods, "make_sampler", spy)
    out = tmp_path / "bench"
    assert main(["bench", "image_ar", "--scale", "tiny", "--images", "2", "--batch-sizes", "1", "2", "--methods",
                 "ar,lantern", "--top-k", "8", "--draft-chain", "3", "1", "--out", str(out), "--name", "d"]) == 0
    assert [d for m, d in depths if m == "lantern"] == [3, 1]
    rows = {r["method"]: r for r in json.loads((out / "d.json").read_text())["rows"]}
    assert rows["lantern (bs 2)"]["mean_accepted"] <= 2.0 < rows["lantern (bs 1)"]["mean_accepted"]
    assert "draft a chain of 3 tokens at batch 1, of 1 tokens at batch 2" in (out / "d.md").read_text()


def test_bench_image_ar_refuses_a_bad_draft_chain_before_building_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    args = ["bench", "image_ar", "--scale", "tiny", "--batch-sizes", "1", "8", "--out", str(tmp_path / "bench")]
    assert main([*args, "--draft-chain", "3", "2", "1"]) == 2  # neither one length nor one per batch size
    assert "--draft-chain: one length >= 1, or one per batch size (2: 1 8); got 3 2 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--draft-chain", "0"])
    assert exit_info.value.code == 2 and "expected an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "home").exists()


def test_bench_image_ar_dtype_puts_the_zoo_gpt_and_drafter_in_bf16_and_lossless_rows_still_match(tmp_path,
                                                                                                   monkeypatch):
    """--dtype on the zoo path (the GPU run's bf16): the GPT and its drafter in that dtype, the VQ and judge float32;
    exact SD's greedy tokens still equal greedy AR's (compiled in bf16: the --compile test below)."""
    import torch

    from specmm import zoo
    from specmm.zoo import imagegen

    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    out = tmp_path / "bench"
    assert main(["bench", "image_ar", "--scale", "tiny", "--images", "2", "--batch-sizes", "2", "--window", "4",
                 "--methods", "ar,exact", "--top-k", "8", "--dtype", "bfloat16", "--out", str(out), "--name", "b"]) == 0
    report = json.loads((out / "b.json").read_text())
    assert report["setup"]["GPT and drafter dtype"] == "torch.bfloat16"
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["exact (bs 2)"]["matched"] is True
    models = imagegen.load(zoo.build("imagegen", "tiny"), "cpu", torch.bfloat16)
    assert {p.dtype for p in models.lg.gpt.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in models.drafter.head.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in models.lg.vq.parameters()} == {torch.float32}


@pytest.mark.skipif(bool(stock_generate_problem()), reason=str(stock_generate_problem()))
def test_bench_image_ar_on_a_janus_folder_samples_and_checks_lossless_rows_greedily(tmp_path, monkeypatch):
    """--temperature: HF's and specmm's rows sample (the same draws on every run: HF reseeded, specmm per-row
    generators), so no row is compared with HF's draws; each lossless row's greedy tokens are, GSD's are not."""
    import torch

    import specmm.bench.image_stock as stock
    from tests.image_ar.stock import janus_processor, tiny_janus

    folder, out = tmp_path / "janus", tmp_path / "bench"
    tiny_janus(dtype=torch.float32).save_pretrained(folder)
    janus_processor().save_pretrained(folder)
    real, outputs = stock.run_benchmark, {}

    def keep_outputs(methods, *a, **kw):
        rows, results = real(methods, *a, **kw)
        outputs.update({m.name: [m.run().rows, results[m.name].rows] for m in methods})  # a run after the timed one
        return rows, results

    monkeypatch.setattr(stock, "run_benchmark", keep_outputs)
    assert main(["bench", "image_ar", "--model", str(folder), "--batch-sizes", "2", "--window", "4", "--methods",
                 "ar,sjd,gsd", "--cfg-scale", "3", "--temperature", "1", "--top-k", "6", "--seed", "4", "--out",
                 str(out), "--name", "s"]) == 0
    report = json.loads((out / "s.json").read_text())
    rows = {r["method"].split(" ")[0]: r for r in report["rows"]}
    assert [rows[m]["matched"] for m in ("hf", "ar", "sjd", "gsd")] == [None, True, True, None]
    assert report["setup"]["sampling"] == "T=1, top-k 6, cfg 3.0, seed 4"
    greedy = stock._hf_runner(*_janus_image(folder), ["a red cat on the mat", "a blue dog under the big tree"], 3.0,
                              {"temperature": 0.0, "top_k": 0, "seed": 4})().rows
    for name, (again, timed) in outputs.items():
        assert again == timed and again != greedy, name  # reproducible draws, not the greedy tokens


def _janus_image(folder):
    from specmm.image_ar.models import image_model_for, load_pretrained

    model, processor = load_pretrained(folder, None, __import__("torch").device("cpu"))
    return model, image_model_for(model, processor)
