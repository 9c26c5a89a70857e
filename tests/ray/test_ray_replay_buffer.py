"""The fixes in a RayReplayBuffer's actor on a local Ray cluster, both ways a user can ask.

Collected only by ``nox -s ray`` (it needs ``ray``, starts a Ray cluster on this
machine, and takes about a minute): ``nox -s tests`` leaves this folder out.

Each way runs ``ray_driver.py`` in a process of its own, which starts Ray with two CPUs
on 127.0.0.1, builds a patched and a stock (``TORCHRL_FIXES=0``) actor over the same
6M stored transitions, and shuts Ray down. The actors report what is applied in them;
the speed check is one comparison of the two in the same run: the median of 15 slice
samples, each right after a write, timed in turn.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

import torchrl_fixes  # noqa: E402  (here, the test's process only: names the fixes)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DRIVER = HERE / "ray_driver.py"
MIN_SPEEDUP = 3.0
# Stock's sample after a write scales with what is stored, the patched one does not;
# at 2M stored the two are ~3x apart on a loaded 2-core machine, at 6M ~6x.
STORED = 6_000_000


def drive(way: str) -> dict:
    env = dict(os.environ)
    env.pop("TORCHRL_FIXES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, str(DRIVER), way, "--stored", str(STORED)]
    if way == "launcher":
        command = [sys.executable, "-m", "torchrl_fixes", "run", "--", *command]
    run = subprocess.run(command, cwd=str(HERE), env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    report = json.loads(run.stdout.splitlines()[-1])
    print(f"{way}: stored {report['stored']}, sample after a write, median ms {report['median ms']}")
    print(f"{way}: ms patched {report['ms']['patched']}")
    print(f"{way}: ms stock   {report['ms']['stock']}")
    return report


@pytest.fixture(scope="module", params=["hook", "launcher"])
def report(request):
    return drive(request.param)


def test_ray_runs_on_loopback_only(report):
    assert report["node"] == "127.0.0.1"


def test_the_actor_reports_the_fixes_applied(report):
    patched, stock = report["actors"]["patched"], report["actors"]["stock"]
    assert patched["imported"] and patched["sampler patched"]
    assert patched["applied"] == list(torchrl_fixes.fix_names())
    assert stock["TORCHRL_FIXES"] == "0"
    assert stock["applied"] == [] and not stock["sampler patched"]
    assert patched["pid"] != stock["pid"]
    assert report["stored"] == {"patched": STORED, "stock": STORED}


def test_each_way_reaches_the_actor_by_its_own_path(report):
    """The hook: the driver never imports torchrl_fixes. The launcher: its sitecustomize runs in the actor."""
    sitecustomize = os.path.join(torchrl_fixes.launcher.SITECUSTOMIZE_DIR, "sitecustomize.py")
    for actor in report["actors"].values():
        if report["way"] == "hook":
            assert actor["sitecustomize"] != sitecustomize
        else:
            assert actor["sitecustomize"] == sitecustomize
    assert report["driver imported torchrl_fixes"] is (report["way"] == "launcher")


def test_a_sample_after_a_write_is_at_least_3x_faster(report):
    median = report["median ms"]
    speedup = median["stock"] / median["patched"]
    print(f"{report['way']}: stock / patched = {speedup:.1f}x")
    assert speedup >= MIN_SPEEDUP, median
