"""Integrity of the whole checkpoint (issue 47 item 6), on a one-process gloo group (runtime.run):

- the manifest itself is hashed: its digest lies outside the step directory (DIR/.partita-digests/step-N.sha256, sha256sum's format),
  so removing a shard's entry from partita.json and corrupting that shard at the same size -- which used to
  resume silently with other losses -- is caught, and the run resumes from the newest intact checkpoint;
- files the manifest does not list are refused, even when the sidecar was rewritten to match the edited
  manifest, and a manifest that had a sidecar does not pass without it;
- the data source's digest: the token file's content hash is recorded in the manifest, and a token file
  swapped for other content of the same size before --resume stops the run with one line naming it.
"""
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import partita.runtime as runtime
from partita.runtime import checkpoint as ckpt
from partita.runtime.checkpoint import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_plans_match_single_process import make_plan  # noqa: E402

PLAN = make_plan("tiny-gpt", micro=2)
VOCAB = 256  # tiny-gpt's vocabulary bounds the token ids


def run(steps, root, **kw):
    return runtime.run(PLAN, "tiny-gpt", steps=steps, checkpoint_dir=root, print_report=False, **kw)


def tokens(path: Path, seed: int) -> Path:
    np.random.default_rng(seed).integers(0, VOCAB, size=4096, dtype=np.uint16).tofile(path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """6 uninterrupted steps on a token file (the reference), and a directory checkpointed after steps 2 and 4."""
    base = tmp_path_factory.mktemp("integrity")
    data = tokens(base / "tokens.bin", 1)
    straight = run(6, None, dataset=str(data))
    root = base / "ck"
    run(4, root, checkpoint_every=2, dataset=str(data))
    return straight, root, data


def fresh(trained, tmp_path) -> tuple[Path, Path]:
    shutil.copytree(trained[1], tmp_path / "ck")
    data = tmp_path / "tokens.bin"
    shutil.copy(trained[2], data)
    return tmp_path / "ck", data


def drop_entry_and_corrupt(step: Path) -> str:
    """What the issue did: remove the shard's entry from partita.json, then flip a byte of the shard."""
    manifest = json.loads((step / ckpt.MANIFEST).read_text())
    shard = next(n for n in manifest["files"] if n.endswith(".distcp"))
    del manifest["files"][shard]
    (step / ckpt.MANIFEST).write_text(json.dumps(manifest, indent=2))
    data = bytearray((step / shard).read_bytes())
    data[len(data) // 2] ^= 0x40
    (step / shard).write_bytes(bytes(data))
    return shard


def test_the_manifest_digest_and_the_data_digest_are_recorded(trained):
    step = trained[1] / "step-00000004"
    side = ckpt.sidecar(step)
    assert side == trained[1] / ".partita-digests" / "step-00000004.sha256"
    digest, name = side.read_text().split()
    assert name == "step-00000004/partita.json"
    assert digest == hashlib.sha256((step / ckpt.MANIFEST).read_bytes()).hexdigest()
    manifest = json.loads((step / ckpt.MANIFEST).read_text())
    assert manifest["data"]["sha256"] == hashlib.sha256(trained[2].read_bytes()).hexdigest()


def test_an_entry_removed_from_the_manifest_and_its_shard_corrupted_is_caught(trained, tmp_path):
    root, data = fresh(trained, tmp_path)
    drop_entry_and_corrupt(root / "step-00000004")
    result = run(6, root, resume=True, dataset=str(data))
    assert result.resumed_from == str(root / "step-00000002")
    assert any("step-00000004: partita.json does not match its digest in .partita-digests/step-00000004.sha256" in n
               for n in result.notes), result.notes
    assert result.losses == trained[0].losses[2:]  # the trajectory of the uninterrupted run, not other losses


def test_a_file_the_manifest_does_not_list_is_refused_even_with_a_matching_sidecar(trained, tmp_path):
    root, data = fresh(trained, tmp_path)
    step = root / "step-00000004"
    shard = drop_entry_and_corrupt(step)
    raw = (step / ckpt.MANIFEST).read_bytes()  # the sidecar rewritten to match the edited manifest
    ckpt.sidecar(step).write_text(f"{hashlib.sha256(raw).hexdigest()}  step-00000004/partita.json\n")
    (root / "step-00000002" / "stray.bin").write_bytes(b"not saved by the run")
    with pytest.raises(CheckpointError) as e:
        run(6, root, resume=True, dataset=str(data))
    assert f"checkpoint {step} holds {shard}, which its partita.json does not list" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_manifest_whose_sidecar_is_gone_is_not_trusted(trained, tmp_path):
    root, data = fresh(trained, tmp_path)
    ckpt.sidecar(root / "step-00000004").unlink()
    result = run(6, root, resume=True, dataset=str(data))
    assert result.resumed_from == str(root / "step-00000002")
    assert any(".partita-digests/step-00000004.sha256, the digest of its partita.json, is missing" in n for n in result.notes)


def test_a_token_file_swapped_for_same_size_content_stops_the_resume_in_one_line(trained, tmp_path):
    root, _ = fresh(trained, tmp_path)
    data, original = trained[2], trained[2].read_bytes()  # the file at the path the checkpoint recorded
    try:
        tokens(data, 2)  # other tokens, the same size
        assert data.stat().st_size == len(original)
        with pytest.raises(CheckpointError) as e:
            run(6, root, resume=True, dataset=str(data))
    finally:
        data.write_bytes(original)
    line = str(e.value)
    assert f"trained on token file {data} with content sha256" in line and "the file now has sha256" in line, line
    assert "\n" not in line
    moved = tmp_path / "moved.bin"  # the same content under another name: the trajectory continues, no note
    shutil.copy(data, moved)
    result = run(6, root, resume=True, dataset=str(moved))
    assert result.resumed_from == str(root / "step-00000004")
    assert not any("batches differ" in n for n in result.notes), result.notes
    assert result.losses == trained[0].losses[4:]
