"""Artifacts: raw evidence files, content-addressed by SHA-256, hashed on the node, on upload and on download.

The bytes live in the "evidence" storage (settings.STORAGES): files under DATA_DIR in the embedded
default, objects in an S3-compatible store in production, so a site worker on a jump host needs only
the database, the broker and the store. Every read hashes the bytes again: a file altered in the store
is refused rather than trusted.
"""
from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from django.core.files import File
from django.core.files.storage import storages
from django.db import IntegrityError, transaction

from runners.models import Artifact, Job, Node, Step, artifact_storage_name


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


def evidence_storage():
    return storages["evidence"]


def _has(storage, name: str) -> bool:
    """Is the object already stored? (Content-addressed: an object of that name holds those bytes.)"""
    try:
        return storage.exists(name)
    except OSError:
        return False


def put_file(name: str, source: Path | str, sha256: str) -> None:
    """Store a local file under `name`, checking that the bytes sent are the bytes hashed; never replaces an object."""
    storage = evidence_storage()
    if _has(storage, name):
        return
    with open(source, "rb") as handle:
        sent = _HashingReader(handle)
        stored = storage.save(name, File(sent, name=name))
    if sent.hexdigest() != sha256:
        storage.delete(stored)
        raise ArtifactMismatch(f"{name}: the bytes sent to the store hash to {sent.hexdigest()}, expected {sha256}")
    if stored != name:  # another writer stored the same content first (the file system storage renames)
        storage.delete(stored)


def put_bytes(name: str, data: bytes, sha256: str) -> None:
    with tempfile.NamedTemporaryFile(prefix="fxpilot-evidence-") as tmp:
        tmp.write(data)
        tmp.flush()
        put_file(name, tmp.name, sha256)


def get_bytes(name: str, sha256: str) -> bytes:
    """The stored bytes, hashed again on download: a mismatch raises ArtifactMismatch."""
    try:
        with evidence_storage().open(name, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise ArtifactMismatch(f"{name}: not in the evidence store") from None
    except OSError as exc:
        raise ArtifactMismatch(f"{name}: cannot be read from the evidence store ({exc})") from None
    if sha256_bytes(data) != sha256:
        raise ArtifactMismatch(f"{name}: the stored object no longer hashes to {sha256}")
    return data


def iter_chunks(name: str, sha256: str, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Stream a stored object; the hash is checked at the end and a mismatch raises before the last chunk."""
    digest = hashlib.sha256()
    try:
        handle = evidence_storage().open(name, "rb")
    except FileNotFoundError:
        raise ArtifactMismatch(f"{name}: not in the evidence store") from None
    with handle:
        previous = None
        while block := handle.read(chunk):
            digest.update(block)
            if previous is not None:
                yield previous
            previous = block
    if digest.hexdigest() != sha256:
        raise ArtifactMismatch(f"{name}: the stored object no longer hashes to {sha256}")
    if previous is not None:
        yield previous


def store_bytes(job: Job, name: str, data: bytes, *, kind: str, step: Step | None = None, node: Node | None = None,
                simulated: bool = False, remote_sha256: str | None = None, outcome: str = "") -> Artifact:
    sha256 = sha256_bytes(data)
    if remote_sha256 is not None and remote_sha256 != sha256:
        raise ArtifactMismatch(f"{name}: the node computed SHA-256 {remote_sha256}, the bytes received hash to {sha256}")
    put_bytes(artifact_storage_name(sha256), data, sha256)
    return _record(job, name, sha256, len(data), kind=kind, step=step, node=node, simulated=simulated, outcome=outcome)


def store_file(job: Job, name: str, source: Path | str, *, kind: str, step: Step | None = None, node: Node | None = None,
               simulated: bool = False, remote_sha256: str | None = None, outcome: str = "") -> Artifact:
    """Store a local file (e.g. one just fetched by SFTP) without reading it into memory at once."""
    sha256 = sha256_file(source)
    if remote_sha256 is not None and remote_sha256 != sha256:
        raise ArtifactMismatch(f"{name}: the node computed SHA-256 {remote_sha256}, the file received hashes to {sha256}")
    put_file(artifact_storage_name(sha256), source, sha256)
    return _record(job, name, sha256, Path(source).stat().st_size, kind=kind, step=step, node=node, simulated=simulated,
                   outcome=outcome)


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
    """The stored bytes, re-hashed: a file altered in the store is refused rather than trusted."""
    return get_bytes(artifact.storage_name, artifact.sha256)


def stream_artifact(artifact: Artifact, chunk: int = 1 << 20) -> Iterator[bytes]:
    return iter_chunks(artifact.storage_name, artifact.sha256, chunk)


class _HashingReader:
    """A file wrapper that hashes what is read through it (what the storage actually sends)."""

    def __init__(self, handle) -> None:
        self._handle, self._digest = handle, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._digest.update(data)
        return data

    def seek(self, *args):
        position = self._handle.seek(*args)
        if position == 0:
            self._digest = hashlib.sha256()
        return position

    def tell(self) -> int:
        return self._handle.tell()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def __getattr__(self, name):
        return getattr(self._handle, name)
