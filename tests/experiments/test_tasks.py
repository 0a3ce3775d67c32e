"""The three toy tasks: seeded generation, committed splits, and correct date strings."""

import datetime
import re

import pytest
import torch
from torch.overrides import TorchFunctionMode

from mha_tutorial.models.tasks import (
    DATE_FORMATS,
    SPLIT_SEEDS,
    SPLIT_SIZE,
    TASKS,
    get_task,
    is_heldout,
    load_split,
    render_date,
)

NAMES = list(TASKS)


def test_unknown_task_lists_known_ones():
    with pytest.raises(ValueError, match="unknown task 'sorting'.*reversal.*induction.*dates"):
        get_task("sorting")


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_split("reversal", "test")


@pytest.mark.parametrize("name", NAMES)
def test_sampling_is_determined_by_the_seed(name):
    task = get_task(name)
    assert task.sample(50, seed=7) == task.sample(50, seed=7)
    assert task.sample(50, seed=7) != task.sample(50, seed=8)
    b1 = task.make_batch(16, torch.Generator().manual_seed(3))
    b2 = task.make_batch(16, torch.Generator().manual_seed(3))
    b3 = task.make_batch(16, torch.Generator().manual_seed(4))
    assert b1.examples == b2.examples != b3.examples
    for field in ("src", "valid_lens", "tgt_in", "tgt_out", "loss_mask"):
        x, y = getattr(b1, field), getattr(b2, field)
        assert (x is None and y is None) or torch.equal(x, y)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", sorted(SPLIT_SEEDS))
def test_committed_split_matches_regeneration(name, split):
    task = get_task(name)
    committed = load_split(name, split)
    assert len(committed) == SPLIT_SIZE
    assert committed == task.generate_split(split)
    lines = task.split_path(split).read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t") == list(task.columns)


@pytest.mark.parametrize("name", NAMES)
def test_training_never_sees_a_held_out_example(name):
    task = get_task(name)
    heldout_keys = {task.key(ex) for split in SPLIT_SEEDS for ex in load_split(name, split)}
    assert all(is_heldout(k) for k in heldout_keys)
    train_keys = {task.key(ex) for ex in task.sample(5000, seed=123)}
    assert not any(is_heldout(k) for k in train_keys)
    assert not train_keys & heldout_keys
    # The two committed splits come from different seeds.
    assert load_split(name, "eval") != load_split(name, "importance")


def test_reversal_examples():
    task = get_task("reversal")
    for src, tgt in load_split("reversal"):
        assert len(src) == 10 and tgt == src[::-1] and src.isalpha() and src.islower()
    batch = task.collate([("abcdefghij", "jihgfedcba")])
    assert batch.src.tolist() == [list(range(10))]
    assert batch.tgt_out.tolist() == [list(range(9, -1, -1))]
    assert batch.loss_mask.all()


def test_induction_examples_and_loss_mask():
    task = get_task("induction")
    for (seq,) in load_split("induction"):
        n = len(seq) // 2
        assert len(seq) == 2 * n and task.min_run <= n <= task.max_run
        assert seq[:n] == seq[n:] and len(set(seq[:n])) == n  # a run of distinct letters, repeated
    batch = task.collate([("ABCDEFABCDEF",)])
    T = 2 * task.max_run
    assert batch.tgt_in.shape == batch.tgt_out.shape == batch.loss_mask.shape == (1, T)
    assert task.decode(batch.tgt_in[0]) == "ABCDEFABCDEF"
    # Position p predicts token p + 1; only p = 6..10 (predicting B..F of the repeat) count.
    assert batch.loss_mask[0].nonzero().flatten().tolist() == [6, 7, 8, 9, 10]
    assert task.decode(batch.tgt_out[0][batch.loss_mask[0]]) == "BCDEF"
    assert (batch.tgt_in[0, 12:] == task.tgt_stoi["<pad>"]).all()


