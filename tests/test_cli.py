"""`eagle3lab`: --version, and every command's help says what it does in complete sentences."""

import re
from importlib.metadata import version

import pytest

from eagle3lab.cli import COMMANDS, main, usage

SUBCOMMANDS = [(name,) for name in COMMANDS] + [
    ("regen", "bench"),
    ("regen", "onpolicy"),
    ("data", "fetch"),
    ("sglang", "launch-command"),
    ("sglang", "bench"),
]


def test_version_prints_the_installed_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"eagle3lab {version('eagle3lab')}\n"


def test_every_command_has_a_one_sentence_summary(capsys):
    assert main(["--help"]) == 0
    printed = capsys.readouterr().out
    assert printed == usage() + "\n" and "--version" in printed
    for name, (_, _, summary) in COMMANDS.items():
        assert re.fullmatch(r"[A-Z][^\n]*\.", summary), name
        assert f"  {name:<{max(map(len, COMMANDS))}} {summary}\n" in printed


def description(help_text: str) -> str:
    """What argparse prints between the usage and the first section (`options:`, `positional arguments:`, ...)."""
    after_usage = help_text.split("\n\n", 1)[1] if "\n\n" in help_text else ""
    return re.split(r"^[a-z][\w ,-]*:$", after_usage, maxsplit=1, flags=re.M)[0].strip()


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=" ".join)
def test_every_command_help_says_what_it_does_in_complete_sentences(command, capsys):
    try:
        code = main([*command, "--help"])
    except SystemExit as exited:  # argparse exits after printing the help; the doctor returns its code instead
        code = exited.code
    assert code == 0
    text = description(capsys.readouterr().out)
    assert text and text.endswith("."), text


@pytest.mark.parametrize("name", ["bench", "tune"])
def test_bench_and_tune_help_opens_with_the_commands_summary(name, capsys):
    with pytest.raises(SystemExit):
        main([name, "--help"])
    text = " ".join(description(capsys.readouterr().out).split())
    assert text.startswith(COMMANDS[name][2])


def test_bench_help_says_what_bench_measures(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(description(capsys.readouterr().out).split())
    for said in (
        "baseline",
        "each draft",
        "HF peers",
        "same prompts",
        "accept length",
        "tokens/s",
        "speedups",
        "identical",
    ):
        assert said in text, said


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the bad input was refused")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["acceptance", "drafts/does-not-exist"], "eagle3lab acceptance: DRAFT drafts/does-not-exist: nothing there"),
        (["acceptance", "README.md"], "eagle3lab acceptance: DRAFT README.md: a file, not a folder"),
        (["acceptance", "drafts"], "eagle3lab acceptance: DRAFT drafts: no config.json in this folder"),
        (["acceptance", "--depths", "3,x", "drafts/smollm2-original-6960"], "eagle3lab acceptance: --depths '3,x'"),
        (["bench", "--draft", "README.md"], "eagle3lab bench: --draft README.md: a file, not a folder"),
        (["tune", "--draft", "nowhere"], "eagle3lab tune: --draft nowhere: nothing there"),
        (
            ["bench", "--configs", "1,3,x,4", "--draft", "drafts/smollm2-original-6960"],
            "eagle3lab bench: config '1,3,x,4': expected four integers",
        ),
        (["monitor", "nowhere.jsonl"], "eagle3lab monitor: "),
        (["regen", "--input", "nowhere.jsonl", "--output", "out.jsonl"], "eagle3lab regen: input nowhere.jsonl"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_input_is_one_line_naming_the_command_and_what_is_wrong_exit_2(argv, says, capsys, monkeypatch, tmp_path):
    """One error path for every command: no traceback, the command's own flag or argument named, and paths checked
    before any model loads."""
    import eagle3lab.models.target

    monkeypatch.setattr(eagle3lab.models.target, "load_target", _no_model)
    if argv[0] == "regen":
        argv = [a if a != "out.jsonl" else str(tmp_path / a) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(says), err
