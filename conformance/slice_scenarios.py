"""Episode streams, slice-sampling replay buffers, and the records a scenario returns.

The conformance tests of trajectory boundaries build their scenarios from these
pieces: an :class:`EpisodeStream` produces transitions the way a collector writes
them (consecutive episodes of random length, each with its ids and end flags), a
:class:`SliceSetup` says which sampler, storage and keys to build, and the
``record_*`` helpers turn what a buffer returns (or the exception it raises) into
values :func:`conformance.harness.assert_identical` can compare.
"""
from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

PRIORITIZED_SAMPLER = "PrioritizedSliceSampler"
SAMPLER_CLASSES = ("SliceSampler", "SliceSamplerWithoutReplacement", PRIORITIZED_SAMPLER)
STORAGE_KINDS = ("tensor", "memmap", "ndim2")
# Dreamer's CPU layout: a memory-mapped storage of [T, num_envs] rows.
MEMMAP_NDIM2 = "memmap_ndim2"

# How the sampler is told where trajectories end, as SliceSampler keyword arguments.
KEY_KINDS = {
    "traj_key": {"traj_key": "episode"},
    "end_key": {"end_key": ("next", "done")},
    # Nothing given: the sampler finds ("collector", "traj_ids") or ("next", "done").
    "auto": {},
    # Nothing given, over a stream whose done flags mark every episode end and
    # which carries "episode" too: the fix may read the flags for the ids.
    "unnamed": {},
    "end_keys": {"end_keys": [("next", "done"), ("next", "truncated")]},
}

# The trajectory id entry; streams for the "auto" key kind leave it out.
EPISODE_KEY = "episode"


