"""Check that the pyspark files on this interpreter come from one release (run by scripts/bootstrap.sh).

pyspark-client (the apache-spark provider's dependency) installs a subset of pyspark's files into the same
site-packages/pyspark/ directory; pyproject.toml pins both to one version so that overwrite is harmless.
When the pins drift apart, Python files and jars of different releases mix and Spark fails later in
obscure ways, so this fails now, in one line. Exit 0 when consistent, 1 otherwise.
"""

from __future__ import annotations

import importlib.metadata as md
import sys


def main() -> int:
    try:
        import pyspark
    except ImportError as exc:
        print(f"check_pyspark: pyspark does not import: {exc}", file=sys.stderr)
        return 1
    seen = {"pyspark.__version__": pyspark.__version__}
    for dist in ("pyspark", "pyspark-client"):
        try:
            seen[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if len(set(seen.values())) != 1:
        found = ", ".join(f"{k} {v}" for k, v in seen.items())
        print(
            f"check_pyspark: mixed pyspark releases ({found}); pin pyspark and pyspark-client to the "
            "same version in pyproject.toml and reinstall",
            file=sys.stderr,
        )
        return 1
    print(f"check_pyspark: pyspark {pyspark.__version__} ({', '.join(seen)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
