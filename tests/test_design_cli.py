"""``shapedtx design`` command line."""

import pytest

from simulations.cli import main


def test_design_params(capsys):
    assert main(["design", "--params", "1.739e11", "--seq-len", "2048"]) == 0
    out = capsys.readouterr().out
    assert "80.46" in out  # L* of the 175B anchor
    assert "above it, where depth and width contribute similarly" in out
    assert "warning" not in out  # inside the range the fit was checked on
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
        ["design", "--params", "1e9", "--head-size", "0"],
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


def test_design_warns_when_extrapolating_and_spends_small_budgets(capsys):
    assert main(["design", "--params", "1e30"]) == 0
    assert "far outside the budgets the fit was checked on" in capsys.readouterr().out
    assert main(["design", "--params", "1e6"]) == 0
    out = capsys.readouterr().out
    spent = float(out.split("rounded shape spends ")[1].split("%")[0])
    assert 95 <= spent <= 105  # the old rounding (depth 3 x width 128) spent 59%