class EpisodeStream:
    """Transitions of consecutive episodes, as a collector writes them.

    Episode lengths are drawn from a generator seeded with ``seed``, between
    ``min_episode_len`` and ``max_episode_len``. Each episode ends in one of three
    ways: terminated (``done`` and ``terminated``), truncated (``done`` and
    ``truncated``), or truncated only (``truncated`` without ``done``, as some
    datasets store it), the last one every ``truncated_only_every``-th episode on
    average.

    With ``num_envs`` set, each environment runs its own episodes and a batch has
    shape ``[num_envs, n]``, the layout collectors write and ``ndim=2`` storages
    extend along their second dimension. Episode ids are unique across
    environments. Rows are numbered in the order they are taken (``obs[..., 0]``).

    Args:
        seed (int): seeds the episode lengths and end kinds.
        num_envs (int, optional): environments side by side; ``None`` for a flat stream.
        min_episode_len (int): the shortest episode.
        max_episode_len (int): the longest episode.
        truncated_only_every (int): one episode in this many (on average) ends with
            ``truncated`` but no ``done``; 0 for never.
        with_episode_key (bool): whether batches carry the ``"episode"`` entry.
        with_is_init (bool): whether batches carry ``"is_init"`` (true at episode
            starts, as ``InitTracker`` writes it).
    """

    def __init__(
        self,
        seed: int,
        *,
        num_envs: int | None = None,
        min_episode_len: int = 1,
        max_episode_len: int = 12,
        truncated_only_every: int = 6,
        with_episode_key: bool = True,
        with_is_init: bool = True,
    ):
        self.num_envs = num_envs
        self.with_episode_key = with_episode_key
        self.with_is_init = with_is_init
        self._generator = torch.Generator().manual_seed(seed)
        self._min_episode_len = min_episode_len
        self._max_episode_len = max_episode_len
        self._truncated_only_every = truncated_only_every
        self._next_episode_id = 0
        self._rows_taken = 0
        self._pending = [[] for _ in range(num_envs or 1)]
        self._pending_rows = [0] * (num_envs or 1)

    def _draw_episode(self, env: int) -> dict[str, torch.Tensor]:
        length = int(
            torch.randint(
                self._min_episode_len, self._max_episode_len + 1, (), generator=self._generator
            )
        )
        kind = int(torch.randint(0, 100, (), generator=self._generator))
        truncated_only = bool(
            self._truncated_only_every and kind < 100 // self._truncated_only_every
        )
        truncated = truncated_only or kind % 2 == 1
        episode_id = self._next_episode_id
        self._next_episode_id += 1
        last = torch.zeros(length, 1, dtype=torch.bool)
        last[-1] = True
        return {
            "episode": torch.full((length,), episode_id, dtype=torch.int64),
            "step_count": torch.arange(length).unsqueeze(-1),
            "is_init": last.roll(1, 0),
            "done": last & (not truncated_only),
            "terminated": last & (not truncated),
            "truncated": last & truncated,
            "env": torch.full((length,), env, dtype=torch.int64),
        }

    def _fill(self, env: int, rows: int) -> None:
        while self._pending_rows[env] < rows:
            episode = self._draw_episode(env)
            self._pending[env].append(episode)
            self._pending_rows[env] += episode["episode"].shape[0]

    def _pop(self, env: int, rows: int) -> dict[str, torch.Tensor]:
        self._fill(env, rows)
        merged = {
            key: torch.cat([episode[key] for episode in self._pending[env]])
            for key in self._pending[env][0]
        }
        taken = {key: value[:rows] for key, value in merged.items()}
        rest = {key: value[rows:] for key, value in merged.items()}
        self._pending[env] = [rest] if rest["episode"].shape[0] else []
        self._pending_rows[env] -= rows
        return taken

    def next_row_ends_episode(self, offset: int = 0) -> bool:
        """Whether row ``offset`` ahead (of the first environment) is the last of its episode."""
        self._fill(0, offset + 1)
        ends = torch.cat([episode["done"] | episode["truncated"] for episode in self._pending[0]])
        return bool(ends[offset])

    def rows_to_episode_middle(self, rows: int) -> int:
        """The smallest count of rows, at least ``rows``, whose last row does not end an episode."""
        while self.next_row_ends_episode(rows - 1):
            rows += 1
        return rows

    def rows_to_episode_end(self, rows: int) -> int:
        """The smallest count of rows, at least ``rows``, whose last row ends an episode."""
        while not self.next_row_ends_episode(rows - 1):
            rows += 1
        return rows

    def take(self, rows: int) -> TensorDict:
        """The next ``rows`` transitions: shape ``[rows]``, or ``[num_envs, rows]``."""
        per_env = [self._pop(env, rows) for env in range(self.num_envs or 1)]
        fields = {key: torch.stack([env[key] for env in per_env]) for key in per_env[0]}
        batch = [self.num_envs or 1, rows]
        number = (self._rows_taken + torch.arange(rows)).expand(batch).to(torch.float32)
        self._rows_taken += rows
        obs = torch.stack([number, fields["env"].to(torch.float32)], -1)
        data = TensorDict(
            {
                "obs": obs,
                "action": (fields["step_count"].squeeze(-1) * 7 + fields["episode"]) % 5,
                "step_count": fields["step_count"],
                "is_init": fields["is_init"],
                ("collector", "traj_ids"): fields["episode"],
                ("next", "obs"): obs + 0.5,
                ("next", "done"): fields["done"],
                ("next", "terminated"): fields["terminated"],
                ("next", "truncated"): fields["truncated"],
            },
            batch,
        )
        if self.with_episode_key:
            data[EPISODE_KEY] = fields["episode"]
        if not self.with_is_init:
            del data["is_init"]
        return data if self.num_envs else data[0]


