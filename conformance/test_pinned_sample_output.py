"""Conformance of the ``pinned_sample_output`` fix.

Where stock TorchRL is right (the values it returns), patched output must be
identical. Where it is wrong (what it pins, raising with no accelerator), the
patched behaviour is asserted, and tests marked ``stock_bug`` show the bug on stock.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import itertools
import linecache
import pickle
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest
import torch
from tensordict import TensorDict

from conformance import reference
from conformance.fake_pinning import forget_pin_memory_answer, install_fake_pinning
from conformance.harness import assert_identical, run_patched, run_stock, tensor_leaves
from conformance.pinned_sample_transforms import KeepObservation, ScaleObservation

_NOT_IN_EFFECT = reference.why_not_in_effect("pinned_sample_output")
pytestmark = pytest.mark.skipif(
    _NOT_IN_EFFECT is not None,
    reason=f"pinned_sample_output does not act here ({_NOT_IN_EFFECT})",
)
PinMemoryUnavailableWarning = reference.pin_memory_warning()

N = 48
_memmap_dirs = itertools.count()


def _transitions(shape=(N,)):
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[..., 5::6, :] = True
    return TensorDict(
        {
            "obs": torch.randn(*shape, 3),
            "action": torch.randint(4, (*shape,)),
            ("next", "obs"): torch.randn(*shape, 3),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        },
        list(shape),
    )


@dataclass(frozen=True)
class Buffer:
    """How to build one replay buffer configuration, given ``pin_memory`` and ``prefetch``."""

    name: str
    build: Callable
    prioritized: bool = False
    generations: bool = False

    def __str__(self):
        return self.name


def _stock_sample():
    from torchrl.data import TensorDictReplayBuffer

    return reference.stock_attribute(TensorDictReplayBuffer, "sample")


def _sample_waits() -> bool:
    """Whether the installed TorchRL's ``sample`` can wait for data (TorchRL main)."""
    return "wait" in inspect.signature(_stock_sample()).parameters


def _writer_tracks_generations() -> bool:
    """Whether the installed TorchRL's writers can stamp generations (TorchRL main)."""
    from torchrl.data import RoundRobinWriter

    return "track_generations" in inspect.signature(RoundRobinWriter.__init__).parameters


def _generation_writer():
    from torchrl.data import TensorDictRoundRobinWriter

    return TensorDictRoundRobinWriter(track_generations=True)


