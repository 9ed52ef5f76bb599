"""The Python sources of a released wheel, read without installing or importing it.

pip picks the wheel for a requirement from the user's configured index (its configuration applies: nothing here
names an index), only the files a caller selects are fetched (HTTP range requests, or pip downloads the whole wheel),
and they are unpacked into the cache (TRL_FORK_CACHE, else ~/.cache/trl-fork). `Sources` parses them with `ast` on
demand. The vLLM contract tests of the lines use it (lines/0.16.1/tests/build/test_vllm_contract.py,
lines/1.16.0/tests/build/test_vllm_contract.py).
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import NamedTuple


sys.path.insert(0, str(Path(__file__).resolve().parent))
import forkbuild  # noqa: E402


# ------------------------------------------------------------------------------------------- reading sources


class Sources:
    """The unpacked sources of one release (the folder holding its top-level package), parsed on demand."""

    def __init__(self, root: Path):
        self.root = root
        self._parsed = {}

    def _path(self, dotted: str) -> Path | None:
        base = self.root / Path(*dotted.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    def module(self, dotted: str) -> ast.Module | None:
        if dotted not in self._parsed:
            path = self._path(dotted)
            self._parsed[dotted] = ast.parse(path.read_text(encoding="utf-8")) if path else None
        return self._parsed[dotted]

    def is_package(self, dotted: str) -> bool:
        return (self.root / Path(*dotted.split(".")) / "__init__.py").is_file()

    def package_modules(self, dotted: str) -> list[ast.Module]:
        """`vllm.config` as one module (older releases) or a package of modules (later ones)."""
        folder = self.root / Path(*dotted.split("."))
        if folder.is_dir():
            return [ast.parse(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py"))]
        module = self.module(dotted)
        return [module] if module else []

    def walk(self, dotted: str) -> list[str]:
        """The dotted names of every module under the package `dotted` (at any depth), sorted."""
        folder = self.root / Path(*dotted.split("."))
        names = []
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(self.root).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        return names

    def cls(self, dotted: str, name: str) -> ast.ClassDef | None:
        module = self.module(dotted)
        return next((n for n in top_level(module) if isinstance(n, ast.ClassDef) and n.name == name), None)

    def absolute(self, dotted: str, node: ast.ImportFrom) -> str:
        """The module an `ImportFrom` in module `dotted` names, relative imports resolved."""
        if not node.level:
            return node.module or ""
        parts = dotted.split(".") if self.is_package(dotted) else dotted.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

    def definition(self, dotted: str, name: str, _depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, node) defining `name` as seen from module `dotted`, following `from ... import` re-exports.

        The node is a ClassDef, a FunctionDef, the Assign / AnnAssign of a module-level name, or a Module where the
        name is a submodule."""
        module = self.module(dotted)
        if module is None or _depth > 8:
            return None
        found = None
        for node in top_level(module):  # the last binding wins, as at run time
            defines = (
                (isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name)
                or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets))
                or (isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name)
            )
            if defines:
                found = (dotted, node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self.absolute(dotted, node)
                        found = self.definition(source, alias.name, _depth + 1)
                        if found is None and self.module(f"{source}.{alias.name}") is not None:
                            found = (f"{source}.{alias.name}", self.module(f"{source}.{alias.name}"))
        return found


def top_level(module: ast.Module | None):
    """Top-level statements, looking inside top-level `if` / `try` blocks."""
    pending = list(module.body) if module else []
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            pending[:0] = node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            pending[:0] = [s for handler in getattr(node, "handlers", []) for s in handler.body]
        else:
            yield node


def top_level_names(module: ast.Module | None) -> set[str]:
    names = set()
    for node in top_level(module):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    """The last definition of `name` in the class body (overloads come first, the implementation last)."""
    found = [n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef) and n.name == name]
    return found[-1] if found else None


def parameters(func: ast.FunctionDef) -> tuple[list[str], bool]:
    """(the parameter names that can be passed by keyword, in order; whether it takes **kwargs)."""
    args = func.args
    return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs], args.kwarg is not None


def fields(cls: ast.ClassDef | None) -> set[str]:
    """Annotated class attributes: the fields of a dataclass, a msgspec.Struct or a pydantic model."""
    body = cls.body if cls else []
    return {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def assigns_self(cls: ast.ClassDef | None, attribute: str) -> bool:
    """Some method of the class sets `self.<attribute>`."""
    for node in ast.walk(cls) if cls else ():
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
            isinstance(t, ast.Attribute) and t.attr == attribute and getattr(t.value, "id", None) == "self"
            for t in targets
        ):
            return True
    return False


def mentions(node: ast.AST | None, name: str) -> bool:
    """`name` appears in the node as an identifier or an attribute."""
    return node is not None and any(
        (isinstance(n, ast.Name) and n.id == name) or (isinstance(n, ast.Attribute) and n.attr == name)
        for n in ast.walk(node)
    )


# ------------------------------------------------------------------------------------------ fetching wheels


