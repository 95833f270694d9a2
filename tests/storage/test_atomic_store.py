"""Atomic evidence: an object appears under its content address whole and hashed, or not at all.

The file system store runs on a real, small tmpfs (mounted here; needs root), so "the store is full" is the
kernel's ENOSPC, not a stand-in. The S3 store is the real SeaweedFS of tests/storage/conftest.py.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from django.core.files.storage import storages

from runners.artifacts import (
    INCOMING,
    ArtifactMismatch,
    EvidenceStoreError,
    read_artifact,
    store_bytes,
    store_file,
)
from runners.models import Artifact, artifact_storage_name
from tests.runners.conftest import credential, make_node, pilot, simnodes, site, user_key  # noqa: F401

pytestmark = pytest.mark.django_db

SPACE = 1024 * 1024  # the tmpfs: 1 MiB


@pytest.fixture
def job(pilot):  # noqa: F811
    from runners.models import Job

    return Job.objects.create(pilot=pilot, kind=Job.Kind.PROBE)


@pytest.fixture
def small_store(tmp_path, settings):
    """The evidence store on a 1 MiB tmpfs of its own; unmounted at the end whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "store"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SPACE}", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    settings.STORAGES = {**settings.STORAGES, "evidence": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(mount), "file_permissions_mode": 0o444}}}
    storages._storages.pop("evidence", None)
    try:
        yield mount
    finally:
        storages._storages.pop("evidence", None)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _objects(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(INCOMING))


def _incoming(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith(INCOMING))


def test_a_file_larger_than_the_store_fails_naming_the_store_and_leaves_no_object(small_store, job, tmp_path):
    kept = store_bytes(job, "node1/records/01-populate.jsonl", b'{"phase": "populate"}\n' * 100, kind="records")
    big = tmp_path / "records.jsonl"
    big.write_bytes(os.urandom(SPACE + 200_000))  # larger than the whole store
    sha256 = hashlib.sha256(big.read_bytes()).hexdigest()

    with pytest.raises(EvidenceStoreError) as raised:
        store_file(job, "node1/records/06-measure.jsonl", big, kind="records")
    message = str(raised.value)
    assert str(small_store) in message and "is full" in message
    assert "node1/records/06-measure.jsonl" in message
    final = small_store / artifact_storage_name(sha256)
    assert not final.exists()  # no piece under the content address
    assert not _incoming(small_store)  # the temporary piece is gone too: the space is free again
    assert not Artifact.objects.filter(job=job, name="node1/records/06-measure.jsonl").exists()
    assert read_artifact(kept) == b'{"phase": "populate"}\n' * 100  # what was stored before is kept

    # Room again (the store grows: a remount, as an operator would do), and the same bytes store whole.
    subprocess.run(["mount", "-o", f"remount,size={4 * SPACE}", str(small_store)], check=True)
    artifact = store_file(job, "node1/records/06-measure.jsonl", big, kind="records")
    assert artifact.sha256 == sha256
    assert read_artifact(artifact) == big.read_bytes()
    assert final.stat().st_size == big.stat().st_size


def test_a_store_filled_by_others_refuses_then_takes_the_same_bytes_once_space_is_freed(small_store, job, tmp_path):
    filler = small_store / "filler"
    filler.write_bytes(b"\0" * (SPACE - 256 * 1024))
    records = tmp_path / "records.jsonl"
    records.write_bytes(b'{"request": 1, "phase": "measure"}\n' * 12_000)  # ~420 kB: more than is left
    with pytest.raises(EvidenceStoreError, match="is full"):
        store_file(job, "node2/records/06-measure.jsonl", records, kind="records")
    assert _objects(small_store) == [filler]
    filler.unlink()
    artifact = store_file(job, "node2/records/06-measure.jsonl", records, kind="records")
    assert read_artifact(artifact) == records.read_bytes()


def test_a_broken_object_under_its_content_address_is_replaced_by_good_bytes(small_store, job):
    data = b'{"phase": "measure", "ttft": 0.12}\n' * 500
    sha256 = hashlib.sha256(data).hexdigest()
    final = small_store / artifact_storage_name(sha256)
    final.parent.mkdir(parents=True)
    final.write_bytes(data[:4096])  # what an earlier release left when the store filled up
    artifact = store_bytes(job, "node1/records/06-measure.jsonl", data, kind="records")
    assert read_artifact(artifact) == data
    assert final.read_bytes() == data

    # Same length, other bytes: not trusted either.
    os.chmod(final, 0o644)
    final.write_bytes(b"x" * len(data))
    again = store_bytes(job, "node1/records/06-measure.jsonl", data, kind="records")
    assert again.pk == artifact.pk and read_artifact(again) == data


