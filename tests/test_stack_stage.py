"""The stack stage: what it records, and every bad snapshot refused in one line before loading."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from scripts.checkpoint import snapshot
from scripts.pipeline import atomic
from tests.conftest import assert_one_line_error, run_stage


def snapshot_path(workdir):
    rec = json.loads((workdir / "results" / "snapshot.json").read_text())
    return workdir / rec["path"], rec


def rerecord(workdir):
    """Record the snapshot as it now is, as if the fetch stage had written it so."""
    path, rec = snapshot_path(workdir)
    atomic.write_json(
        workdir / "results" / "snapshot.json",
        snapshot.record(path, rec["source"], rec["repo"], rec["revision"], root=workdir).to_json(),
    )


def test_records_the_stack(workdir):
    proc = run_stage("stack", workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((workdir / "results" / "stack.json").read_text())
    assert info["layers"] == 8 and info["gdn_layers"] == [0, 1, 2, 4, 5, 6]
    assert info["fp32_bytes"] == 4 * info["params"] > 0
    assert info["peak_rss_bytes"] > info["fp32_bytes"]
    assert info["revision"] == snapshot_path(workdir)[1]["revision"]
    assert "loading shards" in proc.stderr  # the progress bar


def test_missing_shard(workdir):
    path, _ = snapshot_path(workdir)
    (path / "model-00002-of-00002.safetensors").unlink()
    assert_one_line_error(run_stage("stack", workdir), "model-00002-of-00002.safetensors", "missing")
    assert not (workdir / "results" / "stack.json").exists()


def test_truncated_shard(workdir):
    path, rec = snapshot_path(workdir)
    shard = path / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    assert_one_line_error(run_stage("stack", workdir), "model-00001-of-00002.safetensors", "bytes, the record says")
    assert not (workdir / "results" / "stack.json").exists()


def test_corrupt_shard_same_size(workdir):
    path, _ = snapshot_path(workdir)
    shard = path / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert_one_line_error(run_stage("stack", workdir), "model-00002-of-00002.safetensors", "corrupt", "sha256")
    assert not (workdir / "results" / "stack.json").exists()


def test_tensors_that_do_not_match_the_model(workdir):
    path, _ = snapshot_path(workdir)
    shard = path / "model-00002-of-00002.safetensors"
    tensors = load_file(str(shard))
    old = next(
        k for k in sorted(tensors) if k.startswith("model.language_model.layers.") and k.endswith("up_proj.weight")
    )
    new = old.replace("up_proj", "up_projection")
    tensors[new] = tensors.pop(old)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"][new] = index["weight_map"].pop(old)
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    rerecord(workdir)
    assert_one_line_error(run_stage("stack", workdir), f"first: {old}", f"first: {new}", "1 missing", "1 unexpected")
    assert not (workdir / "results" / "stack.json").exists()


def test_pickle_checkpoint_refused(workdir):
    path, _ = snapshot_path(workdir)
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    rerecord(workdir)
    assert_one_line_error(run_stage("stack", workdir), "pytorch_model.bin", "pickle", "safetensors")
    assert not (workdir / "results" / "stack.json").exists()


@pytest.mark.parametrize("stage", ["stack", "verify_kernel"])
@pytest.mark.parametrize(
    "content, fragment",
    [
        (b'{"text_config": {"hidden_size": 128,', "config.json is not valid JSON"),
        (b"[1, 2]", "config.json holds a list, not a JSON object"),
        (b'{"architectures": ["X"]}', "config.json has no text_config object"),
    ],
)
def test_unreadable_config_is_one_line(workdir, stage, content, fragment):
    """A snapshot whose config.json does not parse (its record updated to match): one line, no traceback."""
    path, _ = snapshot_path(workdir)
    (path / "config.json").unlink()  # a hard link into the shared cache: replace, do not write through
    (path / "config.json").write_bytes(content)
    rerecord(workdir)
    assert_one_line_error(run_stage(stage, workdir), fragment)


def test_unreadable_tokenizer_config_is_one_line(tiny_snapshot, tmp_path):
    import shutil

    from scripts.pipeline.errors import ClefError
    from scripts.qwen35.host import Host

    copy = tmp_path / "snap"
    shutil.copytree(tiny_snapshot, copy)
    (copy / "tokenizer_config.json").unlink()
    (copy / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ClefError, match="tokenizer_config.json is not valid JSON"):
        Host(copy).encode("a decision")


def test_no_snapshot_record(workdir):
    (workdir / "results" / "snapshot.json").unlink()
    assert_one_line_error(run_stage("stack", workdir), "results/snapshot.json", "fetch")
