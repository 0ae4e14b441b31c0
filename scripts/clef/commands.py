"""The commands. Each returns an exit status; bad input raises ClefError (one line, exit 2)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from scripts.pipeline.errors import ClefError, first_of
from scripts.pipeline.records import Record, optional
from scripts.release import reader, references, signing
from scripts.release.manifest import ArtifactEntry, Artifacts, GpuFigures, Manifest

TOKEN_INPUTS = ("embeds", "valid", "cos", "sin")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- run ---------------------------------------------------------------------------------------


def open_host(root: Path, manifest: Manifest, weights: str | None):
    """The host tables of a release: its own bf16 embed_tokens / lm_head, or a checkpoint's
    (--weights), checked against the hashes the manifest records."""
    from scripts.qwen35.host import Host

    section = manifest.host
    if weights is None and section.weights != "include":
        raise ClefError(
            "this release references embed_tokens and lm_head instead of including them "
            f"({manifest.model.repo}@{manifest.model.revision[:12]}): pass --weights CHECKPOINT_DIR"
        )
    host = Host(root / "host", weights=Path(weights) if weights else None)
    if weights is not None:
        tables = reader.host_tables(host)
        for role, info in section.tensors.items():
            if reader.tensor_sha256(tables[role]) != info.sha256:
                raise ClefError(f"{role} in {weights} is not the one this release was built with (sha256 differs)")
    return host


def summarize(vector) -> str:
    return (
        f"norm {float(vector.norm()):.4g}, mean {float(vector.mean()):.4g}, std {float(vector.std()):.4g}, "
        f"min {float(vector.min()):.4g}, max {float(vector.max()):.4g}"
    )


def top_tokens(host, vector, k: int) -> str:
    import torch

    logits = host.logits(vector)
    values, ids = torch.topk(logits, min(k, logits.shape[-1]))
    return ", ".join(
        f"{host.tokenizer.decode([int(i)])!r} ({int(i)}) {float(v):.3f}" for v, i in zip(values, ids, strict=True)
    )


def smallest(candidates: list, fits, what: str, need: str):
    fitting = [c for c in candidates if fits(c)]
    if not fitting:
        raise ClefError(f"{need}: no {what} in this release is large enough")
    return fitting[0]


def utf8(value: str, option: str) -> str:
    """An argument the tokenizer can take: argv bytes that are not UTF-8 reach Python as surrogate
    escapes, which it refuses with an exception that does not say so; named here by the first bad byte."""
    try:
        raw = value.encode("utf-8", "surrogateescape")  # the bytes as given on the command line
    except UnicodeEncodeError as exc:  # a surrogate no byte escapes to (main() given such a str)
        where = f"U+{ord(value[exc.start]):04X} at character {exc.start}"
        raise ClefError(f"{option} is not valid UTF-8 (unpaired surrogate {where})") from None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClefError(f"{option} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    return value


# A graph file this large is hashed with a line saying so (a real-width bundle: ~27 GB, tens of seconds).
ANNOUNCE_HASH_BYTES = 2**30


def check_graph(root: Path, manifest: Manifest, name: str) -> None:
    """Refuse to load graph `name` unless the file that holds it is the one the manifest names for it:
    every manifest path inside the release and listed (reader.check_paths), the file's own metadata and
    signatures saying it is this graph (kind, L or P/S, shapes: read from its head, cheap), then its
    size and sha256 against `files` (the whole file read: what the manifest records, reader.changed)."""
    paths = reader.check_paths(root, manifest)
    if paths:
        raise ClefError(f"{root / reader.MANIFEST}: {first_of(paths)}")
    file = manifest.artifacts[name].file
    if not (root / file).is_file():
        raise ClefError(f"{root / file}, which holds {name}, is missing")
    differs = reader.graph_identity(root, manifest, name)
    if not differs:
        entry = manifest.files[file]
        if entry.size >= ANNOUNCE_HASH_BYTES:
            progress(f"run: hashing {file} ({entry.size / 1e9:.1f} GB) against the manifest before loading it")
        differs = [why] if (why := reader.changed(root, file, entry)) else []
    if differs:
        raise ClefError(f"{root / file} is not the {name} the manifest names: {'; '.join(differs)}; not running it")


def finite(hidden, graph: str) -> None:
    """Hidden states [positions, H] at the real positions that may be shown: any NaN or inf there is an
    error naming the graph and how many positions have one, never printed as an answer."""
    import torch

    bad = int((~torch.isfinite(hidden)).flatten(1).any(dim=1).sum())
    if bad:
        raise ClefError(
            f"{graph} gave hidden states that are not finite (NaN or inf) at {bad} of {hidden.shape[0]} "
            "real positions: no answer to show"
        )


def graph_signatures(root: Path, art: ArtifactEntry, gpu: bool, precision: str | None):
    """`signature(name)` over a release graph, by the graph's own signature names (None: a row's only
    one), in the file that holds it (a bundle: under its names there), each a callable on named torch
    tensors: LiteRT's interpreter on the CPU (the file as stored: integer weights run XNNPACK's dynamic
    kernels, what a device's CPU runs), or the file compiled for the GPU accelerator alone in `precision`
    (through LiteRT's C API, scripts/litert/gpu_accelerator.py)."""
    path = root / art.file
    if not gpu:
        from scripts.checks.tflite_check import interpreter

        graph = interpreter(path, dynamic_kernels=True)
        return references.renamed(references.interpreter_signature(graph), art.signature_names)
    from scripts.litert import gpu_accelerator, tflite_file

    compiled = gpu_accelerator.compile(path, precision, tflite_file.census(path))
    progress(f"{path.name}: compiled for the GPU accelerator alone in {precision} on {compiled.adapter}")
    return references.renamed(compiled.signature, art.signature_names)


def chosen(arts: Artifacts, signature: str, kind: str) -> tuple[str, ArtifactEntry]:
    """The graph --signature names (a graph's name, e.g. row_L128, or one of its signatures' names in the
    release, e.g. prefix_P256_S64), which must be of `kind`."""
    for name, art in arts.items():
        if signature == name or signature in art.signature_names.values():
            if art.kind != kind:
                need = "--pair" if art.kind == "pair" else "no --pair"
                raise ClefError(f"--signature {signature} is a {art.kind}'s: it needs {need}")
            return name, art
    known = sorted(n for a in arts.values() for n in a.signature_names.values())
    raise ClefError(f"--signature {signature}: no such signature in this release (it has {', '.join(known)})")


def gpu_precision(args) -> str | None:
    """--precision, checked before any work (it needs --gpu; default mixed), then shown by its effect on
    the precision probe: a mode this runtime ignores is one line, before the release is opened."""
    from scripts.litert import litert_c

    if not args.gpu:
        if args.precision is not None:
            raise ClefError("--precision needs --gpu")
        return None
    mode = litert_c.check_mode(args.precision or "mixed")
    from scripts.litert import gpu_accelerator

    proof = gpu_accelerator.prove_mode(mode)
    progress(f"GPU precision {mode}: the probe's error {proof.probe_error:.2e} is {proof.arithmetic} arithmetic")
    return mode


def run(args) -> int:
    import torch

    from scripts.qwen35.host import PairRunner

    root = Path(args.release)
    if args.top < 1:
        raise ClefError("--top must be at least 1")
    if args.question and not args.pair:
        raise ClefError("--question needs --pair")
    utf8(args.text, "--text")
    for question in args.question:
        utf8(question, "--question")
    precision = gpu_precision(args)
    manifest = reader.load_manifest(root)
    host = open_host(root, manifest, args.weights)
    arts = manifest.artifacts
    ids = host.encode(args.text)
    if not ids:
        raise ClefError("--text has no tokens")
    if not args.pair:
        rows = sorted((a for a in arts.items() if a[1].kind == "row"), key=lambda a: a[1].L)
        if args.signature:
            path, art = chosen(arts, args.signature, "row")
            if art.L < len(ids):
                raise ClefError(f"{len(ids)} tokens do not fit --signature {args.signature} (L={art.L})")
        else:
            path, art = smallest(
                rows,
                lambda a: a[1].L >= len(ids),
                "row graph",
                f"{len(ids)} tokens (largest L is {rows[-1][1].L if rows else 'none'})",
            )
        check_graph(root, manifest, path)
        signature = graph_signatures(root, art, args.gpu, precision)
        out = signature(None)(**host.record(ids, art.L))["hidden"]
        finite(out[0, : len(ids)], f"{path} ({art.file})")
        last = out[0, len(ids) - 1]
        print(
            f"{path} ({art.file}): {len(ids)} tokens in L={art.L} "
            f"(form {manifest.form}, revision {manifest.model.revision[:12]}; "
            f"{f'GPU {precision}' if args.gpu else 'CPU'})"
        )
        print(f"hidden, last position: {summarize(last)}; all finite: {bool(torch.isfinite(out[0, : len(ids)]).all())}")
        print(f"top lm_head tokens at the last position: {top_tokens(host, last, args.top)}")
        return 0

    if not args.question:
        raise ClefError("--pair needs at least one --question")
    questions = [host.encode(q) for q in args.question]
    if not all(questions):
        raise ClefError("a --question has no tokens")
    pairs = sorted((a for a in arts.items() if a[1].kind == "pair"), key=lambda a: (a[1].P, a[1].S))
    longest = max(len(q) for q in questions)
    fits = lambda a: a[1].P >= len(ids) and a[1].S >= longest  # noqa: E731
    need = f"a context of {len(ids)} tokens and a question of {longest}"
    if args.signature:
        path, art = chosen(arts, args.signature, "pair")
        if not fits((path, art)):
            raise ClefError(f"{need} do not fit --signature {args.signature} (P={art.P}, S={art.S})")
    else:
        path, art = smallest(pairs, fits, "pair", need)
    check_graph(root, manifest, path)
    signature = graph_signatures(root, art, args.gpu, precision)
    shapes = {e.name: e.shape for e in art.signatures["suffix"].inputs if e.name not in TOKEN_INPUTS}
    runner = PairRunner(
        host,
        signature("prefix"),
        signature("suffix"),
        art.P,
        art.S,
        manifest.form,
        shapes,
    )
    hidden, state = runner.prefix(ids)
    names = art.signature_names
    finite(hidden[0], f"{path} ({art.file}, {names['prefix']}) on the context")
    print(
        f"{path} ({art.file}): context of {len(ids)} tokens in P={art.P} "
        f"({f'GPU {precision}' if args.gpu else 'CPU'}); "
        f"context's last position: {summarize(hidden[0, -1])}"
    )
    for text, q in zip(args.question, questions, strict=True):
        out = runner.suffix(state, q)
        finite(out[0], f"{path} ({art.file}, {names['suffix']}) on question {text!r}")
        print(f"question {text!r} ({len(q)} tokens): last position {summarize(out[0, -1])}")
        print(f"  top lm_head tokens: {top_tokens(host, out[0, -1], args.top)}")
    return 0


# ---- verify ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuVerdict(Record):
    """A graph's reference record in one GPU mode, as `clef verify --json` reports it: its error, the
    adapter that ran it, whether every op ran there, and whether it passed."""

    max_rel: float
    max_rel_per_position: float
    adapter: str
    fully_accelerated: bool
    passed: bool


@dataclass(frozen=True)
class GraphVerdict(Record):
    """A graph as `clef verify --json` reports it: the file holding it, its reference record's error in
    the interpreter beside the release's figures and bounds, whether it passed, and (--gpu) each mode's."""

    file: str
    max_rel: float
    max_rel_per_position: float
    release_max_rel: float
    release_max_rel_per_position: float
    threshold: float
    threshold_per_position: float | None
    passed: bool
    gpu: dict[str, GpuVerdict] | None = optional()


@dataclass
class Report:
    """What `clef verify` finds: a line per check for people and, with --json, one JSON document on stdout
    (the lines then go to stderr). `doc` holds the signature's state, each graph's figures beside the
    release's (`graphs`, written under the doc's `graphs`), and the problems; a figure that is not finite is
    written as the string "nan" or "inf"."""

    as_json: bool = False
    doc: dict = field(default_factory=lambda: {"signature": None, "graphs": {}})
    graphs: dict[str, GraphVerdict] = field(default_factory=dict)

    def say(self, line: str) -> None:
        print(line, file=sys.stderr if self.as_json else sys.stdout, flush=True)

    def gpu(self, name: str, mode: str, verdict: GpuVerdict) -> None:
        """Graph `name`'s verdict in GPU mode `mode`, beside its interpreter figures."""
        graph = self.graphs[name]
        self.graphs[name] = replace(graph, gpu={**(graph.gpu or {}), mode: verdict})

    def finish(self, problems: list[str], summary: str) -> int:
        """Print the problems and the summary line (and the JSON document); -> the exit status."""
        for line in problems:
            self.say(f"FAIL {line}")
        self.say(f"verify: {summary}")
        self.doc["graphs"] = {name: graph.to_json() for name, graph in self.graphs.items()}
        self.doc.update(passed=not problems, problems=problems, summary=summary)
        if self.as_json:
            print(json.dumps(_finite_json(self.doc), indent=1))
        return 1 if problems else 0


def _finite_json(value):
    """`value` with every non-finite float as a string: JSON has no NaN, and a NaN figure must not vanish."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_json(v) for v in value]
    return value


def check_signature(root: Path, key: str | None, require: bool, report: Report) -> list[str] | None:
    """The release's signature, before anything in it is read: problems (the release fails), [] (it
    verifies with `key`), or None (nothing was checked: no key given, or an unsigned release)."""
    signed = (root / signing.SIGNATURE).is_file()
    if require and not signed:
        raise ClefError(f"{root} is not signed (no {signing.SIGNATURE}) and --require-signature was given")
    if key is None:
        claimed = signing.claimed_key(root) if signed else None
        report.doc["signature"] = {"state": "not checked", "names_key": claimed} if signed else {"state": "unsigned"}
        report.say(
            f"note signature: {signing.SIGNATURE} names key {claimed}; not checked (pass --key PUB.pem)"
            if signed
            else "note unsigned release: the checks below hold the files to its manifest, not to a key"
        )
        return None
    if not signed:
        report.doc["signature"] = {"state": "unsigned"}
        report.say(
            f"note unsigned release: --key {key} was not used; the checks below hold the files to its manifest only"
        )
        return None
    progress(f"verify {root}: signature, hashing every file")
    problems = signing.verify(root, key)
    fingerprint = signing.fingerprint(signing.load_public_key(key))
    report.doc["signature"] = {"state": "failed" if problems else "verified", "key": fingerprint}
    if not problems:  # named by the key that verified it (the library ignores the key the bundle names)
        report.say(
            f"ok   signature: {signing.SIGNATURE} verifies with key {fingerprint}: every file is what was signed"
        )
    return problems


def verify(args) -> int:
    """A release directory, or the tarball a device team receives (unpacked beside it, then removed)."""
    from scripts.release.builder import TARBALL_SUFFIX

    path = Path(args.release)
    if args.gpu:
        try:
            import torch  # noqa: F401  (the GPU accelerator's signatures hand torch tensors to the checks)
        except ImportError:
            raise ClefError("clef verify --gpu needs torch (pip install torch); without --gpu it does not") from None
    if path.is_file() and path.name.endswith(TARBALL_SUFFIX):
        with unpacked(path) as root:
            return verify_directory(root, args)
    if not path.is_dir():
        raise ClefError(f"{path} is neither a release directory nor a release tarball (*{TARBALL_SUFFIX})")
    return verify_directory(path, args)


@contextlib.contextmanager
def unpacked(tarball: Path):
    """The release a tarball holds, unpacked into a temporary directory beside it (the same disk: a
    release is many GB), removed afterwards. Members are held to tarfile's `data` filter (a leading
    `/` dropped): none climbing out with `..`, no link leaving the directory, no device; one top directory."""
    import tarfile
    import tempfile

    import zstandard

    from scripts.release import builder

    with tempfile.TemporaryDirectory(dir=tarball.parent, prefix=f".{tarball.name}.") as tmp:
        try:
            with builder.open_tarball(tarball) as tar:
                tar.extractall(tmp, filter="data")
        except tarfile.FilterError as exc:
            raise ClefError(f"{tarball}: refused a member: {exc}") from None
        except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
            raise ClefError(f"{tarball} is not a whole release tarball: {exc}") from None
        tops = list(Path(tmp).iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise ClefError(f"{tarball} holds {sorted(p.name for p in tops)}, not one release directory")
        yield tops[0]


def verify_directory(root: Path, args) -> int:
    from scripts.litert import tflite_file, weight_storage

    if args.require_signature and not args.key:
        raise ClefError("--require-signature needs --key PUB.pem, the public key to check the signature with")
    if args.key:
        signing.load_public_key(args.key)  # an unusable key is bad input, refused before any work
    from scripts.clef.about import version

    report = Report(as_json=args.json)
    report.doc.update(clef=version(), release=str(args.release))
    problems = check_signature(root, args.key, args.require_signature, report)
    if problems:
        return report.finish(
            problems, f"the signature failed ({len(problems)} problems); nothing in the release was loaded"
        )
    manifest = reader.load_manifest(root)
    report.doc.update(name=manifest.name, format=manifest.format, files=len(manifest.files))
    problems = reader.check_paths(root, manifest)
    if not problems:
        progress(f"verify {root}: hashing {len(manifest.files)} files")
        problems = reader.check_files(root, manifest)
    if problems:
        return report.finish(
            problems, f"{len(problems)} problems; the graphs were not run (a changed file is not safe to load)"
        )
    arts = manifest.artifacts
    by_file: dict[str, list[str]] = {}
    for name in sorted(arts):
        by_file.setdefault(arts[name].file, []).append(name)
    done = 0
    for file, names in by_file.items():
        census = tflite_file.census(root / file)
        meta = tflite_file.read_metadata(root / file)
        found = reader.bundle_problems(census, file, arts) + [
            f"{file}: {line}" for line in weight_storage.mismatch(census, reader.declared_weights(meta))
        ]
        if found:
            problems += found
            continue
        records = {}
        for name in names:
            done += 1
            art = arts[name]
            progress(f"[{done}/{len(arts)}] {name} ({file}): metadata, reference record in the interpreter")
            bad = reader.metadata_problems(meta, manifest, name)
            if bad:
                problems.append(f"{name}: metadata disagrees with the manifest: {'; '.join(bad)}")
                continue
            ref = art.reference
            records[name] = references.load_reference(root, ref.file, arrays=True)  # no torch needed
            measured = references.run_reference(root / file, art.kind, records[name], names=art.signature_names)
            figures = measured.to_json()
            found = reader.reference_problems(figures, ref) + reader.drift_problems(figures, ref)
            report.graphs[name] = GraphVerdict(
                file=file,
                max_rel=measured.rel_vs_expected,
                max_rel_per_position=measured.rel_per_position_vs_expected,
                release_max_rel=ref.max_rel,
                release_max_rel_per_position=ref.max_rel_per_position,
                threshold=ref.threshold,
                threshold_per_position=ref.threshold_per_position,
                passed=not found,
            )
            report.say(
                f"{'FAIL' if found else 'ok  '} {name}: max rel {measured.rel_vs_expected:.2e}, per position "
                f"{measured.rel_per_position_vs_expected:.2e} vs the release's {ref.max_rel:.2e}, "
                f"{ref.max_rel_per_position:.2e} (thresholds {ref.threshold:g}, "
                f"{ref.threshold_per_position:g}; "
                f"at most {ref.max_over_recorded:g}x the release's)"
            )
            problems += [f"{name}: reference record: {line}" for line in found]
        if args.gpu and records:
            problems += verify_on_gpu(root / file, census, {n: arts[n] for n in records}, records, report)
    return report.finish(
        problems,
        f"{manifest.name}: {len(manifest.files)} files, {len(arts)} graphs, "
        f"{'all checks passed' if not problems else f'{len(problems)} problems'}",
    )


def verify_on_gpu(file: Path, census: dict, arts: Artifacts, records: dict, report: Report) -> list[str]:
    """Each graph's reference record through its signatures on LiteRT's GPU accelerator alone, the file
    compiled once per mode (each mode shown by its effect on the precision probe first): fp32 held to the
    reference thresholds, fp16 and mixed to being finite; each beside what the release's verify_gpu
    measured."""
    from scripts.litert import gpu_accelerator

    problems = []
    for mode in gpu_accelerator.MODES:
        try:
            gpu_accelerator.prove_mode(mode)
            compiled = gpu_accelerator.compile(file, mode, census)
        except ClefError as exc:
            if "no Vulkan adapter" in str(exc):
                raise
            problems.append(f"{file.name}: GPU {mode}: {exc}")
            report.say(f"FAIL {file.name}: GPU {mode}: {exc}")
            continue
        try:
            for name, art in arts.items():
                signature = references.renamed(compiled.signature, art.signature_names)
                figures = references.reference_error(signature, art.kind, records[name])
                problems += gpu_figures(name, art, mode, figures, compiled, report)
        finally:
            compiled.close()
    return problems


def gpu_figures(
    name: str, art: ArtifactEntry, mode: str, figures: references.ReferenceResult, compiled, report: Report
) -> list[str]:
    """One graph's reference record error in one GPU mode, printed beside the release's; -> problems."""
    ref, gpu = art.reference, art.gpu if isinstance(art.gpu, GpuFigures) else None  # None: verify_gpu refused it
    at_release = (gpu.modes or {}).get(mode) if gpu else None
    measured = figures.rel_vs_expected
    if mode == "fp32":
        ok = not reader.reference_problems(figures.to_json(), ref)
        recorded = f"the release's verify_gpu: {gpu.fp32_max_rel_vs_torch:.2e}" if gpu else "not measured at release"
        bound = f"thresholds {ref.threshold:g}, per position {ref.threshold_per_position:g}"
    else:
        ok = measured < float("inf")
        recorded = (
            f"the release's verify_gpu: {at_release['max_rel_vs_f64']:.2e} vs float64, "
            f"{at_release['over_floor']:.2f}x the floor {at_release['floor_max_rel_vs_f64']:.2e}"
            if at_release
            else "not measured at release"
        )
        bound = "finite"
    report.gpu(
        name,
        mode,
        GpuVerdict(
            measured,
            figures.rel_per_position_vs_expected,
            compiled.adapter,
            compiled.fully_accelerated,
            bool(ok and compiled.fully_accelerated),
        ),
    )
    report.say(
        f"{'ok  ' if ok else 'FAIL'} {name}: GPU {mode} on {compiled.adapter}: max rel vs expected {measured:.2e} "
        f"({recorded}; {bound}; fully accelerated {compiled.fully_accelerated})"
    )
    if ok and compiled.fully_accelerated:
        return []
    return [
        f"{name}: GPU {mode}: reference record error {measured:.3g} ({bound}), "
        f"fully accelerated {compiled.fully_accelerated}"
    ]


# ---- audit -------------------------------------------------------------------------------------


def find_manifest(path: Path) -> Path | None:
    """The manifest of the release a file sits in (the file's directory or its parent)."""
    for d in (path.parent, path.parent.parent):
        if (d / reader.MANIFEST).is_file():
            return d
    return None


def audit(args) -> int:
    from scripts.checkpoint.snapshot import sha256_file
    from scripts.litert import tflite_file, weight_storage

    path = Path(args.file)
    if not path.is_file():
        raise ClefError(f"no file {path}")
    try:
        meta = tflite_file.read_metadata(path)
    except ClefError:  # truncated or damaged, named by tflite_file
        raise
    except Exception:  # noqa: BLE001  (any other parse failure means the same thing to the user)
        raise ClefError(f"{path} is not a readable .tflite flatbuffer") from None
    if meta is None:
        raise ClefError(f"{path} has no clef_litert metadata: it was not produced by clef-litert")
    bundled = meta.get("kind") == "bundle"
    graphs = (meta.get("graphs") or {}) if bundled else {None: meta}
    held = weight_storage.mismatch(tflite_file.census(path), reader.declared_weights(meta))
    if held:
        raise ClefError(f"{path}: {held[0]}")
    digest = sha256_file(path)
    print(f"file:      {path} ({path.stat().st_size} bytes, sha256 {digest[:16]})")
    print(f"model:     {meta['repo']} revision {meta['revision']} (source {meta['source']})")
    if bundled:
        names = sorted(n for g in graphs.values() for n in g.get("signatures", {}).values())
        print(f"bundle:    {len(graphs)} graphs, form {meta['form']}, signatures {', '.join(names)}")
    for name, graph in graphs.items():
        print_graph(name, graph)
    root = find_manifest(path)
    if root is None:
        print("manifest:  none beside this file")
        return 0
    manifest = reader.load_manifest(root)
    rel = str(path.resolve().relative_to(root.resolve()))
    held = {n: a for n, a in manifest.artifacts.items() if a.file == rel}
    disagree = []
    if not held:
        disagree.append(f"{rel} is not listed")
    elif any(a.sha256 != digest for a in held.values()):
        disagree.append("its sha256 differs from the manifest's")
    else:
        disagree += reader.bundle_problems(tflite_file.census(path), rel, manifest.artifacts)
        for name in held:
            found = reader.metadata_problems(meta, manifest, name)
            disagree += [f"{name}: {line}" if bundled else line for line in found]
    if disagree:
        print(f"manifest:  {root / reader.MANIFEST} DISAGREES: {'; '.join(disagree)}")
        return 1
    print(f"manifest:  {root / reader.MANIFEST} agrees (sha256, revision, form, weights, shape)")
    return audit_signature(root, manifest)


def print_graph(name: str | None, meta: dict) -> None:
    """What one graph's metadata says of it (a bundle's: each graph's entry, named)."""
    shape = {k: meta[k] for k in ("L", "P", "S") if k in meta}
    git = meta.get("git", {})
    signatures = f"; signatures {', '.join(meta['signatures'].values())}" if meta.get("signatures") else ""
    print(
        f"graph:     {name + ': ' if name else ''}{meta.get('kind')} "
        f"{' '.join(f'{k}={v}' for k, v in shape.items())}, form {meta['form']}, "
        f"weights {reader.declared_weights(meta)}, "
        f"contract v{meta['contract_version']}{signatures}"
    )
    changed = git.get("changed", [])
    more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
    tree = {True: "clean", False: f"uncommitted changes: {', '.join(changed[:5])}{more}", None: "not in git"}
    print(f"commit:    {git.get('commit')} ({tree[git.get('clean')]})")
    print(f"params:    {json.dumps(meta.get('params'), sort_keys=True)}")
    print(f"versions:  {', '.join(f'{k} {v}' for k, v in sorted(meta['versions'].items()))}")


def audit_signature(root: Path, manifest: Manifest) -> int:
    """Whether the graph's release is signed, and by which key; the signature itself is checked by
    `clef verify --key`, which hashes every file."""
    recorded = manifest.signing
    signed = recorded if isinstance(recorded, signing.Signed) else None
    present = (root / signing.SIGNATURE).is_file()
    if not present and not recorded.signed:
        print(f"signature: none (unsigned release: {getattr(recorded, 'why', 'no signing entry')})")
        return 0
    claimed = signing.claimed_key(root) if present else None
    fingerprint = signed.key_fingerprint if signed else None
    if not present or claimed != fingerprint:
        print(
            f"signature: DISAGREES: the manifest says signed by {fingerprint}, "
            f"{signing.SIGNATURE} {'names ' + str(claimed) if present else 'is missing'}"
        )
        return 1
    print(
        f"signature: {signing.SIGNATURE} by key {claimed} ({signed.tool if signed else None}); "
        f"check it: clef verify {root} --key PUB.pem"
    )
    return 0


# ---- keys --------------------------------------------------------------------------------------


def keys(args) -> int:
    """A key pair for signing releases (make keys)."""
    checkout = Path(__file__).resolve().parents[2]  # the repository the keys must stay out of
    private, public = signing.make_keys(Path(args.directory), repo=checkout)
    encrypted = ", encrypted" if signing.password_set() else ""
    print(f"private key: {private} (mode 0600{encrypted}): keep it off shared machines")
    print(f"public key:  {public} (fingerprint {signing.fingerprint(signing.load_public_key(public))}): share it")
    print(f"sign releases with it: params.yaml release.signing_key: {private}")
    return 0


# ---- pull --------------------------------------------------------------------------------------


def snapshot_missing(repo: Path) -> bool:
    """True in a clone of the pipeline (its dvc.lock records the fetch stage) that has no hf/ yet."""
    import yaml

    lock = repo / "dvc.lock"
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}) if lock.is_file() else {}
    return "fetch" in stages and not (repo / "hf").exists()


def pull(args) -> int:
    """`dvc pull`, after checking that the remote answers and holds something (one line if not); then, for
    a whole pull, the fetch stage, which restores hf/ (not pushed: the revision is pinned, the hub has it)."""
    import subprocess

    from scripts.pipeline import remote

    where = remote.check(Path.cwd(), args.remote)
    progress(f"pull: remote {where}")
    cmd = [sys.executable, "-m", "dvc", "pull", *(["--remote", args.remote] if args.remote else []), *args.targets]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise ClefError(f"dvc pull from {where} failed (exit {done.returncode}); its messages are above")
    if not args.targets and snapshot_missing(Path.cwd()):
        progress("pull: hf/ is not pushed; the fetch stage restores the pinned snapshot")
        done = subprocess.run([sys.executable, "-m", "dvc", "repro", "fetch"])
        if done.returncode != 0:
            raise ClefError(f"dvc repro fetch failed (exit {done.returncode}); its messages are above")
    return 0
