"""The training corpus: every file the committed manifest names is installed with its sha256, the parts do not
overlap, and a missing or changed file is refused in one line naming it, before any training."""

from __future__ import annotations

import json
import shutil

import pytest

from scripts.checkpoint import corpus, train_tiny
from scripts.pipeline.errors import ClefError


def test_the_installed_package_holds_every_file_of_the_manifest():
    c = corpus.checked()
    assert c.package == corpus.PACKAGE and c.license == corpus.LICENSE
    assert len(c.train) > 10 and len(c.held_out) > 2
    assert not {f.path for f in c.train} & {f.path for f in c.held_out}
    assert sum(f.bytes for f in c.held_out) > 500_000  # room for every record the checks take


def test_the_manifest_is_what_build_gives_from_the_lock_files_package():
    """corpus.json is the installed package's own split, not a hand-edited list."""
    assert corpus.build(corpus.site_packages()) == corpus.load()


def _copy(tmp_path, c: corpus.CorpusManifest, n: int = 2):
    """A site-packages holding the first n files of each part, and its manifest."""
    root = tmp_path / "site"
    small = corpus.CorpusManifest(c.package, c.version, c.license, c.train[:n], c.held_out[:n])
    for f in small.train + small.held_out:
        (root / f.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(corpus.site_packages() / f.path, root / f.path)
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps(small.to_json()))
    return root, manifest, small


def test_a_changed_file_is_refused_naming_it(tmp_path):
    root, manifest, small = _copy(tmp_path, corpus.load())
    assert corpus.checked(root, manifest) == small
    changed = small.held_out[1].path
    (root / changed).write_text((root / changed).read_text() + "#")
    with pytest.raises(ClefError, match=rf"^corpus file {changed} \(held_out\) has sha256 other than"):
        corpus.checked(root, manifest)


def test_a_missing_file_is_refused_naming_it_and_counting_the_rest(tmp_path):
    root, manifest, small = _copy(tmp_path, corpus.load())
    for f in small.train:
        (root / f.path).unlink()
    with pytest.raises(ClefError, match=rf"^corpus file {small.train[0].path} \(train\) is missing .* \(and 1 more\)$"):
        corpus.checked(root, manifest)


def test_a_file_in_both_parts_is_refused(tmp_path):
    root, manifest, small = _copy(tmp_path, corpus.load())
    both = corpus.CorpusManifest(small.package, small.version, small.license, small.train, small.train[:1])
    manifest.write_text(json.dumps(both.to_json()))
    with pytest.raises(ClefError, match="in both the train and the held-out part"):
        corpus.checked(root, manifest)


def test_training_refuses_a_changed_corpus_before_any_work(monkeypatch):
    """train() checks the corpus first: a bad file stops it before the model is even built."""

    def refuse(*args, **kwargs):
        raise ClefError("corpus file x (train) is missing")

    built = []
    monkeypatch.setattr(corpus, "checked", refuse)
    monkeypatch.setattr(train_tiny, "drawn_model", lambda: built.append(1))
    with pytest.raises(ClefError, match="corpus file x"):
        train_tiny.train(steps=1, progress=False)
    assert not built
