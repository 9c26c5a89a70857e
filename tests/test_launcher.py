"""``torchrl-fixes run``: its command line, the environment it builds, and its sitecustomize.

The interpreters these tests start get the environment the launcher builds; the ones
that never import torchrl start in milliseconds. Two import TorchRL, and one goes
through the real launcher to a ``spawn`` child.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchrl_fixes
from torchrl_fixes import __main__ as cli
from torchrl_fixes import launcher

REPO_ROOT = Path(__file__).resolve().parents[1]
SITE = launcher.SITECUSTOMIZE_DIR


def launched_env(*extra_path: str, torchrl_fixes: str | None = None) -> dict[str, str]:
    """What ``torchrl-fixes run`` gives a program, with this checkout importable after ``extra_path``."""
    base = dict(os.environ)
    base.pop("TORCHRL_FIXES", None)
    if torchrl_fixes is not None:
        base["TORCHRL_FIXES"] = torchrl_fixes
    base["PYTHONPATH"] = os.pathsep.join(
        [*extra_path, str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return launcher.environment(base)


def python(code: str, env: dict[str, str], cwd: str | os.PathLike = REPO_ROOT) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=str(cwd),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# -- the command line ---------------------------------------------------------------


class Exec(Exception):
    """Raised by the stand-in for os.execve: what the launcher would have become."""


@pytest.fixture
def execve(monkeypatch):
    def fake(path, argv, env):
        raise Exec(path, argv, env)

    monkeypatch.setattr(os, "execve", fake)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--", sys.executable, "-c", "pass"],
        ["run", sys.executable, "-c", "pass"],
    ],
    ids=["with --", "without --"],
)
def test_run_becomes_the_program_with_the_launcher_environment(argv, execve, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/lib")
    monkeypatch.setenv("TORCHRL_FIXES", "single_gather")
    with pytest.raises(Exec) as launched:
        cli.main(argv, prog="torchrl-fixes")
    path, program, env = launched.value.args
    assert os.path.samefile(path, sys.executable)
    assert program == [sys.executable, "-c", "pass"]
    assert env["PYTHONPATH"].split(os.pathsep) == [SITE, "/opt/lib"]
    assert env["TORCHRL_FIXES"] == "single_gather"


def test_options_after_the_command_belong_to_the_command(execve):
    with pytest.raises(Exec) as launched:
        cli.main(["run", "--", sys.executable, "-m", "pytest", "-h"], prog="torchrl-fixes")
    assert launched.value.args[1] == [sys.executable, "-m", "pytest", "-h"]


def test_the_command_is_looked_up_on_path(execve, monkeypatch, tmp_path):
    tool = tmp_path / "train-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Exec) as launched:
        cli.main(["run", "--", "train-tool", "--steps", "3"], prog="torchrl-fixes")
    assert launched.value.args[:2] == (str(tool), ["train-tool", "--steps", "3"])


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["run"], "no command given"),
        (["run", "--"], "no command given"),
        (["run", "--", "torchrl-fixes-no-such-program", "x"], "torchrl-fixes-no-such-program: command not found"),
        (["run", "--", os.path.dirname(sys.executable)], f"{os.path.dirname(sys.executable)}: command not found"),
    ],
    ids=["nothing", "nothing after --", "unknown program", "a folder"],
)
def test_a_bad_command_is_a_one_line_usage_error(argv, problem, execve, capsys):
    assert cli.main(argv, prog="torchrl-fixes") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"torchrl-fixes run: error: {problem}; usage: torchrl-fixes run -- COMMAND [ARGS ...]"
    ]


def test_run_help_shows_the_usage(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["run", "--help"], prog="torchrl-fixes")
    assert done.value.code == 0
    assert "usage: torchrl-fixes run [-h] -- COMMAND [ARGS ...]" in capsys.readouterr().out


# -- the environment ----------------------------------------------------------------


@pytest.mark.parametrize(
    "before, after",
    [
        (None, [SITE]),
        ("", [SITE]),
        ("/a", [SITE, "/a"]),
        (os.pathsep.join(["/a", "", "/b"]), [SITE, "/a", "", "/b"]),
        (os.pathsep.join(["/a", SITE, "/b"]), [SITE, "/a", "/b"]),
        (os.pathsep.join([SITE, SITE + os.sep]), [SITE]),
    ],
    ids=["unset", "empty", "one entry", "keeps the working-directory entry", "moves itself first", "once"],
)
def test_environment_puts_the_sitecustomize_folder_first_once(before, after):
    base = {"HOME": "/home/me", "TORCHRL_FIXES": "0"}
    if before is not None:
        base["PYTHONPATH"] = before
    original = dict(base)
    env = launcher.environment(base)
    assert env["PYTHONPATH"].split(os.pathsep) == after
    assert {k: v for k, v in env.items() if k != "PYTHONPATH"} == {
        "HOME": "/home/me",
        "TORCHRL_FIXES": "0",
    }
    assert base == original


def test_the_sitecustomize_folder_holds_only_sitecustomize():
    """Everything in the folder is importable by every launched interpreter: keep it to one module."""
    assert sorted(n for n in os.listdir(SITE) if n != "__pycache__") == ["sitecustomize.py"]


# -- the sitecustomize, in interpreters that do not import torchrl -------------------

REPORT = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({
        "torch": "torch" in sys.modules,
        "torchrl_fixes": "torchrl_fixes" in sys.modules,
        "hook": [type(f).__name__ for f in sys.meta_path].count("TorchRLImportHook"),
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "user": os.environ.get("USER_SITECUSTOMIZE"),
        "value": getattr(sys.modules.get("sitecustomize"), "VALUE", None),
    }))
    """
)


