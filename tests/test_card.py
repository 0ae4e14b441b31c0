"""The release's model card (scripts/release/card.py): its Hugging Face front matter carries the checkpoint's
own license and base model as the snapshot's model card states them, and says so when there is none."""

from __future__ import annotations

import pytest
import yaml

from scripts.pipeline.errors import ClefError
from scripts.release import card

CLEF_FLASH_CARD = """---
license: apache-2.0
base_model: Qwen/Qwen3.5-9B
pipeline_tag: text-generation
---
# clef-flash
"""


def front_matter(text: str) -> dict:
    assert text.startswith("---\n"), text[:80]
    return yaml.safe_load(text.split("\n---\n", 1)[0].removeprefix("---\n"))


def test_the_checkpoints_card_is_read(tmp_path):
    (tmp_path / "README.md").write_text(CLEF_FLASH_CARD)
    assert card.checkpoint_card(tmp_path) == {
        "license": "apache-2.0",
        "base_model": "Qwen/Qwen3.5-9B",
        "pipeline_tag": "text-generation",
    }


@pytest.mark.parametrize("content", [None, "# a card without front matter\n"], ids=["no-card", "no-front-matter"])
def test_no_card_or_no_front_matter_is_empty(tmp_path, content):
    if content is not None:
        (tmp_path / "README.md").write_text(content)
    assert card.checkpoint_card(tmp_path) == {}


def test_a_card_whose_front_matter_is_not_yaml_is_refused_naming_it(tmp_path):
    (tmp_path / "README.md").write_text("---\nlicense: [apache-2.0\n---\n")
    with pytest.raises(ClefError, match=r"README.md.*front matter"):
        card.checkpoint_card(tmp_path)


@pytest.mark.parametrize("theirs", [yaml.safe_load(CLEF_FLASH_CARD.split("---")[1]), {}], ids=["stated", "none"])
def test_front_matter_carries_license_and_base_model(theirs):
    text = card.front_matter("Cloudflare/clef-flash", theirs) + card.license_lines("Cloudflare/clef-flash", theirs)
    meta = front_matter("\n".join(text))
    assert meta["base_model"] == "Cloudflare/clef-flash" and meta["library_name"] == "litert"
    body = "\n".join(text)
    if theirs:
        assert meta["license"] == "apache-2.0" and "Qwen/Qwen3.5-9B" in body
    else:
        assert "license" not in meta and "no model card" in body


def test_the_card_names_the_checkpoint_from_its_snapshot_record():
    """render reads the snapshot record by its fields (a card spelt it as a dict after the record became
    typed, and only a full repro found it): the repository, revision and source appear in its text."""
    from scripts.checkpoint.snapshot import SnapshotRecord

    rec = SnapshotRecord("tiny", "clef-litert/clef-flash-tiny", "a" * 40, "hf/x", [])
    unsigned = {"signed": False, "why": "no key"}
    text = card.render("n", rec, "R64+sp+ec+dd+vs6", "fp16", {"weights": "reference"}, {}, {}, unsigned, None, {}, {})
    assert f"`{rec.repo}` at revision `{rec.revision}` (source: {rec.source})" in text
