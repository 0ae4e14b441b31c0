"""The page `dvc plots show` fills, with Vega, Vega-Lite and Vega-Embed inline: plots that render offline.

DVC's own page loads the three libraries from a CDN, so on a machine without internet (where these
pipelines run) its plots are blank. `.dvc/config` points `plots.html_template` at `.dvc/plots.html`,
which `make env` writes with this module from the libraries vl-convert-python bundles (pinned in
requirements.txt). The page has DVC's `{plot_divs}` placeholder and no `{scripts}` one, so DVC adds
no CDN tag; each plot's inline `vegaEmbed(...)` call finds the bundle's `window.vegaEmbed`.

    python -m scripts.pipeline.plots_page [PATH]     # default .dvc/plots.html
"""

from __future__ import annotations

import sys
from pathlib import Path

from scripts.pipeline import atomic

DEFAULT = Path(".dvc") / "plots.html"

PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC Plot</title>
    <script>
BUNDLE
    </script>
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def page() -> str:
    """The page, with the bundle (Vega-Embed as the global `vegaEmbed`, as DVC's plot divs call it)."""
    import vl_convert

    bundle = vl_convert.javascript_bundle("window.vegaEmbed = vegaEmbed;")
    if "</script" in bundle.lower() or "{plot_divs}" in bundle or "{scripts}" in bundle:
        raise RuntimeError("vl-convert's bundle cannot be inlined as is: it holds a script end tag or a placeholder")
    return PAGE.replace("BUNDLE", bundle)


def main(argv: list[str]) -> None:
    import vl_convert

    path = Path(argv[0]) if argv else DEFAULT
    atomic.write_text(path, page())
    print(f"plots page: {path} (Vega {vl_convert.get_vega_version()} inline: no network needed)")


if __name__ == "__main__":
    main(sys.argv[1:])
