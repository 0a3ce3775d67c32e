"""What every exercise check does, tested once over all of them (mha_tutorial.checks.__all__).

The checks of each notebook have their own tests for the mistakes they recognise; here: a stub
of an exercise is reported as "not attempted yet" (not raised; in strict mode, a failure), a crash of the learner's
code becomes a CheckFailed naming the case, and crashes we can explain are explained."""

import pytest

from mha_tutorial import checks
from mha_tutorial.checks._common import call

CHECKS = [getattr(checks, name) for name in checks.__all__ if name.startswith("check_")]


def test_every_exercise_has_a_check():
    assert len(CHECKS) >= 22


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a_stub_is_reported_not_raised(check, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError("write me")

    assert check(stub) is None
    assert f"{check.__name__}: not attempted yet (write me)" in capsys.readouterr().out


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_in_strict_mode_a_stub_fails(check, monkeypatch, capsys):
    """Graders: MHA_TUTORIAL_STRICT_CHECKS=1 turns "not attempted yet" into a failed check."""
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")

    def stub(*args, **kwargs):
        raise NotImplementedError("write me")

    with pytest.raises(checks.CheckFailed, match=rf"{check.__name__}: not attempted \(write me\)"):
        check(stub)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "0")
    assert check(stub) is None  # any other value: the friendly report


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a_crash_names_the_case(check):
    def crash(*args, **kwargs):
        raise IndexError("boom")

    with pytest.raises(checks.CheckFailed, match="your function raised IndexError: boom"):
        check(crash)


def test_known_crashes_are_explained():
    import torch

    def view_after_permute(x):
        return x.permute(1, 0).view(-1)

    with pytest.raises(checks.CheckFailed, match=r"use \.reshape\(\)"):
        call(view_after_permute, torch.zeros(2, 3), case="a (2, 3) input")

    def bad_broadcast(x):
        return x + torch.zeros(4)

    with pytest.raises(checks.CheckFailed, match="broadcasting lines up their \\*last\\* axes"):
        call(bad_broadcast, torch.zeros(2, 3), case="a (2, 3) input")

    def max_without_values(x):
        return x - x.max(dim=-1, keepdim=True)

    with pytest.raises(checks.CheckFailed, match=r"use \.values, or torch\.amax"):
        call(max_without_values, torch.zeros(2, 3), case="a (2, 3) input")


def test_every_check_is_one_function_under_both_names():
    # checks.check_x and checks.nbNN.check_x used to differ (only the first reported a stub as not attempted).
    from mha_tutorial.checks import (
        nb01,
        nb01a,
        nb02,
        nb03,
        nb04,
        nb04a,
        nb05,
        nb05a,
        nb06,
        nb07,
        nb08,
        nb09,
        nb10,
        nb11,
        nb12,
        nb13,
        nb14,
    )

    modules = (nb01, nb01a, nb02, nb03, nb04, nb04a, nb05, nb05a, nb06, nb07, nb08, nb09, nb10, nb11, nb12, nb13, nb14)
    names = [name for module in modules for name in module.__all__]
    assert sorted(names) == sorted(n for n in checks.__all__ if n.startswith("check_"))
    for module in modules:
        for name in module.__all__:
            assert getattr(checks, name) is getattr(module, name), name