@pytest.fixture(scope="module")
def user_sitecustomize(tmp_path_factory):
    """Folders holding a sitecustomize of the user's: one that works, one that raises."""
    root = tmp_path_factory.mktemp("user_site")
    good, bad = root / "good", root / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\nVALUE = 42\n"
    )
    (bad / "sitecustomize.py").write_text("raise ValueError('broken user sitecustomize')\n")
    return good, bad


def report(process: subprocess.Popen) -> tuple[dict, str]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return json.loads(out.splitlines()[-1]), err


def test_an_interpreter_that_never_imports_torchrl_imports_neither_torch_nor_the_fixes():
    seen, err = report(python(REPORT, launched_env()))
    assert seen == {
        "torch": False,
        "torchrl_fixes": False,
        "hook": 1,
        "sitecustomize": os.path.join(SITE, "sitecustomize.py"),
        "user": None,
        "value": None,
    }
    assert err == ""


def test_the_users_sitecustomize_still_runs(user_sitecustomize):
    good, _ = user_sitecustomize
    seen, err = report(python(REPORT, launched_env(str(good))))
    # `import sitecustomize` gives the user's module, as it would without the launcher
    assert seen["sitecustomize"] == str(good / "sitecustomize.py")
    assert (seen["user"], seen["value"]) == ("ran", 42)
    assert seen["hook"] == 1
    assert err == ""


def test_a_broken_user_sitecustomize_is_reported_as_python_reports_it(user_sitecustomize):
    _, bad = user_sitecustomize
    seen, err = report(python(REPORT, launched_env(str(bad))))
    assert seen["hook"] == 1
    env = launched_env(str(bad))
    env["PYTHONPATH"] = env["PYTHONPATH"].split(os.pathsep, 1)[1]  # without the launcher
    _, stock_err = report(python(REPORT, env))
    assert err == stock_err
    assert "ValueError: broken user sitecustomize" in err


def test_a_failure_to_apply_the_fixes_is_a_warning_not_a_failed_start(tmp_path):
    """A torchrl_fixes that cannot be imported (here: one that raises) leaves the program running."""
    (tmp_path / "torchrl").mkdir()
    (tmp_path / "torchrl" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "torchrl_fixes").mkdir()
    (tmp_path / "torchrl_fixes" / "__init__.py").write_text("raise OSError('cannot apply')\n")
    env = launcher.environment({**os.environ, "PYTHONPATH": str(tmp_path)})
    process = python("import torchrl; print(torchrl.VALUE, torchrl.__loader__.__class__.__name__)", env, cwd=tmp_path)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert out.split() == ["1", "SourceFileLoader"]
    assert "RuntimeWarning: torchrl_fixes could not be applied in this process" in err
    assert "OSError: cannot apply" in err
    assert "Traceback" not in err


