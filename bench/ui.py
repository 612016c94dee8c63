"""The Stream ledger page's load time on 100,000 ranges, against the same page on 1,000.

    .venv/bin/python bench/ui.py [--ranges 100000] [--peer 1000] [--repeat 5] [--screenshot docs/x.png]

One SQLite ledger holds two pipelines, ``ui-big`` (``--ranges``) and ``ui-small`` (``--peer``), each
over 3 partitions with a planted gap, failed range, lost span and stuck claim per partition
(tests/support/ledger_fill.py). One real ``airflow api-server`` serves the plugin; a token from
``/auth/token`` authenticates. Measured, median of ``--repeat``:

* the API: ``/api/pipelines`` (both), each pipeline's ``coverage`` (which runs the ledger's audit),
  a page of 200 ranges from the middle of a partition, and the response sizes;
* the page in headless Chromium (``/streamledger/?pipeline=NAME``): wall time from navigation to
  every timeline drawn, and the page's own figure (first fetch to last bar).

Prints the figures and the big/small ratios; the machine's load is printed too (figures are wall
times on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import ledger_fill  # noqa: E402
from tests.support.airflow import airflow_components, make_airflow_home, ui_plugin_env  # noqa: E402
from tests.support.browser import headless_chromium  # noqa: E402

PIPELINES = ("ui-small", "ui-big")


def fetch(url: str, token: str) -> tuple[float, int, object]:
    began = time.perf_counter()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=300) as response:
        raw = response.read()
    return time.perf_counter() - began, len(raw), json.loads(raw)


def median_fetch(url: str, token: str, repeat: int) -> tuple[float, int, object]:
    runs = [fetch(url, token) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), runs[-1][1], runs[-1][2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranges", type=int, default=100_000)
    parser.add_argument("--peer", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--screenshot", type=Path, help="save a PNG of the big pipeline's page here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sl-bench-ui-"))
    ledger_url = f"sqlite:///{work / 'ledger.sqlite'}"
    began = time.perf_counter()
    filled = {}
    for name, total in zip(PIPELINES, (args.peer, args.ranges), strict=True):
        filled[name] = ledger_fill.fill(ledger_url, pipeline=name, partitions=3, per_partition=-(-total // 3))
    print(f"ledger: {sum(f.ranges for f in filled.values()):,} ranges loaded in "
          f"{time.perf_counter() - began:.1f} s ({ledger_url})")

    af = make_airflow_home(work / "airflow")
    env = {"STREAMLEDGER_LEDGER_URL": ledger_url, **ui_plugin_env()}
    with airflow_components(af, components=("api-server",), env=env) as api:
        with urllib.request.urlopen(f"{api}/auth/token", timeout=60) as response:  # all admins: no password
            token = str(json.loads(response.read())["access_token"])
        base = f"{api}/streamledger"
        fetch(f"{base}/api/pipelines", token)  # warm the engine and the plugin's imports
        t_list, size_list, listing = median_fetch(f"{base}/api/pipelines", token, args.repeat)
        print(f"load {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cores; median of {args.repeat}")
        print(f"GET api/pipelines (both pipelines)   {t_list * 1000:8.1f} ms  {size_list:>9,} B")
        figures: dict[str, dict[str, float]] = {}
        sources = {p["name"]: p["sources"] for p in listing["pipelines"]}  # type: ignore[index]
        for name in PIPELINES:
            f = figures[name] = {}
            f["coverage"], size, cov = median_fetch(f"{base}/api/pipelines/{quote(name)}/coverage", token,
                                                    args.repeat)
            spans = sum(len(s["spans"]) for s in cov["sources"])  # type: ignore[index]
            mid = sources[name][0]
            low = (mid["tail"] or 0) // 2
            f["ranges"], rsize, _ = median_fetch(
                f"{base}/api/sources/{mid['id']}/ranges?low={low}&high={low + 1_000_000}&limit=200", token,
                args.repeat)
            print(f"{name:>8}: {filled[name].ranges:>7,} ranges -> {spans} spans; coverage "
                  f"{f['coverage'] * 1000:7.1f} ms ({size:,} B); a page of 200 ranges "
                  f"{f['ranges'] * 1000:6.1f} ms "
                  f"({rsize:,} B)")

        with headless_chromium() as browser:
            browser.get(f"{api}/api/v2/monitor/health")
            browser.add_cookie("_token", token)
            for name in PIPELINES:
                walls, own = [], []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    browser.get(f"{base}/?pipeline={quote(name)}")
                    browser.wait_for("body[data-loaded-ms]", timeout=300)
                    walls.append(time.perf_counter() - t0)
                    own.append(float(browser.script("return document.body.dataset.loadedMs;")) / 1000)
                figures[name]["page"] = statistics.median(walls)
                figures[name]["page_js"] = statistics.median(own)
                print(f"{name:>8}: page in Chromium {figures[name]['page'] * 1000:7.1f} ms to every timeline "
                      f"drawn (its own fetch-to-draw {figures[name]['page_js'] * 1000:6.1f} ms)")
            if args.screenshot:
                browser.get(f"{base}/?pipeline=ui-big")
                browser.wait_for("body[data-loaded-ms]", timeout=300)
                gap = filled["ui-big"].planted[0].gap
                row = 'tr.source-row[data-stream="events-0"]'
                (seg,) = browser.find_all(f'{row} .seg.gap[data-start="{gap[0]}"]')
                browser.click(seg)
                browser.wait_for("#ranges tr.range", count=2)
                browser.screenshot(args.screenshot)
                print(f"screenshot: {args.screenshot}")
    small, big = figures["ui-small"], figures["ui-big"]
    ratio = args.ranges / args.peer
    print(f"ratios {args.ranges:,} / {args.peer:,} ranges ({ratio:.0f}x the rows): coverage "
          f"{big['coverage'] / small['coverage']:.1f}x, page {big['page'] / small['page']:.1f}x, "
          f"range page {big['ranges'] / small['ranges']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
