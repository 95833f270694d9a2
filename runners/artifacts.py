"""Artifacts: raw evidence files, content-addressed by SHA-256, hashed on the node and again here."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from django.db import IntegrityError, transaction

from runners.models import Artifact, Job, Node, Step, artifact_path


class ArtifactMismatch(Exception):
    """The bytes received do not hash to what the node computed: the transfer is not trusted."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _place(sha256: str, write) -> Path:
    target = artifact_path(sha256)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def store_bytes(job: Job, name: str, data: bytes, *, kind: str, step: Step | None = None, node: Node | None = None,
                simulated: bool = False, remote_sha256: str | None = None) -> Artifact:
    sha256 = sha256_bytes(data)
    if remote_sha256 is not None and remote_sha256 != sha256:
        raise ArtifactMismatch(f"{name}: the node computed SHA-256 {remote_sha256}, the bytes received hash to {sha256}")
    _place(sha256, lambda handle: handle.write(data))
    return _record(job, name, sha256, len(data), kind=kind, step=step, node=node, simulated=simulated)


def store_file(job: Job, name: str, source: Path | str, *, kind: str, step: Step | None = None, node: Node | None = None,
               simulated: bool = False, remote_sha256: str | None = None) -> Artifact:
    """Store a local file (e.g. one just fetched by SFTP) without reading it into memory at once."""
    sha256 = sha256_file(source)
    if remote_sha256 is not None and remote_sha256 != sha256:
        raise ArtifactMismatch(f"{name}: the node computed SHA-256 {remote_sha256}, the file received hashes to {sha256}")

    def copy(handle) -> None:
        with open(source, "rb") as src:
            while block := src.read(1 << 20):
                handle.write(block)

    _place(sha256, copy)
    return _record(job, name, sha256, Path(source).stat().st_size, kind=kind, step=step, node=node, simulated=simulated)


def _record(job: Job, name: str, sha256: str, size: int, **fields) -> Artifact:
    existing = Artifact.objects.filter(job=job, name=name).first()
    if existing is not None:
        if existing.sha256 != sha256:
            raise ArtifactMismatch(f"{name}: already stored for this job with SHA-256 {existing.sha256}, now {sha256}")
        return existing
    try:
        with transaction.atomic():
            return Artifact.objects.create(job=job, name=name, sha256=sha256, size=size, **fields)
    except IntegrityError:
        return _record(job, name, sha256, size, **fields)


def read_artifact(artifact: Artifact) -> bytes:
    """The stored bytes, re-hashed: a file altered on disk is refused rather than trusted."""
    data = artifact.path.read_bytes()
    if sha256_bytes(data) != artifact.sha256:
        raise ArtifactMismatch(f"{artifact.name}: the stored file no longer hashes to {artifact.sha256}")
    return data
