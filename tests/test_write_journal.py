"""WriteJournal against a brute-force account of every write (rows by revision)."""
from __future__ import annotations

import copy
import pickle
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from torchrl_fixes.fixes.slice_boundary_index.write_journal import _SLOTS, WriteJournal

CAPACITY = 100


def _cursor(rng: random.Random):
    """A cursor as ``TensorStorage.set`` gets it, and the rows it writes (None: unknown)."""
    kind = rng.choice(["int", "slice", "arange", "wrap", "sparse", "mask", "list", "tuple"])
    start, size = rng.randrange(CAPACITY), rng.randrange(1, 30)
    if kind == "int":
        return start, {start}
    if kind == "slice":
        return slice(start, start + size), set(range(start, min(start + size, CAPACITY)))
    if kind in ("arange", "wrap"):
        rows = torch.arange(start, start + size) % CAPACITY
        return rows, set(rows.tolist())
    if kind == "sparse":
        rows = torch.randint(CAPACITY, (size,), generator=torch.Generator().manual_seed(start))
        return rows, set(rows.tolist())
    if kind == "mask":
        mask = torch.zeros(CAPACITY, dtype=torch.bool)
        mask[start : start + size] = True
        return mask, set(range(start, min(start + size, CAPACITY)))
    if kind == "list":
        rows = [(start + 3 * i) % CAPACITY for i in range(size)]
        return rows, set(rows)
    return (torch.tensor([start]), torch.tensor([0])), None


@pytest.mark.parametrize("seed", range(20))
def test_runs_since_covers_what_was_written_or_says_it_cannot(seed):
    """Random writes, some unrecorded (the revision moves alone); from every earlier
    revision the journal gives runs that cover every row written since, or None, and
    None exactly where a revision in between is unrecorded or has unknown rows, or
    the reader is behind the oldest slot still held."""
    rng = random.Random(seed)
    journal, written, revision = WriteJournal(), {}, 0  # written: revision -> rows (None: unknown)
    recorded_runs = {}  # revision -> how many slots its record took
    for _ in range(rng.randrange(50, 900)):
        revision += 1
        if rng.random() < 0.05:
            written[revision] = "unrecorded"
            continue
        cursor, rows = _cursor(rng)
        with journal.lock:
            before = int(journal._rows[0, 0])
            journal.record(revision, cursor, CAPACITY)
            recorded_runs[revision] = int(journal._rows[0, 0]) - before
        written[revision] = rows
    first = min(recorded_runs)
    owners = [r for r in sorted(recorded_runs) for _ in range(recorded_runs[r])]  # slot -> revision
    oldest = owners[-_SLOTS] if len(owners) > _SLOTS else first - 1  # the oldest slot held
    for old, current in _queries(rng, revision):
        with journal.lock:
            runs = journal.runs_since(old, current)
        between = [written[r] for r in range(old + 1, current + 1)]
        tellable = old == current or (
            old >= first - 1
            and all(rows not in ("unrecorded", None) for rows in between)
            and old >= oldest  # the runs of every later revision are held in full
        )
        if not tellable:
            assert runs is None, (old, current)
            continue
        assert runs is not None, (old, current)
        covered = set()
        for first_row, last_row in runs:
            assert 0 <= first_row <= last_row < CAPACITY
            covered.update(range(first_row, last_row + 1))
        assert set().union(*between) <= covered


def _queries(rng: random.Random, revision: int) -> list:
    """Every ``(old, latest)`` pair, and as many ``(old, current)`` with ``current`` before the latest."""
    pairs = [(old, revision) for old in range(revision + 1)]
    for old in range(revision + 1):
        pairs.append((old, rng.randint(old, revision)))
    return pairs


def test_a_write_takes_at_most_two_runs_and_around_the_ring_two():
    journal = WriteJournal()
    with journal.lock:
        journal.record(1, torch.arange(95, 105) % CAPACITY, CAPACITY)
        journal.record(2, torch.tensor([1, 50, 99]), CAPACITY)
        journal.record(3, torch.arange(0), CAPACITY)
        assert journal.runs_since(0, 1) == [(0, 4), (95, 99)]
        assert journal.runs_since(1, 2) == [(1, 99)]  # scattered: their span
        assert journal.runs_since(2, 3) == []  # nothing written


def test_a_copy_or_a_pickle_records_on_its_own():
    """A copy gets a journal of its own: its records never reach the original."""
    journal = WriteJournal()
    with journal.lock:
        journal.record(1, 3, CAPACITY)
    for twin in (copy.deepcopy(journal), pickle.loads(pickle.dumps(journal))):
        with twin.lock:
            twin.record(2, 7, CAPACITY)
            assert twin.runs_since(1, 2) == [(7, 7)]
            assert twin.runs_since(0, 1) is None  # it knows nothing before its first record
        with journal.lock:
            assert journal.runs_since(1, 2) is None
            assert journal.runs_since(0, 1) == [(3, 3)]


def test_a_spawned_process_records_in_the_same_journal():
    context = torch.multiprocessing.get_context("spawn")
    journal = WriteJournal()
    child = context.Process(target=_record_in_child, args=(journal,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    with journal.lock:
        assert journal.runs_since(0, 2) == [(10, 19), (5, 5)]


def _record_in_child(journal) -> None:
    with journal.lock:
        journal.record(1, slice(10, 20), CAPACITY)
        journal.record(2, np.array([5]), CAPACITY)


def test_storages_hold_no_file_descriptor_each():
    """2,000 storages, each with its journal, under a limit of 256 open files: the
    journals come from multiprocessing's shared heap, not a file each."""
    code = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        import torch, torchrl_fixes
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage
        storages = []
        for _ in range(2000):
            storage = LazyTensorStorage(10)
            storage.set(torch.arange(2), TensorDict({"a": torch.zeros(2)}, [2]))
            storages.append(storage)
        assert all("_write_journal" in vars(s) for s in storages) or not torchrl_fixes.status()["slice_boundary_index"].applied
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
