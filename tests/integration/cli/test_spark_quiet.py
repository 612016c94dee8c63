"""``batch run`` on the CLI's local Spark keeps Spark's own start-up noise off the terminal (issue 33):
log4j's profile lines, NativeCodeLoader, the data sources' re-registration and the JVM's incubator
warning; ``-v`` shows them again. The noise a cold ``batch run`` keeps off is asserted on a new user's
first batch (test_first_hour.py), the noise ``-v`` shows on the cold-start notice's batch
(test_warm_spark.py): each a local JVM start the suite needs anyway. Here: the filter itself."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(900)]

NOISE = ("Using Spark's default log4j profile", "Setting default log level", "sc.setLogLevel",
         "NativeCodeLoader", "replaced a statically registered data source", "Using incubator modules")


def test_the_jvm_filter_drops_only_the_noise_line() -> None:
    """A child that writes like a JVM (the noise line, a real error, a partial line) through the filter."""
    import subprocess
    import sys

    code = ("import os,sys,time; w=sys.stderr.write;"
            "w('WARNING: Using incubator modules: jdk.incubator.vector\\n');"
            "w('Exception in thread main: boom\\n'); w('WARN'); sys.stderr.flush(); time.sleep(0.2);"
            "w('ING: a real JVM warning\\n'); w('partial')")
    runner = ("import subprocess,sys\nfrom streamledger.cli.quiet_spark import jvm_stderr_filtered\n"
              "with jvm_stderr_filtered():\n    p = subprocess.Popen([sys.executable, '-c', sys.argv[1]])\n"
              "p.wait()\nimport time; time.sleep(0.3)\n")
    done = subprocess.run([sys.executable, "-c", runner, code], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stderr == "Exception in thread main: boom\nWARNING: a real JVM warning\npartial", done.stderr