@dataclass(frozen=True)
class SliceSetup:
    """One slice-sampling replay buffer configuration.

    Attributes:
        sampler (str): the sampler class, by its name in ``torchrl.data``.
        storage (str): ``"tensor"`` (``LazyTensorStorage``), ``"memmap"``
            (``LazyMemmapStorage``), ``"ndim2"`` (``LazyTensorStorage(ndim=2)``
            filled with ``[num_envs, T]`` batches) or ``"memmap_ndim2"``
            (``LazyMemmapStorage(ndim=2)``, likewise).
        keys (str): a key of :data:`KEY_KINDS`.
        strict_length (bool): the sampler's ``strict_length``.
        options (tuple of (str, value) pairs): further sampler keyword arguments,
            ``num_slices`` or ``slice_len`` among them.
        batch_size (int): rows per sample.
        capacity (int): rows the storage holds (all environments together).
        num_envs (int): environments side by side for the ``ndim2`` storage.
        buffer (str): ``"TensorDictReplayBuffer"`` or ``"ReplayBuffer"``.
        with_is_init (bool): whether the stored data carries ``"is_init"``, which
            the sampler then ORs with its own slice-start markers (TorchRL 0.14).
        generator_seed (int, optional): when set, the buffer gets its own
            ``torch.Generator`` seeded with it.
        device (str): the device of a ``LazyTensorStorage`` (memory-mapped
            storages live on the CPU).
    """

    sampler: str = "SliceSampler"
    storage: str = "tensor"
    keys: str = "traj_key"
    strict_length: bool = True
    options: tuple[tuple[str, Any], ...] = (("num_slices", 4),)
    batch_size: int = 24
    capacity: int = 60
    num_envs: int = 3
    buffer: str = "TensorDictReplayBuffer"
    with_is_init: bool = True
    generator_seed: int | None = None
    device: str = "cpu"

    @property
    def prioritized(self) -> bool:
        return self.sampler == PRIORITIZED_SAMPLER

    @property
    def ndim(self) -> int:
        return 2 if self.storage in ("ndim2", MEMMAP_NDIM2) else 1

    def sampler_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the sampler is built with."""
        kwargs = dict(KEY_KINDS[self.keys])
        kwargs["strict_length"] = self.strict_length
        kwargs.update(self.options)
        if self.prioritized:
            kwargs.update(max_capacity=self.capacity, alpha=0.7, beta=0.5)
        return kwargs

    def missing_arguments(self) -> list[str]:
        """Sampler arguments this TorchRL release does not have, read from the signature."""
        import torchrl.data

        parameters = inspect.signature(getattr(torchrl.data, self.sampler).__init__).parameters
        return [name for name in self.sampler_kwargs() if name not in parameters]

    def stream(self, seed: int, **kwargs) -> EpisodeStream:
        """An episode stream shaped for this setup's storage."""
        if self.keys == "unnamed":
            kwargs.setdefault("truncated_only_every", 0)
        return EpisodeStream(
            seed,
            num_envs=self.num_envs if self.ndim == 2 else None,
            with_episode_key=self.keys != "auto",
            with_is_init=self.with_is_init,
            **kwargs,
        )

    def steps_for(self, rows: int) -> int:
        """The stream length (time steps) that writes ``rows`` storage rows."""
        return rows // self.num_envs if self.ndim == 2 else rows

    @property
    def single_write(self) -> int:
        """The fewest time steps a write takes: one row, or two steps of an ``ndim=2`` storage.

        A one-step batch cannot be written to an ``ndim=2`` ``TensorDictReplayBuffer``:
        stock raises while writing the index into the batch.
        """
        return 1 if self.ndim == 1 else 2

    @property
    def time_capacity(self) -> int:
        """How many time steps the storage holds along its first dimension."""
        return self.steps_for(self.capacity)

    def build_storage(self, scratch: Path | None):
        import torchrl.data

        if self.storage in ("memmap", MEMMAP_NDIM2):
            return torchrl.data.LazyMemmapStorage(
                self.capacity, scratch_dir=new_scratch_dir(scratch), ndim=self.ndim
            )
        return torchrl.data.LazyTensorStorage(self.capacity, ndim=self.ndim, device=self.device)

    def build_sampler(self):
        import torchrl.data

        return getattr(torchrl.data, self.sampler)(**self.sampler_kwargs())

    def buffer_class(self) -> type:
        import torchrl.data

        return getattr(torchrl.data, self.buffer)

    def build_buffer(self, scratch: Path | None = None, storage=None, **buffer_kwargs):
        """A replay buffer of this setup; ``storage`` reuses an existing storage."""
        if self.generator_seed is not None:
            buffer_kwargs["generator"] = torch.Generator().manual_seed(self.generator_seed)
        return self.buffer_class()(
            storage=self.build_storage(scratch) if storage is None else storage,
            sampler=self.build_sampler(),
            batch_size=self.batch_size,
            **buffer_kwargs,
        )

    def __str__(self):
        return "-".join(
            [self.sampler, self.storage, self.keys, "strict" if self.strict_length else "loose"]
            + [f"{name}={value}" for name, value in self.options]
            + ([] if self.device == "cpu" else [self.device])
        )


