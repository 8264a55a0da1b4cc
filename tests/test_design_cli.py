"""``shapedtx design`` command line."""

import pytest

from shapedtx.cli import main


def test_design_params(capsys):
    assert main(["design", "--params", "1.739e11", "--seq-len", "2048"]) == 0
    out = capsys.readouterr().out
    assert "80.46" in out  # L* of the 175B anchor
    assert "depth-inefficient" in out
    assert "fixed head size d_p = m" in out and "2048" in out


def test_design_table(capsys):
    assert main(["design", "--table", "gpt3"]) == 0
    out = capsys.readouterr().out
    assert out.count("GPT-3") >= 9  # title + eight rows
    assert "12288" in out and "too deep" in out and "too shallow" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["design", "--params", "-1"],
        ["design", "--params", "0"],
        ["design", "--params", "nan"],
        ["design", "--params", "inf"],
        ["design", "--params", "abc"],
        ["design", "--params", "1e9", "--seq-len", "0"],
        ["design", "--params", "1e9", "--multiple", "0"],
        ["design", "--params", "1e9", "--seq-len", "8", "--head-size", "0"],
        ["design"],
        ["design", "--table", "gpt2"],
        ["design", "--table", "gpt3", "--seq-len", "512"],
        ["design", "--params", "1e9", "--table", "gpt3"],
    ],
)
def test_design_bad_input_is_one_line_exit_2(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err
