"""jupyter_vram: see, explain and shrink PyTorch memory from inside a notebook."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._budgets import assert_fits
from ._leaks import release_leaks
from ._model import CATEGORIES, Frame, ProfileFileError, Variant
from ._planning import Option, Plan, plan
from ._profile import Profile
from ._recording import Recording, record, started_early
from ._rerun import RerunError, rerun, rerun_unavailable
from ._session import last_profile

__all__ = [
    "CATEGORIES",
    "Estimate",
    "Frame",
    "LaunchError",
    "Option",
    "Plan",
    "Profile",
    "ProfileFileError",
    "Recording",
    "RerunError",
    "Variant",
    "assert_fits",
    "estimate",
    "estimate_generate",
    "last_profile",
    "launch",
    "plan",
    "record",
    "register_cache",
    "release_leaks",
    "rerun",
    "rerun_unavailable",
    "show",
    "unregister_cache",
    "verdict",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ._analysis.compare import verdict
    from ._capture.tagging import register_cache, unregister_cache
    from ._distributed import LaunchError, launch
    from ._estimator import Estimate, estimate, estimate_generate
    from ._model import Profile as ProfileData
else:

    def __getattr__(name: str) -> Any:
        """``jv.estimate`` / ``jv.Estimate`` load the estimator (and torch), ``jv.launch`` /
        ``jv.LaunchError`` the distributed launcher, on first use."""
        if name in ("estimate", "Estimate", "estimate_generate"):
            from . import _estimator as estimator

            return getattr(estimator, name)
        if name == "verdict":
            from ._analysis.compare import verdict

            return verdict
        if name in ("register_cache", "unregister_cache"):
            from ._capture import tagging

            return getattr(tagging, name)
        if name in ("launch", "LaunchError"):
            from . import _distributed as distributed

            return getattr(distributed, name)
        raise AttributeError(f"module 'jupyter_vram' has no attribute {name!r}")


def show(profile: ProfileData | Estimate | Sequence[ProfileData]) -> Any:
    """Display the interactive app for a profile or an estimate (what `%%vram` and
    `%vram_estimate` show), or for the ranks of a distributed run (a list of profiles, as
    `jv.launch` returns), and return it."""
    from IPython.display import display

    from ._app import ProfileApp
    from ._model import Profile as ProfileData

    app: Any
    if isinstance(profile, ProfileData):
        app = ProfileApp(profile)
    elif isinstance(profile, Sequence):
        from ._app.ranks_view import RanksApp

        app = RanksApp(profile)
    else:
        app = ProfileApp(profile.profile, estimate=profile)
    display(app)  # type: ignore[no-untyped-call]
    return app


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """`%load_ext jupyter_vram`: register `%%vram`, `%vram` and `%vram_estimate`."""
    from ._async_cells import install
    from ._magics import VramMagics

    ipython.register_magics(VramMagics)
    install(ipython)
    if _pre_run_cell not in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.register("pre_run_cell", _pre_run_cell)
    _start_estimator_early()
    _build_recorder_early()


def _build_recorder_early() -> None:
    """Build the light recorder's library on a helper thread (once per torch build, a few
    seconds), so the first `%%vram` does not wait for it. Never blocks or fails `%load_ext`."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return
    try:
        from ._capture import native

        native.build_in_background()
    except Exception:  # noqa: BLE001 - the first recording builds it, or says why not
        pass


#: Set to "0" to keep `%load_ext` from starting an estimator process ahead.
EARLY_ESTIMATOR_ENV = "JUPYTER_VRAM_EARLY_ESTIMATOR"
EARLY_START_THREAD = "jupyter_vram-estimator-start"


def _start_estimator_early() -> None:
    """Start a spare estimator process in the background, so the first estimate does not
    wait for its imports (seconds; minutes on a busy machine). Never blocks or fails
    `%load_ext`; nothing is started where torch is not installed. A recording started
    meanwhile waits for it (see ``_recording.started_early``)."""
    import importlib.util
    import os
    import threading

    if os.environ.get(EARLY_ESTIMATOR_ENV, "1") == "0" or importlib.util.find_spec("torch") is None:
        return
    started_early(threading.Thread(target=_start_spare, name=EARLY_START_THREAD, daemon=True))


def _start_spare() -> None:
    try:
        from ._estimator.runner import WARM

        WARM.start_spare()
    except Exception:  # noqa: BLE001 - the first estimate starts one itself
        pass


def _pre_run_cell(info: Any) -> None:
    """A re-run cell closes the app its previous run showed (the frontend replaces that
    output): a long session does not keep every app ever displayed."""
    from ._app.holder import cell_started

    try:  # noqa: SIM105 - no contextlib in the public module's namespace
        cell_started(getattr(info, "cell_id", None))
    except Exception:  # noqa: BLE001 - a cell must run whatever happens to old apps
        pass


def _jupyter_labextension_paths() -> list[dict[str, Any]]:
    """The prebuilt lab extension (built from labextension/ into jupyter_vram/labextension)."""
    return [{"src": "labextension", "dest": "jupyter-vram"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """Server extension serving BokehJS to the lab extension (see jupyter_vram/_server.py)."""
    return [{"module": "jupyter_vram._server"}]
