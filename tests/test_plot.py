"""`vrl plot`: metric curves and the layer heatmap as PNG/SVG files, smoothing, errors,
the install hint without matplotlib; without torch."""

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import vrl
from test_views import make_history

from vrl import Repo, views

pytest.importorskip("matplotlib")
from vrl import plots  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def hist(ws):
    repo = Repo.init(ws)
    return repo, make_history(repo)


def png_size(path) -> tuple[int, int]:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def red_pixels(path) -> int:
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(path).convert("RGB")).astype(int)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return int(((r > 180) & (g < 80) & (b < 80)).sum())


def leftovers(folder) -> list[str]:
    return [p.name for p in Path(folder).iterdir() if p.name.endswith(".tmp")]


def test_curves_png_and_svg(hist, capsys, ws):
    code, out, err = vrl(capsys, "plot", "return", "-o", "c.png", "--size", "8x5")
    assert code == 0, err
    assert out == "wrote c.png (PNG): return of 3 runs, 17 points\n"
    assert png_size(ws / "c.png") == (800, 500)
    code, out, err = vrl(capsys, "plot", "return", "main", "exp", "--smooth", "0.9", "--svg")
    assert code == 0, err
    svg = (ws / "curves.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    code, _, err = vrl(capsys, "plot", "loss", "--x", "time", "-o", "t.png")
    assert code == 0, err
    assert png_size(ws / "t.png") == (1000, 600)  # the default 10x6 inches
    assert leftovers(ws) == []


def test_heatmap_png_marks_frozen_layers(hist, capsys, ws):
    code, out, err = vrl(capsys, "plot", "--layers", "exp", "-o", "heat.png")
    assert code == 0, err
    assert out == "wrote heat.png (PNG): 3 layers x 6 snapshots of exp\n"
    width, height = png_size(ws / "heat.png")
    assert (width, height) == (800, 300)  # sized from 6 snapshots x 3 layers (minimums)
    assert red_pixels(ws / "heat.png") > 100  # the frozen hatch (and its legend entry)
    code, _, err = vrl(capsys, "plot", "--layers", "main", "-o", "main.png", "--size", "9x4")
    assert code == 0, err
    assert png_size(ws / "main.png") == (900, 400)
    assert red_pixels(ws / "main.png") == 0  # nothing frozen on main
    code, out, err = vrl(capsys, "plot", "--layers", "exp", "--limit", "2", "--prefix", "",
                         "--svg")
    assert code == 0 and "4 layers x 2 snapshots" in out
    assert "<svg" in (ws / "layers.svg").read_text()


def test_curve_series_smoothing_and_branch_start(hist):
    repo, _ = hist
    runs = {r["name"]: r for r in views.curves(repo, "return")}
    xs, ys, shown, start = plots.curve_series(runs["exp"], 0.5)
    assert xs == [0, 10, 20, 30, 40, 50] and ys == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    # debiased EMA by hand, weight 0.5: e_n = 0.5 e_(n-1) + 0.5 y_n; shown = e_n / (1 - 0.5^n)
    e, want = 0.0, []
    for n, y in enumerate(ys, 1):
        e = 0.5 * e + 0.5 * y
        want.append(e / (1 - 0.5 ** n))
    assert shown == pytest.approx(want)
    assert shown[:2] == pytest.approx([0.0, 2 / 3])  # (0.25) / 0.75
    assert start == 2  # exp is drawn from its branch point (main's step 20) on
    assert plots.curve_series(runs["main"], 0.0)[3] == 0
    _, _, raw, _ = plots.curve_series(runs["main"], 0.0)
    assert raw == [0.0, 1.0, 2.0, 3.0, 4.0]
    xs, *_ = plots.curve_series(runs["main"], 0.0, x="time", t0=views.seconds(
        "2026-11-29T09:00:00.000000Z"))
    assert xs == pytest.approx([i / 60 for i in range(5)])  # hours


@pytest.mark.parametrize("args, message", [
    (["plot", "nope"], "no run has metric 'nope'; metrics: eval/score, loss, return"),
    (["plot", "return", "--smooth", "1"], "smoothing weight 1.0 is not in [0, 1)"),
    (["plot", "return", "-o", "x.jpg"], "cannot write .jpg images: name the file .png or .svg"),
    (["plot", "return", "-o", "x.png", "--svg"], "x.png names a PNG file but --svg asks for "
                                                 "SVG"),
    (["plot", "--layers", "nope"], "unknown revision"),
    (["plot", "--layers", "main", "--limit", "0"], "limit must be at least 1, not 0"),
])
def test_bad_input_is_one_line_and_writes_nothing(hist, capsys, ws, args, message):
    before = sorted(p.name for p in ws.iterdir())
    code, out, err = vrl(capsys, *args)
    assert code == 1 and out == "" and err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in ws.iterdir()) == before


