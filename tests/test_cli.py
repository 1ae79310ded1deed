"""The command line: `ember demo` compiles, checks against numpy and reports speed."""

from ember.cli import main


def test_demo_runs_and_checks(capsys):
    assert main(["demo", "--matmul", "--size", "96"]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "GFLOP/s" in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out
