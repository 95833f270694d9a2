"""Artifacts: raw evidence files, content-addressed by SHA-256, hashed on the node, on upload and on download.

The bytes live in the "evidence" storage (settings.STORAGES): files under DATA_DIR in the embedded
default, objects in an S3-compatible store in production, so a site worker on a jump host needs only
the database, the broker and the store. Every read hashes the bytes again: a file altered in the store
is refused rather than trusted.

Writes are atomic: an object appears under its content address whole and hashed, or not at all (put_file).
A store that cannot take the bytes — full, read-only, unreachable — raises EvidenceStoreError naming the
store and the artifact; what was stored before stays, and the same bytes store whole once there is room.
"""
from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from django.core.files import File
from django.core.files.storage import FileSystemStorage, storages
from django.db import IntegrityError, transaction

from runners.models import Artifact, Job, Node, Step, artifact_storage_name

log = logging.getLogger(__name__)


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


class EvidenceStoreError(Exception):
    """The evidence store could not take an object (full, read-only, unreachable). Nothing is left under the
    object's name and everything stored before is kept; the message names the store and what was being written."""


# An object larger than this goes to an object store in parts (multipart upload), each with its own SHA-256.
S3_PART_BYTES = 8 * 1024 * 1024
INCOMING = ".incoming"   # the suffix of an object the file system store is still writing (hidden, next to it)


def describe_store(storage=None) -> str:
    """The evidence store in words a person can find it by: its folder, or its bucket and endpoint."""
    storage = storage if storage is not None else evidence_storage()
    bucket = getattr(storage, "bucket_name", None)
    if bucket:
        prefix = getattr(storage, "location", "") or ""
        endpoint = getattr(storage, "endpoint_url", None) or "AWS"
        return f"the evidence store s3://{bucket}/{prefix}{'/' if prefix else ''} at {endpoint}"
    location = getattr(storage, "location", None)
    return f"the evidence store {location}" if location else f"the evidence store ({type(storage).__name__})"


def _is_local(storage) -> bool:
    return isinstance(storage, FileSystemStorage)


def _is_s3(storage) -> bool:
    return bool(getattr(storage, "bucket_name", None)) and hasattr(storage, "connection")


def _s3_key(storage, name: str) -> str:
    from storages.utils import clean_name  # django-storages: only where the store is S3

    return storage._normalize_name(clean_name(name))


def _stored_state(storage, name: str, sha256: str, size: int) -> str:
    """'good' (an object of that name holds exactly those bytes), 'absent' or 'broken' (something else is there:
    a piece an earlier release left when the store filled up, or altered bytes). Never trusts a name alone."""
    if _is_local(storage):
        path = Path(storage.path(name))
        try:
            if path.stat().st_size != size:
                return "broken"
        except FileNotFoundError:
            return "absent"
        try:
            return "good" if sha256_file(path) == sha256 else "broken"
        except OSError:
            return "broken"
    if _is_s3(storage):
        from botocore.exceptions import ClientError

        try:
            head = storage.connection.meta.client.head_object(Bucket=storage.bucket_name, Key=_s3_key(storage, name))
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return "absent"
            raise
        if int(head.get("ContentLength", -1)) != size:
            return "broken"
    elif not storage.exists(name):
        return "absent"
    try:
        for _ in iter_chunks(name, sha256):
            pass
    except ArtifactMismatch:
        return "broken"
    return "good"


def put_file(name: str, source: Path | str, sha256: str, *, what: str | None = None) -> None:
    """Store a local file under `name`, only whole and only if its bytes hash to `sha256`.

    The object is written under a temporary name (a hidden `….incoming` file next to it, or a multipart
    upload not yet completed) and moved or completed into `name` only once every byte is written and hashed.
    An object already under `name` is trusted only when its bytes hash to `sha256`; a broken one is replaced.
    A store that cannot take the bytes (full, read-only, unreachable) raises EvidenceStoreError naming the
    store and `what` (the artifact's name); nothing is left under `name`.
    """
    storage = evidence_storage()
    size = os.path.getsize(source)
    label = f"{what} ({size:,} bytes, object {name})" if what else f"{name} ({size:,} bytes)"
    try:
        state = _stored_state(storage, name, sha256, size)
    except Exception as exc:  # noqa: BLE001 — the store cannot be looked at: say which and why
        raise EvidenceStoreError(f"{describe_store(storage)} cannot be read to check {label}: {_reason(exc)}") from exc
    if state == "good":
        return
    if state == "broken":
        log.warning("%s: %s holds bytes that do not hash to %s; replacing them", describe_store(storage), name, sha256)
    try:
        if _is_local(storage):
            _put_local(storage, name, source, sha256)
        elif _is_s3(storage):
            _put_s3(storage, name, source, sha256)
        else:
            _put_other(storage, name, source, sha256)
    except (ArtifactMismatch, EvidenceStoreError):
        raise
    except Exception as exc:  # noqa: BLE001 — a store that cannot take the bytes is named, with what was written
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise EvidenceStoreError(f"{describe_store(storage)} {'is full' if full else 'refused the write'}: could not "
                                 f"store {label}: {_reason(exc)}; nothing was stored under that name and everything "
                                 "stored before is kept") from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip() or type(exc).__name__