def _td_buffer(storage="lazy", transform=None, sampler=None, ndim=1, writer=None):
    def build(pin_memory, prefetch, tmp_path):
        from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer

        if storage == "memmap":
            store = LazyMemmapStorage(N, scratch_dir=tmp_path / f"memmap{next(_memmap_dirs)}")
        else:
            store = LazyTensorStorage(N, ndim=ndim)
        rb = TensorDictReplayBuffer(
            storage=store,
            sampler=sampler() if sampler else None,
            writer=writer() if writer else None,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform() if transform else None,
            batch_size=12,
        )
        rb.extend(_transitions((4, N // 4) if ndim == 2 else (N,)))
        return rb

    return build


def _slice_sampler():
    from torchrl.data import SliceSampler

    return SliceSampler(num_slices=3, end_key=("next", "done"))


def _tensor_buffer(pin_memory, prefetch, tmp_path):
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(
        storage=LazyTensorStorage(N), pin_memory=pin_memory, prefetch=prefetch, batch_size=12
    )
    rb.extend(torch.randn(N, 5))
    return rb


def _tuple_buffer(pin_memory, prefetch, tmp_path):
    from torchrl.data import ListStorage, ReplayBuffer

    rb = ReplayBuffer(
        storage=ListStorage(N), pin_memory=pin_memory, prefetch=prefetch, batch_size=12
    )
    rb.extend([(torch.randn(3), torch.randn(1)) for _ in range(N)])
    return rb


def _prioritized_buffer(class_name):
    def build(pin_memory, prefetch, tmp_path):
        import torchrl.data

        rb = getattr(torchrl.data, class_name)(
            alpha=0.7,
            beta=0.5,
            storage=torchrl.data.LazyTensorStorage(N),
            pin_memory=pin_memory,
            prefetch=prefetch,
            batch_size=12,
        )
        rb.extend(_transitions())
        return rb

    return build


BUFFERS = [
    Buffer("TensorDictReplayBuffer", _td_buffer()),
    Buffer("TensorDictReplayBuffer+memmap", _td_buffer(storage="memmap")),
    Buffer("TensorDictReplayBuffer+ndim2", _td_buffer(ndim=2)),
    Buffer("TensorDictReplayBuffer+new-td-transform", _td_buffer(transform=KeepObservation)),
    Buffer("TensorDictReplayBuffer+inplace-transform", _td_buffer(transform=ScaleObservation)),
    Buffer("TensorDictReplayBuffer+SliceSampler", _td_buffer(sampler=_slice_sampler)),
    Buffer(
        "TensorDictReplayBuffer+SliceSampler+new-td-transform",
        _td_buffer(sampler=_slice_sampler, transform=KeepObservation),
    ),
    Buffer("ReplayBuffer+tensor", _tensor_buffer),
    Buffer("ReplayBuffer+tuple", _tuple_buffer),
    Buffer(
        "TensorDictPrioritizedReplayBuffer",
        _prioritized_buffer("TensorDictPrioritizedReplayBuffer"),
        prioritized=True,
    ),
    Buffer(
        "PrioritizedReplayBuffer", _prioritized_buffer("PrioritizedReplayBuffer"), prioritized=True
    ),
    # The writer stamps generations: samples carry an "index_generation" info entry.
    Buffer(
        "TensorDictReplayBuffer+generations",
        _td_buffer(writer=_generation_writer),
        generations=True,
    ),
    Buffer(
        "TensorDictReplayBuffer+ndim2+generations",
        _td_buffer(ndim=2, writer=_generation_writer),
        generations=True,
    ),
    Buffer(
        "TensorDictReplayBuffer+SliceSampler+generations",
        _td_buffer(sampler=_slice_sampler, writer=_generation_writer),
        generations=True,
    ),
]

ACCESSES = {
    "sample": lambda rb: [rb.sample() for _ in range(3)],
    "sample-info": lambda rb: [rb.sample(return_info=True) for _ in range(3)],
    "getitem": lambda rb: [rb[torch.tensor([0, 3, 2])], rb[1:3]],
    # The buffers hold enough data: these go through the readiness check and sample at once.
    "sample-wait": lambda rb: [rb.sample(wait=True, timeout=60.0) for _ in range(3)],
    "sample-wait-info": lambda rb: [
        rb.sample(12, True, wait=True, timeout=60.0, cancel_event=threading.Event())
        for _ in range(3)
    ],
}
WAITING_ACCESSES = {"sample-wait", "sample-wait-info"}


@pytest.fixture
def waiting_sample():
    """Skips where stock ``sample`` cannot wait for data."""
    if not _sample_waits():
        pytest.skip(
            "needs TorchRL main (torchrl-nightly): this TorchRL's sample() takes no "
            "wait/timeout/cancel_event"
        )


@pytest.fixture
def generations():
    """Skips where stock writers cannot stamp generations."""
    if not _writer_tracks_generations():
        pytest.skip("this TorchRL's writers do not track generations (no index_generation)")


@pytest.fixture(params=BUFFERS, ids=str)
def buffer(request):
    if request.param.prioritized:
        request.getfixturevalue("torchrl_extension")
    if request.param.generations:
        request.getfixturevalue("generations")
    return request.param


@pytest.fixture(params=list(ACCESSES))
def access(request):
    if request.param in WAITING_ACCESSES:
        request.getfixturevalue("waiting_sample")
    return ACCESSES[request.param]


@pytest.fixture(params=[0, 1], ids=["no-prefetch", "prefetch"])
def prefetch(request):
    # One prefetch worker keeps the order of samples, hence of generator draws, fixed.
    return request.param


def _drained(rb, output):
    # Queued prefetch samples draw from the global generator: let them finish before the
    # next run reseeds it, or they would race with it.
    for future in list(getattr(rb, "_prefetch_queue", ())):
        future.result()
    return output


def _scenario(buffer, access, pin_memory, prefetch, tmp_path):
    def scenario():
        rb = buffer.build(pin_memory, prefetch, tmp_path)
        return _drained(rb, access(rb))

    return scenario


def test_unpinned_values_match_stock_without_accelerator(
    no_accelerator, buffer, access, prefetch, tmp_path
):
    """No accelerator: pin_memory=True returns exactly what stock returns unpinned, and warns once."""
    stock = run_stock(_scenario(buffer, access, False, prefetch, tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patched = run_patched(_scenario(buffer, access, True, prefetch, tmp_path))
    assert_identical(stock, patched)
    pin_warnings = [w for w in caught if issubclass(w.category, PinMemoryUnavailableWarning)]
    assert len(pin_warnings) == 1, [str(w.message) for w in pin_warnings]


def test_every_returned_tensor_is_pinned(fake_accelerator, buffer, access, prefetch, tmp_path):
    """With an accelerator, every tensor sample()/rb[idx] return went through pinning; values as stock."""
    stock = run_stock(_scenario(buffer, access, False, prefetch, tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PinMemoryUnavailableWarning)
        patched = run_patched(_scenario(buffer, access, True, prefetch, tmp_path))
    assert_identical(stock, patched)
    leaves = tensor_leaves(patched)
    assert leaves
    unpinned = [path for path, leaf in leaves if not leaf.is_pinned()]
    assert not unpinned, f"not pinned: {unpinned}"


def test_stock_pinned_values_match_patched(fake_accelerator, buffer, access, tmp_path):
    """Where stock pins, the values it returns are the patched values."""
    stock = run_stock(_scenario(buffer, access, True, 0, tmp_path))
    patched = run_patched(_scenario(buffer, access, True, 0, tmp_path))
    assert_identical(stock, patched)


def test_prefetch_pins_in_the_worker(fake_accelerator, tmp_path):
    """With prefetch, the sample's data is pinned by the prefetch worker, not the caller's thread."""
    rb = _td_buffer(transform=KeepObservation)(True, 1, tmp_path)
    rb.sample()  # the first sample runs in the caller's thread and queues the next one
    data = _drained(rb, rb.sample())
    main = threading.current_thread().name
    assert fake_accelerator.thread_of(data["obs"]) != main
    assert data["index"].is_pinned()


def test_generator_state_after_sampling_is_stock(fake_accelerator, buffer, access, prefetch, tmp_path):
    """Pinning draws nothing: after the same samples the generator is where stock leaves it."""

    def rng_after(pin_memory):
        def scenario():
            _scenario(buffer, access, pin_memory, prefetch, tmp_path)()
            return torch.get_rng_state()

        return scenario

    assert torch.equal(run_stock(rng_after(False)), run_patched(rng_after(True)))


def test_sample_takes_the_stock_arguments():
    """The patched TensorDictReplayBuffer.sample has the installed stock's parameters."""
    from torchrl.data import TensorDictReplayBuffer

    def parameters(func):
        return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]

    assert parameters(TensorDictReplayBuffer.sample) == parameters(_stock_sample())


def _empty_td_buffer(pin_memory):
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    return TensorDictReplayBuffer(storage=LazyTensorStorage(N), pin_memory=pin_memory, batch_size=12)


def test_waiting_sample_waits_for_data(fake_accelerator, waiting_sample):
    """sample(wait=True) on an empty buffer returns once another thread writes, as stock does."""
    data = _transitions()

    def scenario(pin_memory):
        def run():
            rb = _empty_td_buffer(pin_memory)
            writer = threading.Timer(0.05, rb.extend, (data,))
            writer.start()
            try:
                sample = rb.sample(wait=True, timeout=60.0)
            finally:
                writer.join()
            return sample, torch.get_rng_state()

        return run

    stock = run_stock(scenario(False))
    patched = run_patched(scenario(True))
    assert_identical(stock, patched)
    assert all(leaf.is_pinned() for _, leaf in tensor_leaves(patched[0]))


def test_waiting_sample_times_out_and_cancels_as_stock(waiting_sample):
    """timeout and cancel_event reach the readiness check: the same errors as stock."""
    cancelled = threading.Event()
    cancelled.set()
    calls = [
        (lambda rb: rb.sample(wait=True, timeout=0.01), TimeoutError, "within 0.01 seconds"),
        (lambda rb: rb.sample(wait=True, cancel_event=cancelled), RuntimeError, "cancelled"),
        (lambda rb: rb.sample(wait=True, timeout=-1.0), ValueError, "non-negative"),
    ]
    for call, error, message in calls:
        for run, pin_memory in ((run_stock, False), (run_patched, True)):
            with pytest.raises(error, match=message):
                run(lambda call=call, pin_memory=pin_memory: call(_empty_td_buffer(pin_memory)))


def test_index_generation_is_pinned(fake_accelerator, generations, prefetch, tmp_path):
    """The index_generation entry, in the info and written into the sample, is pinned."""
    build = _td_buffer(sampler=_slice_sampler, writer=_generation_writer)

    def scenario(pin_memory):
        def run():
            rb = build(pin_memory, prefetch, tmp_path)
            return _drained(rb, rb.sample(return_info=True))

        return run

    stock = run_stock(scenario(False))
    sample, info = run_patched(scenario(True))
    assert_identical(stock, (sample, info))
    assert "index_generation" in sample.keys() and "index_generation" in info
    assert sample["index_generation"].is_pinned()
    assert info["index_generation"].is_pinned()


def test_leaves_on_an_accelerator_are_left_alone(fake_accelerator):
    """Tensors not on the CPU are returned as they are, not pinned (meta stands in for a GPU)."""
    _pin_memory = reference.pin_memory_function()

    on_device = torch.empty(3, device="meta")
    td = TensorDict({"cpu": torch.zeros(3), "dev": on_device}, [3])
    out = _pin_memory(td)
    assert out["dev"] is on_device
    assert out["cpu"].is_pinned()
    assert _pin_memory(TensorDict({"a": on_device}, [3], device="meta"))["a"] is on_device


@dataclass(frozen=True)
class Warned:
    """One warning, as :func:`pin_warnings` recorded it."""

    filename: str
    lineno: int
    thread: str

    @property
    def line(self) -> str:
        return linecache.getline(self.filename, self.lineno)


@contextlib.contextmanager
def pin_warnings() -> Iterator[list[Warned]]:
    """Records each PinMemoryUnavailableWarning given in its block, with its thread."""
    caught: list[Warned] = []

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PinMemoryUnavailableWarning):
            caught.append(Warned(filename, lineno, threading.current_thread().name))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = showwarning
        yield caught


def _pinning_module():
    """The module of the pinning functions: the fix's, or TorchRL's patched utils."""
    return importlib.import_module(reference.pin_memory_function().__module__)


def _assert_names_the_pinning_line(warned: Warned) -> None:
    """The warning names ``pin_memory_output``'s line that skips the pinning."""
    decorator = _pinning_module().pin_memory_output
    lines, first = inspect.getsourcelines(decorator)
    assert warned.filename == inspect.getsourcefile(decorator), warned
    assert first <= warned.lineno < first + len(lines), warned
    assert "_pins_memory(self)" in warned.line, warned


def test_warns_once_per_buffer(no_accelerator, tmp_path):
    """Each buffer warns at its first sample only; a second buffer warns again.

    The warning is given in the caller's thread and names the line of
    ``pin_memory_output`` that skips the pinning.
    """
    build = _td_buffer()
    with pin_warnings() as caught:
        for _ in range(2):
            rb = build(True, 0, tmp_path)
            for _ in range(3):
                rb.sample()
            rb[0:2]
    assert len(caught) == 2
    for warned in caught:
        assert warned.thread == threading.current_thread().name
        _assert_names_the_pinning_line(warned)


def test_getitem_warns_at_the_same_line(no_accelerator, tmp_path):
    """rb[index] as a buffer's first pinned access warns once, naming the same line."""
    rb = _td_buffer(transform=KeepObservation)(True, 0, tmp_path)
    with pin_warnings() as caught:
        rb[torch.tensor([0, 3])]
        rb[1:3]
        rb.sample()
    assert len(caught) == 1
    (warned,) = caught
    assert warned.thread == threading.current_thread().name
    _assert_names_the_pinning_line(warned)


@pytest.mark.parametrize("prefetch_workers", [1, 3])
def test_warns_once_with_prefetch(no_accelerator, prefetch_workers, tmp_path):
    """With prefetch workers, a buffer warns once, naming the same line in any thread.

    From TorchRL 0.13 on a buffer's first sample runs in the caller's thread; before,
    it runs in the workers, several at once, which neither crash nor warn twice.
    """
    for _ in range(3):
        rb = _td_buffer()(True, prefetch_workers, tmp_path)
        with pin_warnings() as caught:
            samples = _drained(rb, [rb.sample() for _ in range(6)])
        assert len(caught) == 1, caught
        _assert_names_the_pinning_line(caught[0])
        assert not any(leaf.is_pinned() for _, leaf in tensor_leaves(samples))


def _counted_availability(monkeypatch, available: bool) -> list[str]:
    """``torch.accelerator.is_available`` answers ``available``, asked afresh; each call's
    thread is listed."""
    calls = []

    def is_available():
        calls.append(threading.current_thread().name)
        return available

    monkeypatch.setattr(torch.accelerator, "is_available", is_available)
    _pinning_module()._pin_memory_available.cache_clear()
    monkeypatch.setattr(_pinning_module()._pin_memory_available, "cache_clear", lambda: None)
    return calls


@pytest.fixture(autouse=True)
def _ask_afresh():
    """Each test asks whether an accelerator exists anew (the answer is kept per process)."""
    forget_pin_memory_answer()
    yield
    forget_pin_memory_answer()


@pytest.mark.parametrize("available", [False, True], ids=["no-accelerator", "accelerator"])
def test_accelerator_is_asked_once(monkeypatch, available, buffer, access, prefetch, tmp_path):
    """Whether an accelerator exists is asked once per process, not at every sample."""
    if available:
        install_fake_pinning(monkeypatch)
    calls = _counted_availability(monkeypatch, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PinMemoryUnavailableWarning)
        _scenario(buffer, access, False, prefetch, tmp_path)()
    unpinned = len(calls)  # TorchRL may ask for its own reasons
    calls = _counted_availability(monkeypatch, available)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PinMemoryUnavailableWarning)
        for _ in range(2):
            _scenario(buffer, access, True, prefetch, tmp_path)()
    assert len(calls) - 2 * unpinned == 1


def test_concurrent_first_samples_neither_raise_nor_pin(monkeypatch, tmp_path):
    """Threads that sample a buffer's first samples at once, with no accelerator: none
    raises, none pins, and each warning names the pinning line."""
    rb = _td_buffer()(True, 0, tmp_path)
    barrier = threading.Barrier(8)
    _counted_availability(monkeypatch, False)
    samples, errors = [], []

    def first_sample():
        try:
            barrier.wait()
            samples.append(rb.sample())
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    with pin_warnings() as caught:
        threads = [threading.Thread(target=first_sample) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors and len(samples) == 8
    assert not any(leaf.is_pinned() for sample in samples for _, leaf in tensor_leaves(sample))
    assert caught
    for warned in caught:
        _assert_names_the_pinning_line(warned)


COPIERS = {
    "pickle": lambda rb: pickle.loads(pickle.dumps(rb)),
    "deepcopy": copy.deepcopy,
}


@pytest.mark.parametrize("copier", list(COPIERS))
def test_copying_a_buffer_leaves_it_as_it_was(monkeypatch, copier, tmp_path):
    """Copying a buffer that sampled changes nothing of the original; the copy pins as
    the original does."""
    copier = COPIERS[copier]
    reference.skip_where_stock_cannot_copy(copier)
    install_fake_pinning(monkeypatch)
    _counted_availability(monkeypatch, True)
    rb = _td_buffer()(True, 0, tmp_path)
    rb.sample()
    before = dict(vars(rb))
    copied = copier(rb)
    assert vars(rb).keys() == before.keys()
    assert all(vars(rb)[key] is value for key, value in before.items())
    for sample in (copied.sample(), rb.sample()):
        assert all(leaf.is_pinned() for _, leaf in tensor_leaves(sample))


@pytest.mark.stock_bug
def test_stock_raises_without_accelerator(no_accelerator, tmp_path):
    """Stock: pin_memory=True raises at the first sample on a machine with no accelerator."""
    # CPU builds of torch say no accelerator is available; CUDA builds, that no driver is.
    with pytest.raises(RuntimeError, match="accelerator|driver"):
        run_stock(lambda: _td_buffer()(True, 0, tmp_path).sample())


@pytest.mark.stock_bug
def test_stock_leaves_transform_output_unpinned(fake_accelerator, tmp_path):
    """Stock: a transform that builds a new TensorDict (device=None) gets no pinning at all."""
    sample = run_stock(lambda: _td_buffer(transform=KeepObservation)(True, 0, tmp_path).sample())
    assert sample.device is None
    assert not any(leaf.is_pinned() for _, leaf in tensor_leaves(sample))


@pytest.mark.stock_bug
def test_stock_leaves_info_unpinned(fake_accelerator, tmp_path):
    """Stock: the info dict, and the stacked index written into a slice sample, are not pinned."""
    sample, info = run_stock(
        lambda: _td_buffer(sampler=_slice_sampler)(True, 0, tmp_path).sample(return_info=True)
    )
    assert sample["obs"].is_pinned()
    assert not sample["index"].is_pinned()
    assert not any(leaf.is_pinned() for _, leaf in tensor_leaves(info))


@pytest.mark.stock_bug
def test_stock_leaves_index_generation_unpinned(fake_accelerator, generations, tmp_path):
    """Stock: the index_generation entry is pinned neither in the info nor in the sample."""
    sample, info = run_stock(
        lambda: _td_buffer(writer=_generation_writer)(True, 0, tmp_path).sample(return_info=True)
    )
    assert sample["obs"].is_pinned()
    assert not sample["index_generation"].is_pinned()
    assert not info["index_generation"].is_pinned()


@pytest.mark.cuda
def test_cuda_every_returned_tensor_is_pinned(buffer, access, tmp_path):
    """On a real accelerator: every returned CPU tensor reports is_pinned(); values as stock."""
    stock = run_stock(_scenario(buffer, access, False, 0, tmp_path))
    patched = run_patched(_scenario(buffer, access, True, 0, tmp_path))
    assert_identical(stock, patched)
    unpinned = [path for path, leaf in tensor_leaves(patched) if not leaf.is_pinned()]
    assert not unpinned, f"not pinned: {unpinned}"


@pytest.mark.cuda
@pytest.mark.stock_bug
def test_cuda_stock_misses_transform_output_and_info(tmp_path):
    """On a real accelerator, stock leaves a device=None transform output and the index unpinned."""
    sample = run_stock(lambda: _td_buffer(transform=KeepObservation)(True, 0, tmp_path).sample())
    assert not sample["obs"].is_pinned()
    sample = run_stock(lambda: _td_buffer(sampler=_slice_sampler)(True, 0, tmp_path).sample())
    assert sample["obs"].is_pinned() and not sample["index"].is_pinned()
