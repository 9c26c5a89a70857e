"""The upstream diffs apply to TorchRL 0.14.1 and carry the runtime fixes' code.

Each patch is applied with ``git apply -p1`` to a copy of the installed TorchRL's
files; every function the patch writes must then have the same source fingerprint
as the function the runtime fix installs. A change to one without the other fails.
"""
from __future__ import annotations

import ast
import inspect
import shutil
import subprocess
from pathlib import Path

import pytest

import torchrl_fixes
from torchrl_fixes.fixes import pinned_sample_output as pinned
from torchrl_fixes.source_fingerprint import fingerprint_source, source_fingerprint
from torchrl_fixes.versions import installed_version

PATCHES = Path(__file__).resolve().parent.parent / "patches"

pytestmark = pytest.mark.skipif(
    str(installed_version("torchrl")) != "0.14.1" or shutil.which("git") is None,
    reason="the patches target TorchRL 0.14.1 and are applied with git",
)


def _function_source(path: Path, name: str, cls: str | None = None) -> str:
    source = path.read_text()
    body = ast.parse(source).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node)


@pytest.fixture
def patched_torchrl(tmp_path):
    """A copy of the installed TorchRL's replay-buffer files with every patch applied."""
    import torchrl

    site = Path(torchrl.__file__).parent.parent
    tree = tmp_path / "src"
    for patch in sorted(PATCHES.glob("*.patch")):
        for line in patch.read_text().splitlines():
            if line.startswith("--- a/"):
                rel = line[len("--- a/") :]
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(site / rel, tree / rel)
    for patch in sorted(PATCHES.glob("*.patch")):
        subprocess.run(["git", "apply", "-p1", str(patch)], cwd=tree, check=True, capture_output=True)
    return tree


def test_patches_apply_in_order(patched_torchrl):
    """Every patch applies cleanly, in order, to TorchRL 0.14.1."""
    assert (patched_torchrl / "torchrl/data/replay_buffers/utils.py").is_file()


def test_pinned_sample_output_patch_matches_the_runtime_fix(patched_torchrl):
    """The functions the pinning patch writes are the runtime fix's, fingerprint for fingerprint."""
    utils = patched_torchrl / "torchrl/data/replay_buffers/utils.py"
    tensordict_rb = patched_torchrl / "torchrl/data/replay_buffers/replay_buffers/tensordict.py"
    for name in ("pin_memory_output", "_pin_memory", "_pin_memory_available", "_pin_tensor"):
        assert fingerprint_source(_function_source(utils, name)) == source_fingerprint(
            getattr(pinned, name)
        ), name
    runtime_sample = pinned._tensordict_replay_buffer_sample(object)
    assert fingerprint_source(
        _function_source(tensordict_rb, "sample", cls="TensorDictReplayBuffer")
    ) == source_fingerprint(runtime_sample)


def test_warning_differs_only_in_category(patched_torchrl):
    """The upstream warning says the same words as the runtime one, as a UserWarning."""
    upstream = _function_source(
        patched_torchrl / "torchrl/data/replay_buffers/utils.py", "_warn_pin_memory_unavailable"
    )
    runtime = inspect.getsource(pinned._warn_pin_memory_unavailable)

    def message(source):
        call = next(
            n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and n.args
            and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
        )
        return call.args[0].value

    assert message(upstream) == message(runtime)
    assert "category=UserWarning" in upstream
    assert issubclass(torchrl_fixes.PinMemoryUnavailableWarning, UserWarning)