def test_usage_errors(hist, capsys):
    for args in (["plot", "return", "--layers", "main"], ["plot", "return",
                                                                    "--limit", "3"],
                 ["plot", "return", "--size", "big"]):
        code, _, err = vrl(capsys, *args)
        assert code == 2, (args, err)


def test_without_a_metric_it_plots_the_return(hist, capsys, ws):
    code, out, err = vrl(capsys, "plot")
    assert code == 0 and out == "wrote curves.png (PNG): return of 3 runs, 17 points\n", err


def test_without_a_metric_or_a_return_it_asks_for_one(ws, capsys):
    Repo.init(ws)
    code, _, err = vrl(capsys, "plot")
    assert code == 2 and "give a METRIC" in err


def test_images_get_the_mode_the_umask_gives(hist, capsys, ws):
    old = os.umask(0o022)
    try:
        assert vrl(capsys, "plot", "return", "-o", "c.png")[0] == 0
        assert vrl(capsys, "plot", "--layers", "main", "-o", "h.svg")[0] == 0
        assert (ws / "c.png").stat().st_mode & 0o777 == 0o644
        assert (ws / "h.svg").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        assert vrl(capsys, "plot", "return", "-o", "private.png")[0] == 0
        assert (ws / "private.png").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def _cli(cwd, poison, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poison), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", "import sys; from vrl.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_plot_never_imports_torch_and_hints_at_matplotlib(hist, tmp_path):
    repo, _ = hist
    poison = tmp_path / "poison"
    marker = tmp_path / "torch-was-imported"
    for name in ("torch", "nompl/matplotlib"):
        (poison / name).mkdir(parents=True)
    (poison / "torch" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\nraise ImportError('torch is poisoned')\n")
    (poison / "nompl" / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('No module named matplotlib')\n")
    proc = _cli(repo.workdir, poison, "plot", "return", "-o", "c.png")
    assert proc.returncode == 0, proc.stderr
    proc = _cli(repo.workdir, poison, "plot", "--layers", "exp", "-o", "h.png")
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    proc = _cli(repo.workdir, os.pathsep.join([str(poison), str(poison / "nompl")]),
                "plot", "return", "-o", "d.png")
    assert proc.returncode == 1
    assert proc.stderr == "error: plotting needs matplotlib: pip install 'vrl[plots]' (or " \
                          "pip install matplotlib)\n"
    assert not (repo.workdir / "d.png").exists()


def test_dollar_signs_and_control_characters_are_drawn_literally(ws, capsys):
    import numpy as np

    repo = Repo.init(ws)
    for i in range(3):
        repo.commit({"w": np.full(2, i, np.float32)}, env=False, step=i,
                    metrics={"cost$": float(i), "a$b\x1b": 1.0})
    repo.branch("x$y")
    for metric in ("cost$", "a$b\x1b"):
        code, _, err = vrl(capsys, "plot", metric, "-o", "c.png")
        assert code == 0, err
    assert plots._text("a$b\x1b") == "a\\$b\\x1b"