def _put_local(storage: FileSystemStorage, name: str, source: Path | str, sha256: str) -> None:
    """Write a hidden `.<name>.…incoming` file next to the object (so on the same file system, whatever is mounted
    where), fsync it, check its hash, then rename it into the content address: atomic."""
    final = Path(storage.path(name))
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name[:24]}.", suffix=INCOMING)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, open(source, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise ArtifactMismatch(f"{name}: the bytes sent to the store hash to {digest.hexdigest()}, expected {sha256}")
        mode = storage.file_permissions_mode
        os.chmod(temporary, mode if mode is not None else 0o644)
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        folder = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _put_s3(storage, name: str, source: Path | str, sha256: str) -> None:
    """One PUT with the whole object's SHA-256 (the store refuses other bytes), or a multipart upload whose parts
    each carry their SHA-256 and which is completed only when the whole file hashed to `sha256` (else aborted):
    in both cases the object appears under its key whole, or not at all."""
    client = storage.connection.meta.client
    bucket, key = storage.bucket_name, _s3_key(storage, name)
    params = {k: v for k, v in storage._get_write_parameters(key).items() if not k.startswith("Checksum")}
    size = os.path.getsize(source)
    with open(source, "rb") as handle:
        if size <= S3_PART_BYTES:
            data = handle.read()
            if sha256_bytes(data) != sha256:
                raise ArtifactMismatch(f"{name}: the bytes sent to the store hash to {sha256_bytes(data)}, expected {sha256}")
            client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256",
                              ChecksumSHA256=_b64(bytes.fromhex(sha256)), **params)
            return
        upload = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256", **params)["UploadId"]
        try:
            digest, parts = hashlib.sha256(), []
            while block := handle.read(S3_PART_BYTES):
                digest.update(block)
                checksum = _b64(hashlib.sha256(block).digest())
                answer = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=len(parts) + 1,
                                            Body=block, ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum)
                parts.append({"PartNumber": len(parts) + 1, "ETag": answer["ETag"], "ChecksumSHA256": checksum})
            if digest.hexdigest() != sha256:
                raise ArtifactMismatch(f"{name}: the bytes sent to the store hash to {digest.hexdigest()}, "
                                       f"expected {sha256}")
            client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
        except BaseException:
            with contextlib.suppress(Exception):
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            raise


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _put_other(storage, name: str, source: Path | str, sha256: str) -> None:
    """Another storage backend: saved through Django's API and hashed on the way; a mismatch is deleted."""
    if storage.exists(name):
        storage.delete(name)
    with open(source, "rb") as handle:
        sent = _HashingReader(handle)
        stored = storage.save(name, File(sent, name=name))
    if sent.hexdigest() != sha256:
        storage.delete(stored)
        raise ArtifactMismatch(f"{name}: the bytes sent to the store hash to {sent.hexdigest()}, expected {sha256}")
    if stored != name:  # another writer stored the same content first (the storage renamed ours)
        storage.delete(stored)


def put_bytes(name: str, data: bytes, sha256: str, *, what: str | None = None) -> None:
    with tempfile.NamedTemporaryFile(prefix="fxpilot-evidence-") as tmp:
        tmp.write(data)
        tmp.flush()
        put_file(name, tmp.name, sha256, what=what)


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
    put_bytes(artifact_storage_name(sha256), data, sha256, what=name)
    return _record(job, name, sha256, len(data), kind=kind, step=step, node=node, simulated=simulated, outcome=outcome)


def store_file(job: Job, name: str, source: Path | str, *, kind: str, step: Step | None = None, node: Node | None = None,
               simulated: bool = False, remote_sha256: str | None = None, outcome: str = "") -> Artifact:
    """Store a local file (e.g. one just fetched by SFTP) without reading it into memory at once."""
    sha256 = sha256_file(source)
    if remote_sha256 is not None and remote_sha256 != sha256:
        raise ArtifactMismatch(f"{name}: the node computed SHA-256 {remote_sha256}, the file received hashes to {sha256}")
    put_file(artifact_storage_name(sha256), source, sha256, what=name)
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
