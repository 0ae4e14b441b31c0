"""What `clef --version` says: this package's version and the release format it reads."""

from __future__ import annotations


def version() -> str:
    """This command's version and the release format it reads."""
    from importlib import metadata

    try:
        ours = metadata.version("clef-litert")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        ours = "unknown (not installed: pip install -e .)"
    from scripts.release.reader import FORMAT

    return f"clef-litert {ours}, reads release format {FORMAT}"
