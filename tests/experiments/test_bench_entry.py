"""``python -m mha_tutorial.bench``: one entry point that hands each command to its benchmark, and ``all`` runs the
three with the same --quick and --out (each benchmark's own run is tested beside it: test_bench, test_bench_decode,
test_bench_flash)."""

import pytest

from mha_tutorial.bench import __main__ as entry


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    fakes = {name: (lambda argv, name=name: calls.append((name, argv)) or 0) for name in entry.COMMANDS}
    monkeypatch.setattr(entry, "COMMANDS", fakes)
    return calls


def test_a_command_gets_the_rest_of_the_line(recorded):
    assert entry.main(["decode", "--quick", "--threads", "1"]) == 0
    assert recorded == [("decode", ["--quick", "--threads", "1"])]


def test_all_runs_every_benchmark_into_its_own_folder(recorded, tmp_path):
    assert entry.main(["all", "--quick", "--out", str(tmp_path)]) == 0
    assert recorded == [(name, ["--quick", "--out", str(tmp_path / name)]) for name in ("attention", "decode", "flash")]


def test_all_stops_at_the_first_failure(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(
        entry, "COMMANDS", {"attention": lambda argv: calls.append("a") or 3, "decode": lambda argv: calls.append("d")}
    )
    assert entry.main(["all", "--out", str(tmp_path)]) == 3 and calls == ["a"]


def test_every_benchmark_is_reachable_and_named_in_the_usage():
    assert set(entry.COMMANDS) == {"attention", "decode", "flash", "smollm"}
    assert entry.ALL == ("attention", "decode", "flash")  # `all` needs no pretrained weights
    assert all(f"bench {name}" in entry.__doc__ for name in [*entry.COMMANDS, "all"])


@pytest.mark.parametrize(
    "argv, message",
    [(["tiled"], "unknown benchmark 'tiled'"), (["all", "--seq", "64"], "only --quick and --out")],
)
def test_bad_commands_are_refused_with_the_choices(recorded, argv, message):
    with pytest.raises(SystemExit, match=message):
        entry.main(argv)
    assert recorded == []


def test_no_command_prints_the_usage_and_fails(recorded, capsys):
    assert entry.main([]) == 2 and "python -m mha_tutorial.bench" in capsys.readouterr().out
    assert entry.main(["--help"]) == 0
