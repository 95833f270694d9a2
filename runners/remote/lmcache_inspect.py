"""LMCache's version, commit and GPU runtime, read where vLLM lives without importing LMCache (its import pulls in
torch). Shipped to nodes once and run by both probe.sh (G1's inventory) and deploy.sh (each arm's manifest):

    python3 lmcache_inspect.py [DISK_IO_THREADS]
                                      prints one JSON object: installed, version, commit, commit_from, hip, native,
                                      fingerprint, clear_api (and path, or error)

The scripts pass this file's text with 'python -c', so it also runs inside a container launcher that does not
see the node's files. The standard library only.

- version: the distribution's metadata, else lmcache/_version.py (setuptools-scm), else lmcache/__init__.py;
- commit: a git install's direct_url.json (vcs_info.commit_id), else _version.py's __commit_id__ ("g3e11e108";
  written by 0.3.9 and later, 0.5.x included; 0.3.1-0.3.3 release wheels record no commit at all), else a
  +g<hash> local version, else an __init__.py __commit__;
- GPU runtime: the library its native modules link (c_ops in 0.3.x; cuda_ops, lmcache_native in 0.5.x; 0.5.x
  has no c_ops), read from the files: libamdhip64 is a HIP build, libcudart a CUDA one;
- fingerprint: {sha256, version, commit, disk_io_threads, files}: sha256 is the SHA-256 of the text
  "<sha256 of the file>  <path>\n" for every installed .py file and native library (.so) of the package, and of an
  auditwheel `lmcache.libs` folder beside it, sorted by path relative to site-packages (so `sha256sum` over those
  files, sorted, gives the same text); disk_io_threads is the effective count: DISK_IO_THREADS when the rendered
  configuration sets it, else LocalDiskBackend's default (_DEFAULT_THREAD_COUNT in local_disk_backend.py);
- clear_api: whether the installed LMCache serves `DELETE /cache/clear` on its internal API server (the route in
  internal_api_server/, read from the files; LMCache PR #1711, merged 2025-09-28, 0.5.6 has it), which the cold
  windows empty LMCache's DRAM tier with.
"""
import ast
import hashlib
import json
import os
import re
import sys

try:
    from importlib import metadata
except ImportError:
    metadata = None
from importlib import util


def literals(path):
    """NAME = "value" assignments of a file, read without running it."""
    found = {}
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return found
    for node in tree.body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = value
    return found

lm = {"installed": False, "version": None, "commit": None, "commit_from": None, "hip": None, "native": None}
try:
    spec = util.find_spec("lmcache")
except (ImportError, ValueError) as exc:
    spec, lm["error"] = None, type(exc).__name__ + ": " + str(exc)
if spec is None:
    lm.setdefault("error", "no module named lmcache for " + sys.executable)
else:
    lm["installed"] = True
    folders = list(spec.submodule_search_locations or [])
    where = folders[0] if folders else os.path.dirname(spec.origin or "")
    lm["path"] = where
    ver = literals(os.path.join(where, "_version.py"))
    init = literals(os.path.join(where, "__init__.py"))
    dist = None
    if metadata is not None:
        try:
            dist = metadata.distribution("lmcache")
        except metadata.PackageNotFoundError:
            dist = None
    lm["version"] = (dist.version if dist is not None else None) or ver.get("__version__") or init.get("__version__")
    candidates = []
    if dist is not None:
        try:
            vcs = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info") or {}
        except ValueError:
            vcs = {}
        candidates.append(("direct_url.json", vcs.get("commit_id")))
    candidates.append(("_version.py", ver.get("__commit_id__")))
    local = re.search(r"\+g?([0-9a-f]{7,40})(?:\.|$)", lm["version"] or "")
    candidates.append(("version", local.group(1) if local else None))
    candidates.append(("__init__.py", init.get("__commit__")))
    for source, value in candidates:
        if isinstance(value, str) and re.match(r"^g?[0-9a-f]{7,40}$", value):
            lm["commit"], lm["commit_from"] = re.sub(r"^g", "", value), source
            break
    # The GPU runtime the native modules link (c_ops in 0.3.x; cuda_ops, lmcache_native in 0.5.x), read from the
    # files themselves without loading them: libamdhip64 is a HIP build, libcudart a CUDA one.
    try:
        names = sorted(os.listdir(where))
    except OSError:
        names = []
    for name in names:
        if not re.match(r"^(c_ops|\w+_ops|lmcache_native)\b.*\.(so|py)$", name):
            continue
        runtime = None
        try:
            with open(os.path.join(where, name), "rb") as handle:
                tail = b""
                for block in iter(lambda: handle.read(1 << 20), b""):
                    chunk = tail + block
                    if b"amdhip64" in chunk:
                        runtime = True
                        break
                    if b"libcudart" in chunk:
                        runtime = False
                    tail = chunk[-16:]
        except OSError:
            continue
        if runtime is not None:
            lm["hip"], lm["native"] = runtime, name
            if runtime:
                break


def fingerprint(where, configured):
    """SHA-256 over the package's .py files and native libraries (see the module's docstring)."""
    root = os.path.dirname(where)
    folders = [where] + [os.path.join(root, name) for name in ("lmcache.libs",) if os.path.isdir(os.path.join(root, name))]
    entries = []
    for folder in folders:
        for base, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if not (name.endswith(".py") or re.search(r"\.so(\.[0-9.]+)?$", name)):
                    continue
                path = os.path.join(base, name)
                digest = hashlib.sha256()
                try:
                    with open(path, "rb") as handle:
                        for block in iter(lambda: handle.read(1 << 20), b""):
                            digest.update(block)
                except OSError:
                    continue
                entries.append((os.path.relpath(path, root), digest.hexdigest()))
    entries.sort()
    text = "".join(f"{digest}  {path}\n" for path, digest in entries)
    default = literals(os.path.join(where, "v1", "storage_backend", "local_disk_backend.py")).get("_DEFAULT_THREAD_COUNT")
    threads = int(configured) if configured and configured.isdigit() else default
    return {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "version": lm["version"],
            "commit": lm["commit"], "disk_io_threads": threads, "disk_io_threads_from": "config" if configured else "default",
            "files": len(entries)}


def serves_clear(where):
    """Does any module of internal_api_server/ declare the DELETE /cache/clear route?"""
    route = re.compile(r"""\.delete\(\s*["']/cache/clear["']""")
    for base, dirs, files in os.walk(os.path.join(where, "v1", "internal_api_server")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                try:
                    with open(os.path.join(base, name), encoding="utf-8", errors="replace") as handle:
                        if route.search(handle.read()):
                            return True
                except OSError:
                    continue
    return False


lm["fingerprint"], lm["clear_api"] = None, None
if lm["installed"]:
    lm["fingerprint"] = fingerprint(lm["path"], sys.argv[1] if len(sys.argv) > 1 else "")
    lm["clear_api"] = serves_clear(lm["path"])
print(json.dumps(lm))
