"""Entry point: argument parsing and the one-line error contract (tracebacks only with --debug)."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

# The command runs this checkout's `scripts` library. Put the checkout first on the path: a stray
# top-level `scripts/` directory in site-packages (xdsl, a litert-torch dependency, installs one)
# would otherwise be taken for it as a namespace package.
CHECKOUT = str(Path(__file__).resolve().parents[2])
if CHECKOUT not in sys.path:
    sys.path.insert(0, CHECKOUT)

EXIT_FAILED = 1  # the command ran and found a problem (verify, audit)
EXIT_BAD_INPUT = 2  # the command could not run on what it was given


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="clef", description="Run, verify and audit a clef-litert release.")
    ap.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    from scripts.clef.about import version

    ap.add_argument("--version", action="version", version=version())
    sub = ap.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="tokenize, run a row graph (or a pair), print hidden states and top tokens")
    run.add_argument("--text", required=True, help="the text (with --pair: the shared context)")
    run.add_argument("--release", default="artifacts/release", help="release directory (default: %(default)s)")
    run.add_argument("--pair", action="store_true", help="run --text as a shared prefix and each --question after it")
    run.add_argument("--question", action="append", default=[], help="a question for --pair (repeatable)")
    run.add_argument("--top", type=int, default=5, help="lm_head tokens to show (default: %(default)s)")
    run.add_argument(
        "--signature",
        help="the graph to run, by its name (row_L128) or a signature's (prefix_P256_S64); "
        "default: the smallest that fits",
    )
    run.add_argument("--gpu", action="store_true", help="run on LiteRT's GPU accelerator alone (default: the CPU)")
    run.add_argument(
        "--precision",
        help="with --gpu: fp32, fp16 or mixed (fp16 storage, fp32 accumulation; default: mixed), shown by its "
        "effect on a probe graph before the release is run",
    )
    run.add_argument(
        "--weights",
        help="checkpoint directory holding embed_tokens and lm_head, for a release "
        "that references them instead of including them",
    )

    verify = sub.add_parser("verify", help="check a release: hashes, metadata, every signature on its reference record")
    verify.add_argument("release", help="a release directory, or its .tar.zst tarball")
    verify.add_argument(
        "--key",
        metavar="PUB.pem",
        help="the public key the release must be signed with: its signature is checked first, and a release "
        "that fails it loads no file",
    )
    verify.add_argument(
        "--require-signature",
        action="store_true",
        help="fail an unsigned release (needs --key)",
    )
    verify.add_argument(
        "--gpu",
        action="store_true",
        help="also run every signature on LiteRT's GPU accelerator alone, in fp32, fp16 and mixed modes",
    )
    verify.add_argument(
        "--json",
        action="store_true",
        help="print one JSON report on stdout (each graph's figures beside the release's, the signature, the "
        "problems); the lines go to stderr",
    )

    audit = sub.add_parser("audit", help="what produced a .tflite, from its metadata, and whether a manifest agrees")
    audit.add_argument("file", help="a .tflite produced by clef-litert")

    keys = sub.add_parser(
        "keys", help="make a key pair to sign releases with (encrypted if $CLEF_SIGNING_KEY_PASSWORD is set)"
    )
    keys.add_argument(
        "directory",
        nargs="?",
        default=str(Path.home() / ".config" / "clef-litert"),
        help="where to write release.key and release.pub, outside the repository (default: %(default)s)",
    )

    pull = sub.add_parser("pull", help="dvc pull, after checking that the DVC remote answers and holds data")
    pull.add_argument("--remote", help="the DVC remote (default: the repository's default remote)")
    pull.add_argument("targets", nargs="*", help="what to pull (default: everything dvc.lock names)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        import scripts  # noqa: F401  (quiets third-party import noise)
        from scripts.clef import commands

        return getattr(commands, args.command)(args)
    except Exception as exc:  # noqa: BLE001  (the one place that turns any failure into one line)
        if args.debug:
            raise
        from scripts.pipeline.errors import ClefError

        message = " ".join(str(exc).split())
        if not isinstance(exc, ClefError):
            message = f"{type(exc).__name__}: {message} (rerun with --debug for the traceback)"
        print(f"error: {message}", file=sys.stderr, flush=True)
        failure = exc
    # The line is the last thing on stderr: a graph the failed command still held (in the frames the
    # exception keeps) is destroyed here, and LiteRT logs each accelerator it tears down on fd 2.
    runtime = sys.modules.get("scripts.litert.gpu_accelerator")  # imported by whatever opened a graph
    if runtime is not None:
        with runtime.captured_stderr():
            del failure
            gc.collect()
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
