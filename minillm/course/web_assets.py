"""Web assets for the offline slide decks: npm packages downloaded once from the npm registry,
checked against a pinned hash, cached, and copied next to the decks.

A deck then loads reveal.js and KaTeX from relative paths (`assets/reveal.js-6.0.2/...`), so it
opens with the network off. Only building needs the registry, and only once per machine:

    tarballs   $MINILLM_CACHE/npm/<name>-<version>.tgz   (default ~/.cache/minillm/npm)
    registry   $npm_config_registry, else https://registry.npmjs.org/  (npm's own variable)

With no network and no cached tarball, `tarball()` raises AssetUnavailable saying which file to
put where (`npm pack <name>@<version>` on any machine with the registry writes exactly that file).
"""
from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass

from minillm.model_zoo import cache_dir

DEFAULT_REGISTRY = "https://registry.npmjs.org/"
REGISTRY_ENV = "npm_config_registry"   # npm's own setting: a mirror serves the same tarball paths
DOWNLOAD_TIMEOUT_S = 60
TARBALL_ROOT = "package/"              # every npm tarball holds its files under package/
COMPLETE_MARKER = ".complete"          # written last into an installed asset folder


class AssetUnavailable(RuntimeError):
    """An npm package could not be obtained or failed its integrity check; the message says how to fix it."""


@dataclass(frozen=True)
class NpmPackage:
    """One pinned npm package and the files of it that a deck loads."""
    name: str
    version: str
    integrity: str            # the registry's dist.integrity for this version: "sha512-<base64>"
    files: tuple[str, ...]    # paths inside the package; one ending in "/" names a whole folder

    @property
    def tarball_name(self) -> str:
        """File name of the tarball, as `npm pack` writes it (a scope's @ and / become - and dropped)."""
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"

    @property
    def folder(self) -> str:
        """Folder under assets/ that holds this version's files."""
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}"

    def tarball_url(self, registry: str) -> str:
        """Where the registry serves the tarball: <registry><name>/-/<basename>-<version>.tgz."""
        basename = self.name.split("/")[-1]
        return f"{registry.rstrip('/')}/{self.name}/-/{basename}-{self.version}.tgz"


# reveal.js 6 ships UMD bundles (globals Reveal and RevealNotes: no module loader needed) and a
# white theme with its fonts inlined; the notes plugin writes its speaker view itself (no extra file).
REVEAL = NpmPackage(
    "reveal.js", "6.0.2",
    "sha512-JYIg5D9aoxoaLeb84O+OvAwsKWdIavVgEDScxtYEXFCT6t6TQrhNtSgogcjdCpdLsWglhJn3zyE3fUOwiH5KEg==",
    files=("LICENSE", "dist/reveal.js", "dist/reveal.css", "dist/theme/white.css", "dist/plugin/notes.js"),
)
# KaTeX renders the notebooks' $...$ and $$...$$ in the browser; its CSS loads the fonts from fonts/.
KATEX = NpmPackage(
    "katex", "0.19.1",
    "sha512-jG8uKntjSEcm2EpQOh0XturpPuuC9r3Sq5HLHdsFdWZT27E672SF19QEi+of0/YeOy15lDgRhKvr5614uRrEfA==",
    files=("LICENSE", "dist/katex.min.js", "dist/katex.min.css", "dist/contrib/auto-render.min.js", "dist/fonts/"),
)
DECK_PACKAGES = (REVEAL, KATEX)


def npm_cache_dir() -> str:
    return os.path.join(cache_dir(), "npm")


def registry() -> str:
    return os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY


def integrity_of(path: str) -> str:
    """The npm-style integrity string ("sha512-<base64>") of a file."""
    digest = hashlib.sha512()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode("ascii")