class Wheel(NamedTuple):
    name: str  # the distribution, as its metadata spells it
    version: str
    url: str
    sha256: str  # as the index gives it; empty if it gives none


def _pip(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    # pip retries an unreachable index for a few minutes on its own; past 10 minutes the test fails instead of hanging
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def resolve(requirement: str) -> Wheel:
    """The wheel pip picks for `requirement` on this platform.

    pip reads the release's metadata file from the index, not the wheel: a few seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        _pip("install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed", "--only-binary=:all:",
             "--report", str(report), requirement)  # fmt: skip
        (item,) = json.loads(report.read_text())["install"]
    info = item["download_info"]
    sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256", "")
    return Wheel(item["metadata"]["name"], item["metadata"]["version"], info["url"], sha256)


class _HttpRanges(io.RawIOBase):
    """A remote file read with HTTP range requests, in cached blocks: zipfile reads the central directory at the end
    and then only the members it extracts (about 2 MB of a 265 MB vLLM wheel)."""

    BLOCK = 1 << 18

    def __init__(self, url: str):
        self.url, self.pos, self.blocks = url, 0, {}
        with self._get("bytes=-1") as response:
            self.size = int(response.headers["Content-Range"].rsplit("/", 1)[1])

    def _get(self, byte_range: str):
        request = urllib.request.Request(self.url, headers={"Range": byte_range})
        response = urllib.request.urlopen(request, timeout=60)
        if response.status != 206:
            response.close()
            raise OSError(f"{self.url} answers {response.status} to a range request")
        return response

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def readinto(self, buffer):
        wanted = max(0, min(len(buffer), self.size - self.pos))
        data = bytearray()
        while len(data) < wanted:
            index, skip = divmod(self.pos + len(data), self.BLOCK)
            if index not in self.blocks:
                first, last = index * self.BLOCK, min(self.size, (index + 1) * self.BLOCK) - 1
                with self._get(f"bytes={first}-{last}") as response:
                    self.blocks[index] = response.read()
            data += self.blocks[index][skip : skip + wanted - len(data)]
        buffer[:wanted] = data
        self.pos += wanted
        return wanted


def fetch_sources(requirement: str, members: re.Pattern, cache: str) -> tuple[str, Path]:
    """(version, folder holding the unpacked members) of the wheel pip picks for `requirement`; cached.

    `members` selects the archive members to unpack (matched against their names, e.g. `vllm/envs.py`); the folder is
    <cache dir>/<cache>/<wheel name>, kept while the index's sha256 and the selection stay the same. Only those
    members are fetched, with HTTP range requests; where the server does not serve ranges, or with
    TRL_FORK_VLLM_FETCH=pip, pip downloads the whole wheel (265-380 MB for vLLM) and its sha256 is checked against
    the index's."""
    wheel = resolve(requirement)
    wheel_name = urllib.parse.unquote(wheel.url.rsplit("/", 1)[-1])
    dest = forkbuild.cache_dir() / cache / wheel_name.removesuffix(".whl")
    stamp, selection = dest / "source", f"members {members.pattern}"
    if stamp.is_file() and (not wheel.sha256 or wheel.sha256 in stamp.read_text()) and selection in stamp.read_text():
        return wheel.version, dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)

    def unpack(archive: zipfile.ZipFile, into: Path) -> None:
        # zipfile checks each member's CRC-32 against the archive's directory as it extracts it
        archive.extractall(into, [n for n in archive.namelist() if members.match(n)])

    with tempfile.TemporaryDirectory(prefix="wheel-", dir=dest.parent) as tmp:
        unpacked = Path(tmp) / "unpacked"
        how = None
        if os.environ.get("TRL_FORK_VLLM_FETCH", "range") == "range" and wheel.url.startswith(("https:", "http:")):
            try:
                with zipfile.ZipFile(io.BufferedReader(_HttpRanges(wheel.url), 1 << 16)) as archive:
                    unpack(archive, unpacked)
                how = f"members read by HTTP range requests from {wheel.url} (index sha256 {wheel.sha256})"
            except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
                print(f"range requests failed ({exc}); downloading the whole wheel through pip", file=sys.stderr)
                shutil.rmtree(unpacked, ignore_errors=True)
        if how is None:
            _pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", tmp,
                 f"{wheel.name}=={wheel.version}")  # fmt: skip
            path = Path(tmp) / wheel_name
            digest = forkbuild.sha256_of(path)
            if wheel.sha256 and digest != wheel.sha256:
                raise RuntimeError(f"{wheel_name}: sha256 {digest}, the index says {wheel.sha256}")
            with zipfile.ZipFile(path) as archive:
                unpack(archive, unpacked)
            how = f"unpacked from the whole wheel downloaded by pip (sha256 {digest})"
        unpacked.mkdir(exist_ok=True)
        (unpacked / "source").write_text(f"{how}\n{selection}\n")
        os.replace(unpacked, dest)
    return wheel.version, dest
