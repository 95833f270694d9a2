"""Evidence in a real S3-compatible store (SeaweedFS): hashed on upload, on download, never on the local disk."""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from runners.artifacts import ArtifactMismatch, read_artifact, store_bytes, store_file, stream_artifact

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(db):
    from gates.models import Organisation, Pilot
    from runners.models import Job

    vendor = Organisation.objects.create(name="Vendor S3", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name="Customer S3", kind=Organisation.Kind.CUSTOMER)
    pilot = Pilot.objects.create(name="Pilot S3", vendor=vendor, customer=customer)
    return Job.objects.create(pilot=pilot, kind=Job.Kind.PROBE)


def test_an_artifact_goes_to_the_bucket_and_comes_back_hashed(s3_evidence, job, settings, tmp_path):
    data = b'{"schema": "fxpilot.request/1"}\n' * 1000 + tmp_path.name.encode()
    artifact = store_bytes(job, "node1/records/01-measure.jsonl", data, kind="records")
    assert artifact.storage_name in s3_evidence.keys()
    assert not artifact.path.exists()  # nothing on the local disk
    assert read_artifact(artifact) == data
    assert b"".join(stream_artifact(artifact, chunk=4096)) == data

    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * 40000 + b"x")  # ~10 MB: a multipart upload
    big = store_file(job, "node1/metrics/big.bin", source, kind="raw", remote_sha256=hashlib.sha256(source.read_bytes()).hexdigest())
    assert read_artifact(big) == source.read_bytes()


def test_an_object_altered_in_the_bucket_is_refused(s3_evidence, job, tmp_path):
    artifact = store_bytes(job, "node1/records/tampered.jsonl", b"original " + tmp_path.name.encode(), kind="records")
    s3_evidence.client().put_object(Bucket="fxpilot-evidence", Key=artifact.storage_name, Body=b"altered")
    with pytest.raises(ArtifactMismatch, match="no longer hashes"):
        read_artifact(artifact)
    with pytest.raises(ArtifactMismatch, match="no longer hashes"):
        b"".join(stream_artifact(artifact))


def test_a_transfer_the_node_hashed_differently_is_not_stored(s3_evidence, job):
    with pytest.raises(ArtifactMismatch, match="the node computed"):
        store_bytes(job, "node1/x.jsonl", b"bytes", kind="records", remote_sha256="0" * 64)
    assert not job.artifacts.exists()


def test_a_report_is_stored_once_and_read_back_verified(s3_evidence, tmp_path):
    from reports import service

    pilot = SimpleNamespace(code=tmp_path.name)
    path, sha256 = service._store(pilot, "r1", b"%PDF-1.7 not really")
    assert path in s3_evidence.keys()
    assert service.report_bytes(SimpleNamespace(path=path, sha256=sha256)) == b"%PDF-1.7 not really"
    with pytest.raises(service.ReportError, match="already exists"):
        service._store(pilot, "r1", b"%PDF-1.7 another")
    with pytest.raises(service.ReportError, match="no longer hashes"):
        service.report_bytes(SimpleNamespace(path=path, sha256="1" * 64))