def tarball(pkg: NpmPackage) -> str:
    """Path of the package's tarball in the cache, downloaded from the registry if absent.
    The file is checked against the pinned integrity every time; a cached file that fails is
    dropped and fetched again. Raises AssetUnavailable when it cannot be had."""
    path = os.path.join(npm_cache_dir(), pkg.tarball_name)
    if os.path.isfile(path):
        if integrity_of(path) == pkg.integrity:
            return path
        os.remove(path)   # corrupt or replaced: never hand a deck unverified code
    os.makedirs(os.path.dirname(path), exist_ok=True)
    url = pkg.tarball_url(registry())
    # download beside the target and rename, so an interrupted download never looks cached
    fd, partial = tempfile.mkstemp(prefix=pkg.tarball_name + ".", suffix=".part", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            shutil.copyfileobj(resp, out)
        got = integrity_of(partial)
        if got != pkg.integrity:
            raise AssetUnavailable(f"{url} does not match the pinned integrity of {pkg.name} {pkg.version} "
                                   f"(expected {pkg.integrity}, got {got}); check {REGISTRY_ENV}, or "
                                   f"update the pin in {__name__} if the version changed on purpose")
        os.replace(partial, path)
    except (urllib.error.URLError, OSError) as e:
        raise AssetUnavailable(
            f"cannot download {pkg.name} {pkg.version} from {url} ({e}). Building slides needs the npm "
            f"registry once per machine; the tarball is then cached. Without network, put the file "
            f"{pkg.tarball_name} (from `npm pack {pkg.name}@{pkg.version}` on a machine with network) "
            f"into {os.path.dirname(path)}, or set {REGISTRY_ENV} to a reachable mirror.") from e
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def install(pkg: NpmPackage, assets_dir: str) -> str:
    """Copy the package's deck files into <assets_dir>/<name>-<version>/ (once) -> that folder."""
    target = os.path.join(assets_dir, pkg.folder)
    if _installed(pkg, target):
        return target
    source = tarball(pkg)
    os.makedirs(assets_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=pkg.folder + ".", dir=assets_dir)
    try:
        copied = _extract(source, pkg.files, staging)
        missing = [w for w in pkg.files if not any(_names(w, c) for c in copied)]
        if missing:
            raise AssetUnavailable(f"{pkg.tarball_name} lacks {missing}; the pin in {__name__} names files "
                                   "of another version")
        with open(os.path.join(staging, COMPLETE_MARKER), "w", encoding="ascii") as f:
            f.write(pkg.integrity)
        shutil.rmtree(target, ignore_errors=True)   # a stale or half-written copy
        try:
            os.replace(staging, target)
        except OSError:
            if not _installed(pkg, target):   # else another build installed it meanwhile
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _installed(pkg: NpmPackage, target: str) -> bool:
    """Whether target holds a complete copy of this very tarball's files."""
    try:
        with open(os.path.join(target, COMPLETE_MARKER), encoding="ascii") as f:
            return f.read() == pkg.integrity
    except OSError:
        return False


def install_all(assets_dir: str, packages: tuple[NpmPackage, ...] = DECK_PACKAGES) -> dict[str, str]:
    """Install every package a deck loads -> {package name: its folder}."""
    return {pkg.name: install(pkg, assets_dir) for pkg in packages}


def _extract(tar_path: str, wanted: tuple[str, ...], dest: str) -> list[str]:
    """Write the regular files of the tarball that `wanted` names into dest -> their package paths.
    Paths are rebuilt from checked names (never handed to tarfile), so nothing lands outside dest."""
    copied = []
    with tarfile.open(tar_path, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(TARBALL_ROOT):
                continue
            rel = posixpath.normpath(member.name[len(TARBALL_ROOT):])
            if rel.startswith("../") or posixpath.isabs(rel):
                continue
            if not any(_names(w, rel) for w in wanted):
                continue
            out = os.path.join(dest, *rel.split("/"))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with tar.extractfile(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            copied.append(rel)
    return copied


def _names(wanted: str, rel: str) -> bool:
    """Whether the entry `wanted` of NpmPackage.files (a file, or a folder ending in "/") covers `rel`."""
    return rel == wanted or (wanted.endswith("/") and rel.startswith(wanted))
