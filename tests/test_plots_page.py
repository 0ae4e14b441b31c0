"""scripts/pipeline/plots_page.py: the page `dvc plots show` fills holds Vega inline, so plots render offline."""

from __future__ import annotations

import re
import subprocess
import sys

from dvc_render import render_html
from dvc_render.vega import VegaRenderer

from scripts.pipeline import atomic, plots_page
from tests.conftest import ROOT

REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=", re.I)


def rendered(tmp_path, template: str | None) -> str:
    """A page as DVC renders it for one vega plot, on the page `template` (None: DVC's own)."""
    renderer = VegaRenderer([{"L": 64, "err": 1e-6, "rev": "workspace"}], "error_vs_length", x="L", y="err")
    path = None
    if template is not None:
        path = tmp_path / "plots.html"
        path.write_text(template)
    out = tmp_path / "index.html"
    render_html(renderers=[renderer], output_file=out, html_template=path)
    return out.read_text()


def test_dvc_fills_the_page_with_no_script_from_the_network(tmp_path):
    ours = rendered(tmp_path, plots_page.page())
    assert not REMOTE_SCRIPT.search(ours) and "window.vegaEmbed" in ours and "vegaEmbed('#error_vs_length'" in ours
    # what the page guards against: DVC's own page loads Vega from a CDN, blank offline
    assert REMOTE_SCRIPT.search(rendered(tmp_path, None))


def test_make_env_writes_it_readable(tmp_path):
    path = tmp_path / ".dvc" / "plots.html"
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.pipeline.plots_page", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0 and "no network needed" in proc.stdout, proc.stderr
    assert path.read_text() == plots_page.page() and path.stat().st_mode & 0o777 == atomic.ordinary_mode()
