"""What a newcomer meets in the first hour: every mistake below gets one line naming the flag and exit 2 before
any model loads or any zoo entry builds; --help shows defaults and choices; every job command takes --resume;
Ctrl-C while the command is still importing gives one line; tiny-scale reports carry one banner."""

from __future__ import annotations

import argparse
import builtins
import json
from pathlib import Path

import pytest
from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast

import specmm_launcher
from specmm import zoo
from specmm.bench.report import TINY_WARNING, BenchReport, BenchRow
from specmm.cli import build_parser, main, option_names, user_facing
from specmm.cli.common import ZOO_SCALES

FIXTURES = Path("/work/shared/fixtures/llamagen")


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load or zoo build fails the test: the refusals below must come before both."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded or a zoo entry built before the input was refused")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(zoo, "build", refuse)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("specmm: error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("specmm: error: ")


def saved_lm(folder: Path, vocab: int, tokenizer: bool = False) -> str:
    """A config-only Llama folder (nothing here may load its weights), with a word-level tokenizer if asked."""
    LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(folder)
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers

        words = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(folder)
    return str(folder)


def vlm_drafter_folder(folder: Path) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"method": "vispec", "transformers_version": "5.25.0",
                                                    "hidden_size": 32}))
    return str(folder)


# (argv with {tmp}, the start of the one error line)
MISTAKES = [
    (["zoo", "build", "nosuch"], "NAME: unknown zoo entry 'nosuch'"),
    (["zoo", "build", "code", "--scale", "cpu-long"], "--scale: zoo entry 'code' has no scale 'cpu-long'"),
    (["reason", "--policy", "specreason", "--threshold", "7", "--out", "{tmp}/r.jsonl", "--max-new-tokens", "1024"],
     "--max-new-tokens: 1024 new tokens"),
    (["caption", "--target", "{tmp}/none", "--drafter", "prompt-lookup", "--images", "{tmp}/no-such-folder",
      "--out", "{tmp}/caps.jsonl"], "--images: '{tmp}/no-such-folder' does not exist"),
    (["caption", "--target", "{tmp}/none", "--drafter", "prompt-lookup", "--images", "{tmp}",
      "--out", "/proc/specmm-test/caps.jsonl"], "--out: /proc/specmm-test/caps.jsonl cannot be written"),
    (["distill-draft", "--target", "{target}", "--draft", "{other_vocab}", "--text", "{text}", "--out", "{tmp}/d"],
     "--draft: {other_vocab} has a vocabulary of 48 tokens, the target's has 64"),
    (["distill-draft", "--target", "{target}", "--draft", "{target}", "--text", "{empty}", "--out", "{tmp}/d"],
     "--text: the files hold 0 tokens"),
    (["sample-images", "--gpt-ckpt", str(FIXTURES / "gpt_c2i.pt"), "--vq-ckpt", str(FIXTURES / "vq.pt"),
      "--gpt-config", str(FIXTURES / "gpt_c2i_config.json"), "--vq-config", str(FIXTURES / "vq_config.json"),
      "--classes", "1", "--per-class", "1", "--method", "lantern", "--drafter", "{vlm_drafter}", "--out", "{tmp}/i"],
     "--drafter: {vlm_drafter} is not an image drafter folder"),
    (["distill-draft", "--target", "{target}", "--draft", "{target}", "--text", "{latin1}", "--out", "{tmp}/d"],
     "--text: {latin1} is not UTF-8 text"),
]


