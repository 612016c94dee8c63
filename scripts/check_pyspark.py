"""Check that the pyspark files on this interpreter come from one release (run by scripts/bootstrap.sh).

pyspark-client (the apache-spark provider's dependency) installs a subset of pyspark's files into the same
site-packages/pyspark/ directory. pyproject.toml pins both to one version, so that overwrite writes
identical bytes. When the pins drift apart, Python files and jars of different releases mix and Spark
fails later in obscure ways; this fails now, in one line: every file both distributions record must be
on disk with the recorded hash, and ``pyspark.__version__`` must equal both versions. Exit 0 or 1.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import sys

DISTS = ("pyspark", "pyspark-client")


def _changed_files(dist: md.Distribution) -> list[str]:
    """Files of ``dist`` missing or not matching the hash in its RECORD."""
    bad = []
    for f in dist.files or []:
        if f.hash is None or f.hash.mode != "sha256":
            continue
        path = f.locate()
        try:
            digest = hashlib.sha256(path.read_bytes()).digest()
        except OSError:
            bad.append(str(f))
            continue
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != f.hash.value:
            bad.append(str(f))
    return bad


def main() -> int:
    try:
        import pyspark
    except ImportError as exc:
        print(f"check_pyspark: pyspark does not import: {exc}", file=sys.stderr)
        return 1
    versions = {"pyspark.__version__": pyspark.__version__}
    problems = []
    for name in DISTS:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        versions[name] = dist.version
        bad = _changed_files(dist)
        if bad:
            problems.append(f"{len(bad)} files of {name} {dist.version} differ from RECORD, e.g. {bad[0]}")
    if len(set(versions.values())) != 1:
        problems.insert(0, "mixed releases: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if problems:
        print(f"check_pyspark: {'; '.join(problems)}; pyspark and pyspark-client must be pinned to one "
              "version (pyproject.toml) and installed together", file=sys.stderr)
        return 1
    print(f"check_pyspark: pyspark {pyspark.__version__}, files intact ({', '.join(versions)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