# TD-MPC2's defaults: batches of 256 slices of horizon + 1 = 4 steps.
TDMPC2_NUM_SLICES = 256
TDMPC2_HORIZON = 3


def tdmpc2_buffer(
    capacity: int,
    *,
    num_slices: int = TDMPC2_NUM_SLICES,
    horizon: int = TDMPC2_HORIZON,
    device: torch.device | str = "cpu",
):
    """A replay buffer built as TD-MPC2's ``Buffer`` builds it (``tdmpc2/common/buffer.py``).

    A ``ReplayBuffer`` over a ``LazyTensorStorage`` of ``capacity`` rows on
    ``device``, with a ``SliceSampler`` reading the ``"episode"`` id that TD-MPC2
    stamps on each episode's rows (no end key, no truncated key, strict lengths, no
    value cache): ``num_slices`` slices of ``horizon + 1`` steps per sample.
    """
    import torchrl.data

    sampler = torchrl.data.SliceSampler(
        num_slices=num_slices,
        end_key=None,
        traj_key="episode",
        truncated_key=None,
        strict_length=True,
        cache_values=False,
    )
    return torchrl.data.ReplayBuffer(
        storage=torchrl.data.LazyTensorStorage(capacity, device=device),
        sampler=sampler,
        pin_memory=False,
        prefetch=0,
        batch_size=num_slices * (horizon + 1),
    )


def new_scratch_dir(parent: Path | None) -> str | None:
    """A fresh directory under ``parent`` for one memory-mapped storage."""
    if parent is None:
        return None
    import tempfile

    return tempfile.mkdtemp(prefix="memmap", dir=parent)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SCRATCH = re.compile(r"\S*memmap[^\s/]*\S*")


def record_error(err: BaseException) -> tuple[str, str, str]:
    """An exception as ``("raised", type name, message)``, without addresses or scratch paths."""
    message = _SCRATCH.sub("<scratch>", _ADDRESS.sub("", str(err)))
    return ("raised", type(err).__name__, message)


def record_sample(rb, batch_size: int | None = None):
    """``("sample", data, info)`` from ``rb.sample(return_info=True)``, or the error it raised.

    The data of a ``TensorDictReplayBuffer`` sample carries the sampler's info keys
    (``index``, ``("next", "truncated")``, ...) too; ``info`` holds them as the
    sampler returned them.
    """
    try:
        data, info = rb.sample(batch_size, return_info=True)
    except Exception as err:  # stock raising is behaviour to compare too
        return record_error(err)
    return ("sample", data, info)


def record_boundaries(rb):
    """``("boundaries", start_idx, stop_idx, lengths)`` as the sampler computes them now."""
    try:
        start, stop, lengths = rb._sampler._get_stop_and_length(rb._storage)
    except Exception as err:
        return record_error(err)
    return ("boundaries", start, stop, lengths)


def record_write(write, *args, **kwargs):
    """``("write", value returned)`` for a write call, or the error it raised."""
    try:
        returned = write(*args, **kwargs)
    except Exception as err:
        return record_error(err)
    return ("write", returned if isinstance(returned, (torch.Tensor, int)) else None)


def update_priorities(rb, info) -> None:
    """Gives the sampled rows priorities that depend on their position only."""
    index = info["index"]
    flat = index[0] if len(index) == 1 else index[0] * 1000 + index[1]
    rb.update_priority(index, 1.0 + (flat % 7).to(torch.float32))


