"""Packaging of the lab extension: the build hook's clear errors, and a wheel that brings the
prebuilt extension to an environment without Node.js."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_builder() -> ModuleType:
    """labextension/builder.py, the hatch-jupyter-builder build function (not a package)."""
    spec = importlib.util.spec_from_file_location("jv_builder", ROOT / "labextension/builder.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_extension(tmp_path: Path) -> Path:
    ext = tmp_path / "labextension"
    (ext / "src").mkdir(parents=True)
    (ext / "src" / "index.ts").write_text("export {};\n")
    (ext / "package.json").write_text("{}\n")
    return ext


def test_clean_clone_without_node_fails_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("hatch_jupyter_builder")
    builder = load_builder()
    ext = fake_extension(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(builder.LabExtensionBuildError) as err:
        builder.build("wheel", "standard", path=str(ext), build_dir=str(tmp_path / "out"))
    message = str(err.value)
    assert "Node.js is not installed (no `node` on PATH)" in message
    assert "Install Node.js >= 20.19" in message
    assert not isinstance(err.value, subprocess.CalledProcessError)


def test_old_node_is_named(tmp_path: Path) -> None:
    builder = load_builder()
    node = tmp_path / "node"
    node.write_text("#!/bin/sh\necho v18.19.1\n")
    node.chmod(0o755)
    assert builder.node_problem(str(node)) == ("Node.js v18.19.1 is too old (need >= 20.19)")
    node.write_text("#!/bin/sh\necho v20.19.0\n")
    assert builder.node_problem(str(node)) is None
    assert builder.node_problem(None) == "Node.js is not installed (no `node` on PATH)"


def test_failed_jlpm_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hjb = pytest.importorskip("hatch_jupyter_builder")
    builder = load_builder()
    ext = fake_extension(tmp_path)

    def failing(*args: object, **kwargs: object) -> None:
        raise subprocess.CalledProcessError(1, ["jlpm", "install"])

    monkeypatch.setattr(hjb, "npm_builder", failing)
    monkeypatch.setattr(builder, "node_problem", lambda node: None)
    with pytest.raises(builder.LabExtensionBuildError) as err:
        builder.build("wheel", "standard", path=str(ext), build_dir=str(tmp_path / "out"))
    assert "`jlpm install` (in " in str(err.value)
    assert "exited with 1" in str(err.value)
    assert err.value.__cause__ is None  # no chained CalledProcessError traceback


def test_staleness_covers_every_input(tmp_path: Path) -> None:
    builder = load_builder()
    ext = fake_extension(tmp_path)
    out = tmp_path / "out"
    assert builder.is_stale(ext, out)  # never built
    out.mkdir()
    (out / "package.json").write_text("{}")
    os.utime(out / "package.json", (2_000_000_000, 2_000_000_000))
    assert not builder.is_stale(ext, out)
    (ext / "schema").mkdir()
    (ext / "schema" / "plugin.json").write_text("{}")
    os.utime(ext / "schema" / "plugin.json", (2_000_000_100, 2_000_000_100))
    assert builder.is_stale(ext, out)  # a settings-schema change alone rebuilds


def assert_templates_shipped(
    names: list[str], python: Path, env: dict[str, str], cwd: Path
) -> None:
    """The wheel (its file ``names``) holds every HTML template, and the package installed
    from it (run by ``python``) renders from them."""
    templates = [p.name for p in (ROOT / "jupyter_vram/_render/templates").glob("*.html.j2")]
    assert templates
    assert [t for t in templates if f"jupyter_vram/_render/templates/{t}" not in names] == []
    shown = subprocess.run(
        [str(python), "-c", "from jupyter_vram._render.html import category_help_html as h; "
         "print(h())"],
        env=env, cwd=cwd, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "<summary>What the categories mean</summary>" in shown


@pytest.mark.slow
def test_wheel_brings_the_prebuilt_extension_without_node(tmp_path: Path) -> None:
    """Build the wheel once, install it into a fresh environment whose PATH has no node, and
    ask JupyterLab and the Jupyter server there whether the extensions are enabled and OK."""
    pytest.importorskip("hatchling")
    pytest.importorskip("hatch_jupyter_builder")
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "-w", str(dist), str(ROOT)],
        check=True, cwd=ROOT,
    )  # fmt: skip
    (wheel,) = dist.glob("jupyter_vram-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta_name).decode()
    data = next(n.split("/data/")[0] for n in names if "/data/" in n) + "/data/"
    lab = data + "share/jupyter/labextensions/jupyter-vram/"
    assert "jupyter_vram/py.typed" in names  # type checkers read the package's hints
    assert "jupyter_vram/_capture/native_reports.cpp" in names  # the light recorder's source
    assert lab + "package.json" in names
    assert lab + "install.json" in names
    assert lab + "schemas/jupyter-vram/plugin.json" in names
    assert any(re.fullmatch(re.escape(lab) + r"static/remoteEntry\.\w+\.js", n) for n in names)
    assert data + "etc/jupyter/jupyter_server_config.d/jupyter_vram.json" in names
    assert not [n for n in names if n.endswith(".ts") or "node_modules" in n]
    assert "Classifier: Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in metadata
    assert re.search(r"Requires-Dist: jupyter[-_]server.*extra == .lab.", metadata)

    # A fresh environment with its own pip, the wheel installed there first (so pip sees nothing
    # of this environment and cannot touch its editable install); then this environment's
    # packages made reachable through a plain path entry (its .pth files are not processed).
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {
        "PATH": str(env_dir / "bin"),
        "HOME": str(tmp_path / "home"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    assert shutil.which("node", path=env["PATH"]) is None

    def run(module: str, *args: str) -> str:
        done = subprocess.run(
            [str(python), "-m", module, *args],
            env=env, cwd=tmp_path, capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)

    where = subprocess.run(
        [str(python), "-c", "import jupyter_vram; print(jupyter_vram.__file__)"],
        env=env, cwd=tmp_path, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(env_dir)), where  # the wheel's copy, not this checkout
    assert_templates_shipped(names, python, env, tmp_path)
    # `jupyter labextension list` / `jupyter server extension list` (the `jupyter-*` scripts
    # live in the outer environment's bin/, which is not on this PATH)
    labext = run("jupyterlab.labextensions", "list")
    assert re.search(r"jupyter-vram v[\d.]+ enabled OK \(python, jupyter_vram\)", labext), labext
    assert str(env_dir / "share" / "jupyter" / "labextensions") in labext
    server = run("jupyter_server.extension.serverextension", "list")
    assert re.search(r"jupyter_vram enabled", server), server
    assert re.search(r"jupyter_vram [\d.]+ OK", server), server
