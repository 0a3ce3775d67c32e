"""A plain (non-editable) install from a built wheel carries its data: the committed splits and checkpoints
load from a directory outside the repository. (Every notebook also runs from such an install and directory:
test_hosted.py executes every notebook there.)"""

import subprocess
import textwrap


def test_wheel_loads_every_checkpoint_and_split_from_elsewhere(wheel_python, tmp_path):
    python, site = wheel_python
    script = textwrap.dedent(
        """
        import mha_tutorial
        from mha_tutorial import load_pretrained, load_split
        print(mha_tutorial.__file__)
        for name in ("reversal", "induction", "dates"):
            model = load_pretrained(name, device="cpu")
            print(name, sum(p.numel() for p in model.parameters()), len(load_split(name, "eval")),
                  len(load_split(name, "importance")))
        """
    )
    out = subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(str(site)), f"imported {lines[0]}, not the installed wheel"
    assert lines[1:] == ["reversal 37466 1000 1000", "induction 37265 1000 1000", "dates 125644 1000 1000"]
