"""The fixes in every Python process of a program: ``torchrl-fixes run`` and Ray's setup hook.

``torchrl-fixes run -- python train.py`` starts ``python train.py`` with this
package's ``sitecustomize`` folder first on ``PYTHONPATH``. Every Python interpreter
started from there on inherits the variable and runs that ``sitecustomize`` as it
starts: the program itself, its ``spawn`` and ``forkserver`` workers, TorchRL's
collector workers, and the workers of a Ray cluster the program starts on this
machine. Each of them applies the fixes when it imports ``torchrl``, as
``import torchrl_fixes`` would; ``TORCHRL_FIXES`` chooses which, as it does for the
import.

For a Ray cluster started elsewhere, Ray's own mechanism applies: pass
:func:`ray_worker_setup` as the job's ``worker_process_setup_hook``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Mapping, Sequence

from torchrl_fixes.activation import activate_from_environment

# The folder that holds the sitecustomize.py every launched interpreter runs.
SITECUSTOMIZE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


class CommandNotFound(Exception):
    """The command given to ``torchrl-fixes run`` is not an executable on ``PATH``."""


def environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``torchrl-fixes run`` gives the program it starts.

    ``base`` (``os.environ`` by default) with :data:`SITECUSTOMIZE_DIR` first on
    ``PYTHONPATH``; the entries already there follow, in their order, less any earlier
    copy of that folder (so a launcher started under the launcher adds nothing).
    ``TORCHRL_FIXES`` and everything else pass through unchanged.

    Args:
        base (mapping of str to str, optional): the environment to start from.

    Examples:
        >>> env = environment({"PYTHONPATH": "/opt/lib", "TORCHRL_FIXES": "0"})
        >>> env["PYTHONPATH"].split(os.pathsep) == [SITECUSTOMIZE_DIR, "/opt/lib"]
        True
        >>> env["TORCHRL_FIXES"]
        '0'
        >>> environment(env)["PYTHONPATH"] == env["PYTHONPATH"]
        True
    """
    env = dict(os.environ if base is None else base)
    current = env.get("PYTHONPATH", "")
    # An empty PYTHONPATH has no entries; "" inside a longer one is the working directory.
    entries = current.split(os.pathsep) if current else []
    entries = [e for e in entries if os.path.abspath(e or os.curdir) != SITECUSTOMIZE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITECUSTOMIZE_DIR, *entries])
    return env


def resolve(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The executable ``command[0]`` names, looked up on ``env``'s ``PATH`` like a shell does.

    Raises:
        CommandNotFound: there is no such executable.
    """
    if not command or not command[0]:
        raise CommandNotFound("no command given")  # `run` or `run --` alone
    found = shutil.which(command[0], path=env.get("PATH", os.defpath))
    if found is None:
        raise CommandNotFound(f"{command[0]}: command not found")
    return found


def run(command: Sequence[str], base: Mapping[str, str] | None = None) -> int:
    """Runs ``command`` with the fixes in every Python process it starts.

    On POSIX the launcher becomes the program (``os.execve``), as
    ``opentelemetry-instrument`` does: signals from a terminal or a job scheduler reach
    the program itself, its exit status is the launcher's, and no launcher process stays
    behind holding torch in memory. Elsewhere (Windows, where ``exec`` starts a new
    process and returns at once) it runs the program as a child and returns its exit
    status.

    Args:
        command (sequence of str): the program and its arguments.
        base (mapping of str to str, optional): the environment to start from
            (``os.environ`` by default); see :func:`environment`.

    Raises:
        CommandNotFound: ``command`` is empty or names no executable.
    """
    env = environment(base)
    executable = resolve(command, env)
    if os.name != "posix":
        return subprocess.call([executable, *command[1:]], env=env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, list(command), env)
    except OSError as err:  # not executable after all (a folder, no permission)
        raise CommandNotFound(f"{command[0]}: {err.strerror}") from err
    raise AssertionError("unreachable: execve returned")  # pragma: no cover


def ray_worker_setup() -> list[str]:
    """Applies the fixes in a Ray worker: Ray's ``worker_process_setup_hook``.

    Ray runs the hook in every worker process of the job before the worker builds an
    actor or runs a task, so a :class:`~torchrl.data.RayReplayBuffer`'s actor, a Ray
    collector or any remote function uses the fixed TorchRL. Give it by name (Ray
    imports it in the worker) or as the function; ``TORCHRL_FIXES`` in the worker's
    environment chooses the fixes, as for ``import torchrl_fixes``.

    Applying a fix twice does nothing, so the hook can run in a worker that has already
    imported ``torchrl_fixes``.

    Returns:
        the names of the fixes applied in this process.

    Examples:
        >>> import ray  # doctest: +SKIP
        >>> ray.init(runtime_env={"worker_process_setup_hook": "torchrl_fixes.ray_worker_setup"})  # doctest: +SKIP
        >>> import torchrl_fixes
        >>> sorted(torchrl_fixes.ray_worker_setup()) == sorted(
        ...     row.name for row in torchrl_fixes.status() if row.applied
        ... )
        True
    """
    return activate_from_environment()
