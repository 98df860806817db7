"""The import-time jaxlib check (jax_topk/_build_check.py): a runtime jaxlib older than the one
the build compiled against is refused before any handler is registered, and JAX keeps working."""

import subprocess
import sys
import textwrap

import pytest

from jax_topk import _build_check, _build_info


def test_release_reads_the_leading_numbers():
    assert _build_check.release("0.10.2") == (0, 10, 2)
    assert _build_check.release("0.12.0.1") == (0, 12, 0, 1)
    assert _build_check.release("0.10.2.dev20260101+cuda") == (0, 10, 2)


def test_the_build_and_newer_jaxlibs_pass():
    _build_check.require_jaxlib_of_build(_build_info.JAXLIB_VERSION)
    _build_check.require_jaxlib_of_build("99.0")


def test_an_older_jaxlib_is_refused_saying_what_to_do():
    with pytest.raises(ImportError, match=r"built against jaxlib .* jaxlib 0\.0\.1 is installed"):
        _build_check.require_jaxlib_of_build("0.0.1")


# A fresh interpreter whose build info claims a jaxlib newer than any installed one.
_IMPORT_WITH_NEWER_BUILD = textwrap.dedent("""
    import sys, types
    build_info = types.ModuleType("jax_topk._build_info")
    build_info.JAXLIB_VERSION = "999.0"
    build_info.CUDA_TOOLKIT = build_info.CUDA_SKIPPED_BECAUSE = ""
    sys.modules["jax_topk._build_info"] = build_info
    try:
        import jax_topk
    except ImportError as error:
        print("refused:", error)
    else:
        raise SystemExit("import jax_topk did not refuse an older jaxlib")
    assert "jax_topk._lowering" not in sys.modules, "a handler module was imported"
    import jax.numpy as jnp
    assert float(jnp.ones(3).sum()) == 3.0
    print("jax works")
""")


def test_refused_import_leaves_jax_usable():
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_WITH_NEWER_BUILD],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused: jax_topk was built against jaxlib 999.0" in result.stdout
    assert "pip install" in result.stdout
    assert result.stdout.rstrip().endswith("jax works")
