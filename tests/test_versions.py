"""installed_version: distribution metadata first, the module's __version__ as fallback."""
from __future__ import annotations

import importlib.metadata
import sys
import types
import uuid

import pytest
from packaging.version import Version

from torchrl_fixes._core.versions import installed_version

PLACEHOLDERS = ["0.0.0+unknown", "0.0.0", "unknown", ""]


@pytest.fixture
def fake_package(monkeypatch):
    """Configures a package name's metadata version and module ``__version__``.

    ``metadata=None`` makes the distribution missing; ``module_version=None`` makes
    the module not importable.
    """
    name = f"torchrl_fixes_fake_{uuid.uuid4().hex}"
    real_version = importlib.metadata.version

    def configure(metadata, module_version):
        def version(package):
            if package != name:
                return real_version(package)
            if metadata is None:
                raise importlib.metadata.PackageNotFoundError(package)
            return metadata

        monkeypatch.setattr(importlib.metadata, "version", version)
        if module_version is None:
            monkeypatch.delitem(sys.modules, name, raising=False)
        else:
            module = types.ModuleType(name)
            module.__version__ = module_version
            monkeypatch.setitem(sys.modules, name, module)
        return name

    return configure


@pytest.mark.parametrize("placeholder", PLACEHOLDERS)
def test_placeholder_everywhere_is_unknown(fake_package, placeholder):
    """A placeholder in both the metadata and __version__ gives None."""
    assert installed_version(fake_package(placeholder, placeholder)) is None


@pytest.mark.parametrize("placeholder", PLACEHOLDERS)
def test_placeholder_metadata_falls_back_to_module(fake_package, placeholder):
    """A placeholder in the metadata is passed over for a real __version__."""
    assert installed_version(fake_package(placeholder, "0.10.1")) == Version("0.10.1")


def test_missing_metadata_falls_back_to_module(fake_package):
    """Without distribution metadata, the module's __version__ is used."""
    version = installed_version(fake_package(None, "1.2.3"))
    assert isinstance(version, Version)
    assert version == Version("1.2.3")


def test_metadata_comes_first(fake_package):
    """With both present, the distribution metadata wins."""
    assert installed_version(fake_package("2.0.1", "9.9.9")) == Version("2.0.1")


def test_invalid_metadata_falls_back_to_module(fake_package):
    """Metadata that is not a version is passed over."""
    assert installed_version(fake_package("not a version", "3.1")) == Version("3.1")


def test_nothing_known_is_none(fake_package):
    """No metadata and no importable module give None."""
    assert installed_version(fake_package(None, None)) is None
    assert installed_version(fake_package(None, "0.0.0+unknown")) is None


def test_real_torchrl_version():
    """The real TorchRL's release comes back as a packaging Version."""
    version = installed_version("torchrl")
    assert isinstance(version, Version)
    assert version == Version(importlib.metadata.version("torchrl"))
    assert version > Version("0.0.0")