def write_rows(rb, setup: SliceSetup, data: TensorDict):
    """Writes a stream batch: ``extend``, or ``add`` for one row of a flat stream."""
    if setup.ndim == 1 and data.shape[0] == 1:
        return rb.add(data[0])
    return rb.extend(data)


def sample_step(rb, setup: SliceSetup, records: list) -> None:
    """Samples once into ``records``; the prioritized sampler then updates priorities."""
    record = record_sample(rb)
    records.append(record)
    if setup.prioritized and record[0] == "sample":
        records.append(record_write(update_priorities, rb, record[2]))


def safe_build(setup: SliceSetup, scratch: Path | None, records: list, **buffer_kwargs):
    """The buffer of ``setup``, or None with the construction error in ``records``."""
    try:
        return setup.build_buffer(scratch, **buffer_kwargs)
    except Exception as err:
        records.append(record_error(err))
        return None


class Recording:
    """A replay buffer under test, its episode stream, and the records of what it returned.

    Every call appends what the buffer returned (or the error it raised) to
    :attr:`records`, which the scenario returns for comparison.

    Args:
        setup (SliceSetup): the buffer to build.
        seed (int): seeds the episode stream.
        scratch (Path, optional): where memory-mapped storages get their directory.
        stream (EpisodeStream, optional): the transitions to write; by default the
            setup's stream seeded with ``seed``.
        **buffer_kwargs: further replay buffer arguments (``shared=True``, ...).
    """

    def __init__(
        self,
        setup: SliceSetup,
        seed: int,
        scratch: Path | None = None,
        stream: EpisodeStream | None = None,
        **buffer_kwargs,
    ):
        self.setup = setup
        self.records: list = []
        self.stream = setup.stream(seed) if stream is None else stream
        self.rb = setup.build_buffer(scratch, **buffer_kwargs)

    def write(self, rows: int, rb=None) -> None:
        """Writes the next ``rows`` time steps of the stream through the buffer."""
        data = self.stream.take(rows)
        self.records.append(record_write(write_rows, self.rb if rb is None else rb, self.setup, data))

    def sample(self, times: int = 1, rb=None) -> None:
        """Samples ``times`` times; the prioritized sampler updates priorities after each."""
        for _ in range(times):
            sample_step(self.rb if rb is None else rb, self.setup, self.records)

    def call(self, write, *args, **kwargs) -> None:
        """Calls a write method and records what it returned or raised."""
        self.records.append(record_write(write, *args, **kwargs))

    def boundaries(self, rb=None) -> None:
        """Records the trajectory boundaries the sampler computes now."""
        self.records.append(record_boundaries(self.rb if rb is None else rb))

    def fill_wrapped(self) -> None:
        """Writes past the capacity, stopping in the middle of an episode."""
        steps = self.setup.time_capacity
        total = self.stream.rows_to_episode_middle(steps + steps // 3)
        self.write(steps - 4)
        self.write(total - (steps - 4))


def extend_in_child(buffers, batches, apply_fixes: bool) -> None:
    """Runs in a child process: extends each shared buffer with its batch.

    With ``apply_fixes`` the child imports ``torchrl_fixes`` first, as a program
    using the fixes would; without it, the child runs stock TorchRL.
    """
    if apply_fixes:
        import torchrl_fixes  # noqa: F401

    for rb, data in zip(buffers, batches):
        rb.extend(data)


def write_on_request(rb, batches, requests, written) -> None:
    """Runs in a child process: extends the shared buffer with a batch at each request.

    It first reports whether the slice index fix is applied here, where nothing but
    unpickling the buffer may have imported ``torchrl_fixes``; then the buffer's
    length after each write.
    """
    fixes = sys.modules.get("torchrl_fixes")
    written.put(fixes is not None and any(row.applied for row in fixes.status() if row.name == "slice_boundary_index"))
    for data in batches:
        requests.get()
        rb.extend(data)
        written.put(len(rb))
