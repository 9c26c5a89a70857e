"""Pinned sample output: ``pin_memory=True`` pins what ``sample()`` really returns.

Stock TorchRL pins the output of ``_sample`` / ``__getitem__`` only when it is an
object with ``device == cpu``. So the output of a transform that builds a new
TensorDict (``device=None``) is never pinned, the info dict is never pinned, the
info entries ``TensorDictReplayBuffer.sample`` writes into the sample are never
pinned, and on a machine with no accelerator ``pin_memory=True`` raises at the
first sample.

With this fix every CPU tensor of the returned sample is pinned (tensor
collections of any device, tensors, tuples, lists and dicts), leaves already on
an accelerator are left alone, and with no accelerator the buffer warns once and
returns unpinned data, as :class:`torch.utils.data.DataLoader` does. Pinning
still runs inside ``_sample``, so with ``prefetch`` it happens in the prefetch
worker, off the training thread.

Whether an accelerator is available is asked once per process
(:func:`_pin_memory_available`), not at every sample. With none, each buffer
warns once, naming the line of :func:`pin_memory_output` that skips the pinning
(``stacklevel=2``, no frame walk): the same line whichever thread samples, the
caller's or, with ``prefetch``, a worker's, and whatever wraps the pinned method.
Python's default filter shows it once per process.

On TorchRL main (torchrl-nightly 2026.10.27), ``TensorDictReplayBuffer.sample``
also takes ``wait``, ``timeout`` and ``cancel_event``, and a writer built with
``track_generations=True`` adds an ``index_generation`` info entry: the fix
replaces that ``sample`` with one taking the same arguments and passing them on
as stock does, and pins ``index_generation`` like every other info entry.

The code from :func:`_pin_memory_available` to :func:`_pin_memory` is what the
upstream patch puts in ``torchrl/data/replay_buffers/utils.py``, where the warning's
category is ``UserWarning`` instead of :class:`PinMemoryUnavailableWarning`;
:data:`SAMPLE_EDITS` are its edits of ``TensorDictReplayBuffer.sample``, made here
to each stock variant's own source.
"""
from __future__ import annotations

import functools
import types
import warnings
from typing import Any, Callable

import torch
from packaging.specifiers import SpecifierSet
from tensordict import is_tensor_collection

from torchrl_fixes._core.patching import Replacement, derive_from_source
from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.registry import Fix, Target
from torchrl_fixes._core.warning_categories import PinMemoryUnavailableWarning

try:
    from torchrl.data.replay_buffers import utils as _rb_utils
except ImportError as err:  # a TorchRL whose layout this fix does not know
    _rb_utils = None
    _IMPORT_ERROR = err
else:
    _IMPORT_ERROR = None