@pytest.mark.parametrize("argv, expected", MISTAKES, ids=lambda v: v[0] if isinstance(v, list) else None)
def test_a_mistake_gets_one_line_naming_the_flag_and_exit_2_before_any_model_loads(argv, expected, tmp_path,
                                                                                  capsys, no_loading, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    (tmp_path / "text.txt").write_text("a a a\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "picture.png").write_bytes(b"")
    values = {"tmp": str(tmp_path), "target": saved_lm(tmp_path / "target", 64, tokenizer=True),
              "other_vocab": saved_lm(tmp_path / "other", 48), "text": str(tmp_path / "text.txt"),
              "empty": str(tmp_path / "empty.txt"), "latin1": str(tmp_path / "latin1.txt"),
              "vlm_drafter": vlm_drafter_folder(tmp_path / "vispec")}
    argv = [a.format(**values) for a in argv]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith(expected.format(**values)), line
    assert not (tmp_path / "home" / "zoo").exists()


def test_the_iconv_hint_runs_as_printed(tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    saved_lm(tmp_path / "target", 64, tokenizer=True)
    assert main(["distill-draft", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "target"),
                 "--text", str(tmp_path / "latin1.txt"), "--out", str(tmp_path / "d")]) == 2
    line = one_error_line(capsys)
    command = line.split("`")[1]
    assert command.startswith("iconv -f ") and " -t UTF-8 " in command and " > " in command


def test_a_hub_id_that_cannot_be_reached_says_so(tmp_path, capsys, no_loading, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "picture.png").write_bytes(b"")
    assert main(["caption", "--target", "llava-hf/llava-1.5-7b-hf", "--drafter", "prompt-lookup",
                 "--images", str(tmp_path), "--out", str(tmp_path / "caps.jsonl")]) == 2
    line = one_error_line(capsys)
    assert line.startswith("--target: llava-hf/llava-1.5-7b-hf is not a local folder, and the Hugging Face Hub "
                           "could not give it")
    assert "hf download llava-hf/llava-1.5-7b-hf" in line


def test_every_option_of_every_command_has_help_and_help_shows_defaults_and_choices():
    parser = build_parser()

    def walk(p):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)
            else:
                yield p, action

    missing = [f"{p.prog} {a.option_strings or a.dest}" for p, a in walk(parser) if not a.help]
    assert missing == []
    commands = parser._subparsers._group_actions[0].choices
    demo = " ".join(commands["demo"].format_help().split())
    assert "--scale {tiny,cpu,gpu,cpu-long,cpu-deep}" in demo and "trains for minutes" in demo
    assert "(default: cpu)" in demo
    caption = " ".join(commands["caption"].format_help().split())
    assert "(default: 8)" in caption and "(default: float32)" in caption


def test_the_scale_choices_are_the_zoo_scales():
    assert set(ZOO_SCALES) == {scale for entry in zoo.REGISTRY.values() for scale in entry.recipes}


@pytest.mark.parametrize("command", ["train-drafter", "distill-draft", "train-image-drafter", "caption", "reason",
                                     "sample-images", "sample-continuous"])
def test_every_job_command_takes_resume(command):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    assert any("--resume" in a.option_strings for a in sub._actions)


def test_ctrl_c_while_importing_prints_one_line(monkeypatch, capsys):
    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "specmm.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert specmm_launcher.main() == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specmm: interrupted") and "Traceback" not in err


def test_library_argument_names_are_shown_as_the_flags_that_set_them():
    names = option_names(build_parser(), ["reason", "--policy", "random"])
    assert user_facing("max_new_tokens: too many", names) == "--max-new-tokens: too many"
    assert user_facing("tokens: not an option here", names) == "tokens: not an option here"
    assert user_facing("no prefix at all", names) == "no prefix at all"


def test_tiny_reports_carry_the_banner_and_others_do_not():
    row = BenchRow(method="target only", tokens_per_s=1.0, speedup=1.0, mean_accepted=None, matched=None,
                   new_tokens=8, median_s=1.0)
    tiny = BenchReport(name="x", command="specmm bench core --scale tiny", rows=[row], setup={})
    assert tiny.table().startswith(f"**{TINY_WARNING}**") and TINY_WARNING in tiny.markdown()
    zoo_tiny = BenchReport(name="x", command="specmm demo", rows=[row], setup={"models": "zoo 'code' (tiny) at /x"})
    assert zoo_tiny.tiny
    real = BenchReport(name="x", command="specmm bench core --scale cpu", rows=[row], setup={"scale": "cpu"})
    assert TINY_WARNING not in real.markdown()


def test_zoo_list_columns_line_up(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path))
    assert main(["zoo", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(zoo.REGISTRY) + 1
    built_column = lines[0].index("built")
    assert all(line[built_column - 2: built_column] == "  " for line in lines)


def test_the_zoo_captioner_prompt_format_is_its_processors_chat_template():
    """`specmm caption`'s default prompt is what the zoo captioner and its drafters were trained on (a prompt off
    that format left a ViSpec drafter with nothing accepted)."""
    from specmm.vlm.caption import DEFAULT_PROMPT, caption_prompt
    from specmm.zoo import captioner

    recipe = captioner.RECIPES["tiny"]
    tokenizer = captioner.train_tokenizer(recipe["vocab_size"], 32)
    processor = captioner.make_processor(tokenizer, recipe)
    assert caption_prompt(processor, DEFAULT_PROMPT) == captioner.PROMPT
    assert caption_prompt(processor, "<image>\nas it is") == "<image>\nas it is"  # a whole prompt is sent unchanged
    processor.chat_template = None
    assert caption_prompt(processor, DEFAULT_PROMPT) == DEFAULT_PROMPT  # no template: the image token comes later
