"""Start every shared server the suite's lanes use, once, before the lanes begin.

``scripts/run_tests.sh`` (the whole suite) runs ``python -m tests.support.provision`` while lint runs,
so the lanes do not each wait on the fixtures' locks while the first of them provisions a broker on
a fresh machine. It calls the very functions the fixtures call (same ``fcntl`` locks, same
skip-fast checks), so a server that is already up costs a port probe, and a single test file run
alone still starts what it needs through its fixtures.

Order: PostgreSQL first (``scripts/postgres.sh`` runs apt-get on a fresh machine without waiting for
the dpkg lock), then the brokers one after the other as ``make brokers`` does (4.3 with its TLS
listener, 4.0, 3.10); the S3 server (no package to install) alongside. Prints one line per server
with its seconds; exits 1 naming every server that failed.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


def _timed(name: str, start: Callable[[], object], failures: list[str]) -> None:
    t0 = time.monotonic()
    try:
        start()
    except Exception as exc:  # reported, and the run goes on to the next server
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        failures.append(f"{name}: {first}")
        print(f"provision: {name} failed after {time.monotonic() - t0:.1f} s: {first}", flush=True)
        return
    print(f"provision: {name} ready after {time.monotonic() - t0:.1f} s", flush=True)


def main() -> int:
    from tests.support import postgres, rabbitmq, s3

    failures: list[str] = []

    def servers_needing_packages() -> None:
        _timed("postgresql", postgres.start_server, failures)
        for version in rabbitmq.VERSIONS:
            _timed(f"rabbitmq {version}", lambda v=version: rabbitmq.ensure_broker(v), failures)

    began = time.monotonic()
    threads = [threading.Thread(target=servers_needing_packages),
               threading.Thread(target=_timed, args=("s3 (moto_server)", s3.start_server, failures))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"provision: all servers in {time.monotonic() - began:.1f} s", flush=True)
    if failures:
        print("provision: failed: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