@functools.cache
def _pin_memory_available() -> bool:
    """Whether there is an accelerator for pinned memory to serve, asked once per process."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.is_available()
    return torch.cuda.is_available()


def _pin_tensor(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type == "cpu":
        return tensor.pin_memory()
    return tensor


def _pins_memory(buffer) -> bool:
    """Whether ``buffer``, built with ``pin_memory=True``, pins what it returns.

    It does where an accelerator is available. With none, it returns unpinned
    data, as :class:`torch.utils.data.DataLoader` does, and warns once, naming the
    line that calls this function (in :func:`pin_memory_output`), the same in every
    thread: a buffer with ``prefetch`` may sample in a worker thread.

    Args:
        buffer (ReplayBuffer): the replay buffer.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), pin_memory=True)
        >>> _ = rb.extend(torch.arange(10))
        >>> sample = rb.sample(4)  # warns if no accelerator is available
        >>> sample.is_pinned() == _pins_memory(rb) == _pin_memory_available()
        True
    """
    if _pin_memory_available():
        return True
    if not getattr(buffer, "_warned_pin_memory_unavailable", False):
        buffer._warned_pin_memory_unavailable = True
        warnings.warn(
            "pin_memory=True was passed to the replay buffer, but no accelerator "
            "is available: samples are returned without pinned memory.",
            category=PinMemoryUnavailableWarning,
            stacklevel=2,
        )
    return False


def pin_memory_output(fun) -> Callable:
    """Pins every CPU tensor of the outputs of the decorated replay buffer method.

    Pinning happens when the buffer was built with ``pin_memory=True`` and an
    accelerator is available (:func:`_pins_memory`); with none, the output is
    returned unpinned and the buffer warns once.
    :func:`_pin_memory` says what is pinned.

    Args:
        fun (Callable): a method of a replay buffer, such as ``_sample`` or
            ``__getitem__``.
    """

    def decorated_fun(self, *args, **kwargs):
        output = fun(self, *args, **kwargs)
        if self._pin_memory and _pins_memory(self):
            output = _pin_memory(output)
        return output

    return decorated_fun


def _pin_memory(output: Any) -> Any:
    """Pins every CPU tensor of ``output``.

    Tensor collections of any device (``device=None`` included, as transforms that
    build a new TensorDict return), tensors, and tuples, lists and dicts of them
    are pinned; tensors on an accelerator and other objects are returned as they are.
    """
    if is_tensor_collection(output):
        if output.device is None:
            # Leaves may sit on different devices: pin the CPU ones only.
            return output.apply(_pin_tensor, propagate_lock=True)
        if output.device.type == "cpu":
            return output.pin_memory()
        return output
    if isinstance(output, torch.Tensor):
        return _pin_tensor(output)
    if isinstance(output, tuple):
        pinned = [_pin_memory(_output) for _output in output]
        return type(output)(*pinned) if hasattr(output, "_fields") else tuple(pinned)
    if isinstance(output, list):
        return [_pin_memory(_output) for _output in output]
    if isinstance(output, dict):
        return {key: _pin_memory(val) for key, val in output.items()}
    return output


# The lines the fix writes into the stock ``TensorDictReplayBuffer.sample`` (its source
# as a top-level function, dedented): the info
# entries it sets in the sample (the stacked index, generations, weights) are pinned
# there, as ``_sample`` pins the rest.
SAMPLE_EDITS = (
    (
        "        for key, val in info.items():\n",
        "        pin_info = self._pin_memory and _pins_memory(self)\n"
        "        for key, val in info.items():\n",
    ),
    (
        "                val = _to_torch(val, data.device)\n",
        "                val = _to_torch(val, data.device)\n"
        "                if pin_info:\n"
        "                    # entries built here (the stacked index) are not pinned by _sample\n"
        "                    val = _pin_memory(val)\n",
    ),
)


def _tensordict_replay_buffer_sample(stock: Callable) -> Callable:
    """The stock ``TensorDictReplayBuffer.sample`` (any known release's) with :data:`SAMPLE_EDITS`."""
    return derive_from_source(
        stock,
        SAMPLE_EDITS,
        _pin_memory=_pin_memory,
        _pins_memory=_pins_memory,
    )


def _decorator_of(wrapper: types.FunctionType) -> Callable | None:
    """The module-level decorator that made ``wrapper`` (``_maybe_delay_init``), if any."""
    # The function that defines ``wrapper`` holds its code among its constants
    # (code.co_qualname, which names that function, is Python 3.11+).
    decorator = next(
        (
            value
            for value in wrapper.__globals__.values()
            if isinstance(value, types.FunctionType)
            and any(const is wrapper.__code__ for const in value.__code__.co_consts)
        ),
        None,
    )
    wrapped = getattr(wrapper, "__wrapped__", None)
    if decorator is None or not isinstance(wrapped, types.FunctionType):
        return None
    try:
        if decorator(wrapped).__code__ is not wrapper.__code__:
            return None
    except Exception:
        return None
    return decorator


def _redecorate(method: Any, stock_code: types.CodeType) -> Callable | None:
    """``method`` rebuilt around this module's ``pin_memory_output``, or None if it does not use it.

    ``method`` may be ``pin_memory_output(fun)`` itself or wrapped by further
    ``functools.wraps`` decorators (``_maybe_delay_init``); those are applied again
    in the same order around the new decorator.
    """
    outer = []
    while isinstance(method, types.FunctionType) and method.__code__ is not stock_code:
        decorator = _decorator_of(method)
        if decorator is None:
            return None
        outer.append(decorator)
        method = method.__wrapped__
    if not isinstance(method, types.FunctionType):
        return None
    fun = method.__closure__[method.__code__.co_freevars.index("fun")].cell_contents
    new = pin_memory_output(fun)
    for decorator in reversed(outer):
        new = decorator(new)
    return new


def _torchrl_subclasses(cls: type) -> list[type]:
    found, todo = [], [cls]
    while todo:
        klass = todo.pop()
        if klass not in found and klass.__module__.split(".")[0] == "torchrl":
            found.append(klass)
            todo.extend(klass.__subclasses__())
    return found


class PinnedSampleOutput(Fix):
    """Registry entry: see the module docstring."""

    name = "pinned_sample_output"
    summary = (
        "pin_memory pins what sample() and rb[index] return (transform outputs with "
        "device=None, info entries); warns instead of raising with no accelerator"
    )
    upstream_issue = "https://github.com/pytorch/rl/issues/2404"
    torchrl_versions = SpecifierSet(">=0.8")
    stock_classes = ("torchrl.data.replay_buffers.ReplayBuffer",)
    implements = (
        Target(
            "torchrl.data.replay_buffers.utils",
            "pin_memory_output",
            {"00f217e53bcd60d6": "0.8.1 to 0.14.1, torchrl-nightly 2026.10.27"},
            installs="replaced, and every TorchRL replay buffer method it decorates "
            "(ReplayBuffer._sample, ReplayBuffer.__getitem__, TensorDictReplayBuffer._sample, "
            "...) decorated again by the replacement",
        ),
        Target(
            "torchrl.data.replay_buffers.utils",
            "_pin_memory",
            {"fe2edbb01bceb61d": "0.8.1 to 0.14.1, torchrl-nightly 2026.10.27"},
            installs="relied on unchanged: the replacement pins through it",
        ),
        Target(
            "torchrl.data.replay_buffers.TensorDictReplayBuffer",
            "sample",
            {
                "9a37d14fcca085fb": "0.8.1 (include_info's annotation)",
                "1586db08ca9d097b": "0.9.2 to 0.14.1",
                "4a887fcaecbdef89": "torchrl-nightly 2026.10.27 (wait, timeout, cancel_event)",
            },
            installs="its own source, with the info entries written before pinning",
        ),
    )

    def plan(self) -> list[Replacement]:
        if _IMPORT_ERROR is not None:
            raise TargetChanged(f"cannot import TorchRL's replay buffer utilities ({_IMPORT_ERROR})")
        from torchrl.data.replay_buffers import ReplayBuffer, TensorDictReplayBuffer

        stock = {target.path: target.stock() for target in self.implements}
        sample = _tensordict_replay_buffer_sample(stock["TensorDictReplayBuffer.sample"])
        stock_code = _rb_utils.pin_memory_output(lambda self: None).__code__

        replacements = [
            Replacement(_rb_utils, "pin_memory_output", pin_memory_output),
            Replacement(TensorDictReplayBuffer, "sample", sample),
        ]
        for cls in _torchrl_subclasses(ReplayBuffer):
            for attr, method in vars(cls).items():
                new = _redecorate(method, stock_code)
                if new is not None:
                    replacements.append(Replacement(cls, attr, new))
        found = {(r.owner, r.name) for r in replacements}
        for required in (
            (ReplayBuffer, "_sample"),
            (ReplayBuffer, "__getitem__"),
            (TensorDictReplayBuffer, "_sample"),
        ):
            if required not in found:
                raise TargetChanged(
                    f"{required[0].__qualname__}.{required[1]} is no longer decorated "
                    "with pin_memory_output"
                )
        return replacements