def test_bytes_that_do_not_hash_to_the_node_s_digest_store_nothing(small_store, job):
    with pytest.raises(ArtifactMismatch, match="the node computed"):
        store_bytes(job, "node1/x.jsonl", b"bytes", kind="records", remote_sha256="0" * 64)
    assert _objects(small_store) == []


# ── the S3 store ──────────────────────────────────────────────────────────────────────────────────


def test_s3_a_broken_object_under_its_key_is_replaced_and_a_big_one_completes_whole(s3_evidence, job, tmp_path):
    storages._storages.pop("evidence", None)
    data = b'{"phase": "measure"}\n' * 1000 + tmp_path.name.encode()
    key = artifact_storage_name(hashlib.sha256(data).hexdigest())
    s3_evidence.client().put_object(Bucket="fxpilot-evidence", Key=key, Body=data[:4096])
    artifact = store_bytes(job, "node1/records/06-measure.jsonl", data, kind="records")
    assert read_artifact(artifact) == data
    assert s3_evidence.client().get_object(Bucket="fxpilot-evidence", Key=key)["Body"].read() == data

    big = tmp_path / "big.jsonl"
    big.write_bytes(os.urandom(9 * 1024 * 1024 + 17))  # two parts
    stored = store_file(job, "node1/records/big.jsonl", big, kind="records")
    assert read_artifact(stored) == big.read_bytes()
    uploads = s3_evidence.client().list_multipart_uploads(Bucket="fxpilot-evidence").get("Uploads", [])
    assert not [u for u in uploads if u["Key"] == stored.storage_name]


def test_s3_bytes_changed_while_sent_never_appear_under_the_key(s3_evidence, job, tmp_path):
    from runners import artifacts

    storages._storages.pop("evidence", None)
    big = tmp_path / "big.jsonl"
    big.write_bytes(os.urandom(9 * 1024 * 1024))
    claimed = hashlib.sha256(b"what the node hashed").hexdigest()
    with pytest.raises(ArtifactMismatch, match="expected"):
        artifacts.put_file(artifact_storage_name(claimed), big, claimed, what="node1/records/big.jsonl")
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"small")
    with pytest.raises((ArtifactMismatch, EvidenceStoreError)):
        artifacts.put_file(artifact_storage_name(claimed), small, claimed, what="node1/records/small.jsonl")
    assert artifact_storage_name(claimed) not in s3_evidence.keys()


def test_s3_an_unreachable_store_is_named(settings, job, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "evidence": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
        "bucket_name": "fxpilot-evidence", "endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
        "access_key": "x", "secret_key": "y", "default_acl": None}}}
    storages._storages.pop("evidence", None)
    try:
        with pytest.raises(EvidenceStoreError, match=r"s3://fxpilot-evidence/ at http://127\.0\.0\.1:9") as raised:
            store_bytes(job, "node1/records/06-measure.jsonl", b"records", kind="records")
        assert "node1/records/06-measure.jsonl" in str(raised.value)
    finally:
        storages._storages.pop("evidence", None)


# ── the worker's download folder ──────────────────────────────────────────────────────────────────


def test_a_full_download_folder_is_named_and_not_blamed_on_the_node(tmp_path, settings, simnodes, make_node, job):  # noqa: F811
    """A download lands in DATA_DIR/tmp first: that disk full is the worker's, said so, never "cannot read" the node."""
    from runners import ssh

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    server = simnodes(1)[0]
    node = make_node(server)
    (server.root / "records.jsonl").write_bytes(os.urandom(600 * 1024))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(data_dir)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        settings.DATA_DIR = data_dir
        with ssh.connect(node) as conn, pytest.raises(EvidenceStoreError) as raised:
            conn.download("~/records.jsonl", job=job, name="node1/records/06-measure.jsonl", kind="records")
        assert f"to {data_dir}/tmp" in str(raised.value) and "No space left on device" in str(raised.value)
        assert "node1" in str(raised.value)
        assert not list((data_dir / "tmp").iterdir())  # the piece downloaded so far is gone
    finally:
        subprocess.run(["umount", "-l", str(data_dir)], check=False)
