"""LMCache's version, commit and GPU runtime, read where vLLM lives without importing LMCache (its import pulls in
torch). Shipped to nodes once and run by both probe.sh (G1's inventory) and deploy.sh (each arm's manifest):

    python3 lmcache_inspect.py        prints one JSON object: installed, version, commit, commit_from, hip, native
                                      (and path, or error)

The scripts pass this file's text with 'python -c', so it also runs inside a container launcher that does not
see the node's files. The standard library only.

- version: the distribution's metadata, else lmcache/_version.py (setuptools-scm), else lmcache/__init__.py;
- commit: a git install's direct_url.json (vcs_info.commit_id), else _version.py's __commit_id__ ("g3e11e108";
  written by 0.3.9 and later, 0.5.x included; 0.3.1-0.3.3 release wheels record no commit at all), else a
  +g<hash> local version, else an __init__.py __commit__;
- GPU runtime: the library its native modules link (c_ops in 0.3.x; cuda_ops, lmcache_native in 0.5.x; 0.5.x
  has no c_ops), read from the files: libamdhip64 is a HIP build, libcudart a CUDA one.
"""
import ast
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
print(json.dumps(lm))