# -- interpreters that import torchrl -----------------------------------------------

# The patched method checked by identity, read before anything imports torchrl_fixes.
PATCHED = ("SliceSampler", "_get_stop_and_length")

BUILD_A_BUFFER = textwrap.dedent(
    f"""
    import json, sys

    def build_a_buffer(queue=None):
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

        method = vars({PATCHED[0]})[{PATCHED[1]!r}]
        imported = "torchrl_fixes" in sys.modules
        done = torch.zeros(100, 1, dtype=torch.bool)
        done[9::10] = True
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(100),
            sampler=SliceSampler(num_slices=2, end_key=("next", "done")),
            batch_size=8,
        )
        rb.extend(TensorDict({{"obs": torch.arange(100.0), ("next", "done"): done}}, [100]))
        rb.sample()
        import torchrl_fixes  # to read its status; it was imported already, or the check fails

        seen = {{
            "imported before": imported,
            "applied": [row.name for row in torchrl_fixes.status() if row.applied],
            "patched": method is not torchrl_fixes.get_original({PATCHED[0]}, {PATCHED[1]!r}),
            "from": torchrl_fixes.__file__,
        }}
        if queue is None:
            print(json.dumps(seen))
        else:
            queue.put(seen)
    """
)

SPAWNING_PROGRAM = BUILD_A_BUFFER + textwrap.dedent(
    """
    if __name__ == "__main__":
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=build_a_buffer, args=(queue,))
        child.start()
        seen = queue.get(timeout=300)
        child.join()
        seen["parent imported torch"] = "torch" in sys.modules
        print(json.dumps(seen))
        sys.exit(child.exitcode or 3)  # 3: the launcher passes the exit status through
    """
)


@pytest.fixture(scope="module")
def torchrl_runs(tmp_path_factory):
    """The programs below, run in parallel."""
    folder = tmp_path_factory.mktemp("launched")
    program = folder / "spawning_program.py"
    program.write_text(SPAWNING_PROGRAM)
    env = launched_env()
    base = {k: v for k, v in env.items() if k != "TORCHRL_FIXES"}
    base["PYTHONPATH"] = env["PYTHONPATH"].split(os.pathsep, 1)[1]  # the launcher adds SITE
    started = {
        "launcher, spawn": subprocess.Popen(
            [sys.executable, "-m", "torchrl_fixes", "run", "--", sys.executable, str(program)],
            cwd=str(folder),
            env=base,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        "TORCHRL_FIXES=0": python(
            BUILD_A_BUFFER + "build_a_buffer()", launched_env(torchrl_fixes="0"), cwd=folder
        ),
        "TORCHRL_FIXES=single_gather": python(
            BUILD_A_BUFFER + "build_a_buffer()",
            launched_env(torchrl_fixes="single_gather"),
            cwd=folder,
        ),
    }
    outcomes = {}
    for case, process in started.items():
        out, err = process.communicate(timeout=600)
        outcomes[case] = (process.returncode, out, err)
    return outcomes


def test_a_spawned_child_gets_the_fixes_without_importing_torchrl_fixes(torchrl_runs):
    returncode, out, err = torchrl_runs["launcher, spawn"]
    assert returncode == 3, err
    seen = json.loads(out.splitlines()[-1])
    assert seen == {
        "imported before": True,
        "applied": list(torchrl_fixes.fix_names()),
        "patched": True,
        "from": os.path.join(str(REPO_ROOT), "torchrl_fixes", "__init__.py"),
        "parent imported torch": False,
    }
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "case, applied",
    [("TORCHRL_FIXES=0", []), ("TORCHRL_FIXES=single_gather", ["single_gather"])],
)
def test_torchrl_fixes_chooses_the_fixes_in_launched_interpreters(torchrl_runs, case, applied):
    returncode, out, err = torchrl_runs[case]
    assert returncode == 0, err
    seen = json.loads(out.splitlines()[-1])
    assert seen["imported before"] is True
    assert seen["applied"] == applied
    assert seen["patched"] is False  # the method checked belongs to slice_boundary_index