def test_dates_formats_of_one_known_day():
    day = datetime.date(2026, 11, 21)  # a Saturday
    written = {render_date(day, fmt)[0] for fmt in DATE_FORMATS}
    assert written == {
        "21 Nov 2026",
        "Saturday, November 21, 2026",
        "11/21/26",
        "2026.11.21",
        "November 21st, 2026",
        "21.11.2026",
        "Sat, 21 Nov 2026",
        "21 November 2026",
        "Nov 21, 2026",
        "Saturday 21st November 2026",
    }
    text, spans = render_date(datetime.date(2003, 2, 1), "{Weekday} {dth} {Month} {Y}")
    assert text == "Saturday 1st February 2003"
    assert {f: text[a:b] for f, (a, b) in spans.items()} == {
        "weekday": "Saturday",
        "day": "1st",
        "month": "February",
        "year": "2003",
    }


MONTH_NAMES = [datetime.date(2000, m, 1).strftime("%B") for m in range(1, 13)]


def parse_human_date(text: str) -> tuple[datetime.date, str | None]:
    """An independent reader of the source strings: (date, weekday name written, or None)."""
    if m := re.fullmatch(r"(\d{4})\.(\d{2})\.(\d{2})", text):
        return datetime.date(int(m[1]), int(m[2]), int(m[3])), None
    if m := re.fullmatch(r"(\d{2})\.(\d{2})\.(\d{4})", text):
        return datetime.date(int(m[3]), int(m[2]), int(m[1])), None
    if m := re.fullmatch(r"(\d{1,2})/(\d{1,2})/(\d{2})", text):
        yy = int(m[3])
        return datetime.date(1900 + yy if yy >= 50 else 2000 + yy, int(m[1]), int(m[2])), None
    words = re.findall(r"[A-Za-z]+", text)
    weekday = next(
        (
            w
            for w in words
            if any(
                d.startswith(w) for d in ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
            )
        ),
        None,
    )
    month = next(i + 1 for i, name in enumerate(MONTH_NAMES) for w in words if w in (name, name[:3]))
    (year,) = re.findall(r"\b\d{4}\b", text)
    (day, suffix) = re.findall(r"\b(\d{1,2})(st|nd|rd|th)?\b", text.replace(year, ""))[0]
    if suffix:
        expected = "th" if int(day) in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(int(day) % 10, "th")
        assert suffix == expected, f"wrong ordinal suffix in {text!r}"
    return datetime.date(int(year), month, int(day)), weekday


@pytest.mark.parametrize("split", sorted(SPLIT_SEEDS))
def test_committed_dates_are_correct(split):
    rows = load_split("dates", split)
    assert {fmt for _, _, fmt in rows} == set(DATE_FORMATS)  # every format is evaluated
    for src, tgt, fmt in rows:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", tgt), tgt
        day = datetime.date.fromisoformat(tgt)
        assert datetime.date(1950, 1, 1) <= day <= datetime.date(2049, 12, 31)
        parsed, weekday = parse_human_date(src)
        assert parsed == day, (src, tgt)
        if weekday is not None:
            assert day.strftime("%A").startswith(weekday), f"{src!r}: {tgt} is a {day.strftime('%A')}"
        assert render_date(day, fmt)[0] == src


def test_dates_batches_are_padded_with_valid_lens():
    task = get_task("dates")
    rows = [
        ("11/21/26", "2026-11-21", "{m}/{d}/{yy}"),
        ("Saturday, November 21, 2026", "2026-11-21", "{Weekday}, {Month} {d}, {Y}"),
    ]
    batch = task.collate(rows)
    assert batch.src.shape == (2, 27) and batch.valid_lens.tolist() == [8, 27]
    assert (batch.src[0, 8:] == task.src_stoi["<pad>"]).all()
    assert task.decode(batch.src[0], side="src") == "11/21/26"
    assert task.decode(batch.tgt_out[1]) == "2026-11-21"
    assert task.decode(batch.tgt_in[1], strip_special=False) == "<bos>2026-11-2"


def test_encode_rejects_unknown_characters():
    with pytest.raises(ValueError, match="'#' is not in the src vocabulary"):
        get_task("dates").encode("21#11")
    task = get_task("reversal")
    assert task.decode(task.encode("hello"), side="src") == "hello"


def test_decode_and_encode_refuse_what_would_silently_mislead():
    task = get_task("reversal")
    with pytest.raises(ValueError, match=r"ids must be ints in \[0, .*got \[-1\]"):
        task.decode([3, -1])  # -1 would read the vocabulary's last token
    with pytest.raises(ValueError, match="got \\[99\\]"):
        task.decode(torch.tensor([99]))
    for call in (lambda: task.decode([3], side="target"), lambda: task.encode("abc", side="source")):
        with pytest.raises(ValueError, match="side must be 'src' or 'tgt'"):
            call()


