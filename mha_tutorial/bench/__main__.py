"""``python -m mha_tutorial.bench COMMAND [options]``: the package's benchmarks, one entry point.

    python -m mha_tutorial.bench attention --quick   # every MHA implementation, time and peak memory
    python -m mha_tutorial.bench decode --quick      # cached against uncached decoding
    python -m mha_tutorial.bench flash --quick       # tiled attention against SDPA's kernels
    python -m mha_tutorial.bench all --quick         # the three in one run, reports in build/bench/{attention,decode,flash}
    python -m mha_tutorial.bench smollm --quick      # SmolLM2-135M: our cached decoding against transformers' generate

``python -m mha_tutorial.bench COMMAND --help`` lists one benchmark's options; ``all`` takes ``--quick`` and
``--out`` and passes them on. Each benchmark checks that its implementations agree before it times anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import attention, decode, flash, smollm

COMMANDS = {"attention": attention.main, "decode": decode.main, "flash": flash.main, "smollm": smollm.main}
ALL = ("attention", "decode", "flash")  # `all`: the benchmarks that need no pretrained weights


def _usage() -> str:
    return (__doc__ or "").strip()


def run_all(argv: list[str]) -> int:
    """Every benchmark, one after another, each into its own folder under ``--out`` (default build/bench)."""
    quick = "--quick" in argv
    rest = [a for a in argv if a != "--quick"]
    out = Path("build/bench")
    if rest[:1] == ["--out"] and len(rest) == 2:
        out = Path(rest[1])
    elif rest:
        raise SystemExit(f"`all` takes only --quick and --out DIR, not {' '.join(rest)}")
    for name in ALL:
        main = COMMANDS[name]
        print(f"== {name}", flush=True)
        code = main([*(["--quick"] if quick else []), "--out", str(out / name)])
        if code:
            return code
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "all":
        return run_all(rest)
    if command not in COMMANDS:
        raise SystemExit(f"unknown benchmark {command!r}; choose one of: {', '.join([*COMMANDS, 'all'])}\n\n{_usage()}")
    return COMMANDS[command](rest)


if __name__ == "__main__":
    raise SystemExit(main())
