"""patches/command_line.py in one process: which parsers end in one line, and when the data is checked
(tests/integration/test_first_run.py runs fairseq's tools themselves)."""
import argparse
import sys

import pytest
from fairseq import options
from patching import out

from fairseq_plugins.errors import ConfigError


def parse(parser, argv, capsys):
    """(exit status, what went to stderr) of ``parser.parse_args(argv)``, which must fail."""
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(argv)
    return exit_.value.code, capsys.readouterr().err


def test_fairseqs_parsers_end_a_wrong_choice_in_one_line_with_the_close_matches(capsys):
    parser = options.get_training_parser()
    code, err = parse(parser, ["data", "--arch", "rnnserch_tiny"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"{parser.prog}: error: --arch/-a rnnserch_tiny: not one of its ")
    assert "choices; did you mean rnnsearch_tiny, " in err
    code, err = parse(parser, ["data", "--arch", "zzzzzz"], capsys)
    assert "choices; none is close" in err
    with out("command_line"):
        code, err = parse(parser, ["data", "--arch", "rnnserch_tiny"], capsys)
        assert code == 2 and err.startswith("usage: ") and err.count("\n") > 100  # fairseq's own


def test_other_programs_parsers_keep_argparses_usage_and_message(capsys):
    parser = argparse.ArgumentParser(prog="mine")
    parser.add_argument("--colour", choices=["red", "green"])
    code, err = parse(parser, ["--colour", "gren"], capsys)
    assert code == 2 and err.startswith("usage: mine") and "invalid choice: 'gren'" in err and "did you" not in err


def test_the_data_directory_is_checked_on_the_tools_command_line_only(tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "data-bn")
    argv = [missing, "--arch", "rnnsearch_tiny"]
    # scripts and tests give their argv, a data directory or not
    assert options.parse_args_and_arch(options.get_training_parser(), argv).data == missing
    monkeypatch.setattr(sys, "argv", ["fairseq-train", *argv])
    with pytest.raises(SystemExit) as exit_:
        options.parse_args_and_arch(options.get_training_parser())
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: data directory {missing}: no such folder "
                                            "(fairseq-preprocess --destdir writes one)\n")


def test_a_suite_error_ends_in_one_line(capsys):
    error = ConfigError("--arch nope: no such model")
    with out("command_line"):
        sys.excepthook(ConfigError, error, None)
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith("ConfigError: --arch nope: no such model")
    sys.excepthook(ConfigError, error, None)
    assert capsys.readouterr().err == "error: --arch nope: no such model\n"