# ---------------------------------------------------------------- bad input: a clear error, before any tensor is built


class _NoTorch(TorchFunctionMode):
    """Inside this block any torch function (a tensor built, any arithmetic) fails the test."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        raise AssertionError(f"torch ran {func} before the input was validated")


def _good_example(name):
    return load_split(name)[0]


@pytest.mark.parametrize("name", NAMES)
def test_collate_rejects_what_is_not_a_list_of_string_tuples(name):
    task = get_task(name)
    good = _good_example(name)
    bad_inputs = {
        "a string": "".join(good),
        "None": None,
        "a string for an example": [good[0]],
        "ints in an example": [tuple(1 for _ in good)],
        "None in an example": [(None, *good[1:])],
    }
    for what, examples in bad_inputs.items():
        with _NoTorch(), pytest.raises(TypeError, match="collate takes|example 0 must") as info:
            task.collate(examples)
        assert name in str(info.value) or str(task.columns) in str(info.value), (what, info.value)


@pytest.mark.parametrize("name", NAMES)
def test_collate_rejects_an_empty_list(name):
    with _NoTorch(), pytest.raises(ValueError, match=f"at least one example of task '{name}', got none"):
        get_task(name).collate([])


@pytest.mark.parametrize("name", NAMES)
def test_collate_rejects_examples_with_the_wrong_number_of_fields(name):
    task = get_task(name)
    good = _good_example(name)
    for example in (good + ("extra",), good[:-1]):
        with (
            _NoTorch(),
            pytest.raises(ValueError, match=rf"must have {len(task.columns)} strings .* got {len(example)}"),
        ):
            task.collate([good, example])


@pytest.mark.parametrize("name", NAMES)
def test_collate_rejects_characters_outside_the_vocabulary(name):
    task = get_task(name)
    good = _good_example(name)
    side = "tgt" if name == "induction" else "src"  # induction's sequence is read in its tgt vocabulary
    with _NoTorch(), pytest.raises(ValueError, match=f"{name}: character '#' is not in the {side} vocabulary"):
        task.collate([good, ("#" + good[0][1:], *good[1:])])


def test_collate_rejects_lengths_it_cannot_put_in_one_batch():
    bad = {
        "reversal": (
            [("abcdefghij", "jihgfedcba"), ("abc", "cba")],
            "must all have one length .* got \\('abc', 'cba'\\)",
        ),
        "induction": ([("ABCABCA",)], "an even number of letters up to 24; got 'ABCABCA' \\(7 letters\\)"),
        "dates": (
            [("21 Nov 2026", "2026-11-2", "{d} {Mon} {Y}")],
            "a target is a 10-character date .* got '2026-11-2'",
        ),
    }
    for name, (examples, message) in bad.items():
        with _NoTorch(), pytest.raises(ValueError, match=message):
            get_task(name).collate(examples)
    with _NoTorch(), pytest.raises(ValueError, match="up to 24; got 'ABCDEFGHIJKLMABCDEFGHIJKLM'"):
        get_task("induction").collate([("ABCDEFGHIJKLMABCDEFGHIJKLM",)])  # a run of 13: longer than max_run


def test_encode_rejects_what_is_not_a_string():
    task = get_task("reversal")
    for text in (5, None, ["a", "b"]):
        with pytest.raises(TypeError, match=f"reversal: encode takes a string, got {type(text).__name__}"):
            task.encode(text)


@pytest.mark.parametrize(
    "batch_size, error",
    [(0, ValueError), (-3, ValueError), (2.5, TypeError), ("4", TypeError), (True, TypeError), (None, TypeError)],
)
def test_make_batch_rejects_a_batch_size_that_is_not_a_positive_int(batch_size, error):
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    with pytest.raises(error, match=f"batch_size must be a positive int, got {re.escape(repr(batch_size))}"):
        get_task("dates").make_batch(batch_size, generator)
    assert torch.equal(generator.get_state(), state)  # refused before a random number was drawn
