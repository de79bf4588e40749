"""The client's PEP 517 / PEP 660 build backend: wheels, editable wheels and sdists made from
pyproject.toml's [project] table and the packages under src/, written only where the frontend
asks (its wheel, sdist and metadata directories). Nothing is written into the source tree —
setuptools writes `build/` and `src/*.egg-info` there on every `pip install ./clients/python` —
and nothing needs installing first (the standard library only; tomli on Python 3.10), so
`pip install --no-index --no-deps --no-build-isolation -e clients/python` works offline.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent  # clients/python
SOURCE = ROOT / "src"
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")
EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip times: the same source builds the same wheel
SDIST_FILES = ("pyproject.toml", "README.md")


# -- PEP 517 / 660 hooks ------------------------------------------------------------------------
def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return [] if sys.version_info >= (3, 11) else ["tomli>=1.1"]


get_requires_for_build_sdist = get_requires_for_build_editable = get_requires_for_build_wheel


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict | None = None) -> str:
    project = Project.read()
    target = Path(metadata_directory) / project.dist_info
    target.mkdir(parents=True, exist_ok=True)
    for name, data in project.dist_info_files():
        (target / name).write_bytes(data)
    return project.dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    project = Project.read()
    return project.write_wheel(Path(wheel_directory), project.package_files())


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    """A wheel holding one .pth line, the source directory: imports read the tree itself."""
    project = Project.read()
    pth = (f"__editable__.{project.normalized}-{project.version}.pth", f"{SOURCE}\n".encode())
    return project.write_wheel(Path(wheel_directory), [pth])


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    project = Project.read()
    base = f"{project.normalized}-{project.version}"
    path = Path(sdist_directory) / f"{base}.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    files = [(name, (ROOT / name).read_bytes()) for name in SDIST_FILES]
    files += [(p.relative_to(ROOT).as_posix(), p.read_bytes()) for p in _walk(Path(__file__).parent)]
    files += [(f"src/{name}", data) for name, data in project.package_files()]
    files.append(("PKG-INFO", project.metadata()))
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files):
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            tar.addfile(info, io.BytesIO(data))
    return path.name


# -- the project --------------------------------------------------------------------------------
class Project:
    def __init__(self, table: dict[str, Any]):
        self.table = table
        self.name: str = table["name"]
        self.version: str = table["version"]
        self.normalized = re.sub(r"[-_.]+", "_", self.name).lower()
        self.dist_info = f"{self.normalized}-{self.version}.dist-info"

    @classmethod
    def read(cls) -> "Project":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10 (get_requires_* asks the frontend for tomli)
            import tomli as tomllib
        with open(ROOT / "pyproject.toml", "rb") as f:
            table = tomllib.load(f)["project"]
        unknown = set(table.get("dynamic", []))
        if unknown:
            raise ValueError(f"this backend takes static metadata; pyproject.toml declares dynamic {sorted(unknown)}")
        return cls(table)

    def metadata(self) -> bytes:
        """Core metadata 2.1 (METADATA in a wheel, PKG-INFO in an sdist)."""
        t = self.table
        lines = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {self.version}"]
        if t.get("description"):
            lines.append(f"Summary: {t['description']}")
        if isinstance(t.get("license"), dict) and t["license"].get("text"):
            lines.append(f"License: {t['license']['text']}")
        if t.get("requires-python"):
            lines.append(f"Requires-Python: {t['requires-python']}")
        lines += [f"Requires-Dist: {dep}" for dep in t.get("dependencies", [])]
        for extra, deps in t.get("optional-dependencies", {}).items():
            lines.append(f"Provides-Extra: {extra}")
            for dep in deps:
                requirement, _, marker = dep.partition(";")
                marker = f"({marker.strip()}) and extra == \"{extra}\"" if marker.strip() else f"extra == \"{extra}\""
                lines.append(f"Requires-Dist: {requirement.strip()}; {marker}")
        readme = t.get("readme")
        if readme:
            lines.append("Description-Content-Type: text/markdown")
            return ("\n".join(lines) + "\n\n" + (ROOT / readme).read_text(encoding="utf-8")).encode()
        return ("\n".join(lines) + "\n").encode()

    def dist_info_files(self) -> list[tuple[str, bytes]]:
        wheel = "Wheel-Version: 1.0\nGenerator: memstream_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        return [("METADATA", self.metadata()), ("WHEEL", wheel.encode())]

    def package_files(self) -> list[tuple[str, bytes]]:
        """(path inside the wheel, bytes) of every file of the packages under src/."""
        return [(p.relative_to(SOURCE).as_posix(), p.read_bytes()) for p in _walk(SOURCE)]

    def write_wheel(self, directory: Path, files: list[tuple[str, bytes]]) -> str:
        name = f"{self.normalized}-{self.version}-py3-none-any.whl"
        files = [*files, *((f"{self.dist_info}/{n}", data) for n, data in self.dist_info_files())]
        record = [f"{n},sha256={_digest(data)},{len(data)}" for n, data in files] + [f"{self.dist_info}/RECORD,,"]
        files.append((f"{self.dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
        directory.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(directory / name, "w", zipfile.ZIP_DEFLATED) as wheel:
            for n, data in files:
                info = zipfile.ZipInfo(n, EPOCH)
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                wheel.writestr(info, data)
        return name


def _walk(top: Path) -> Iterator[Path]:
    for directory, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(names):
            if not name.endswith(SKIP_SUFFIXES):
                yield Path(directory) / name


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
