"""The interactive profile app (ipywidgets + bokeh). The only place that holds UI state.

Where each module here is tested: tests/INDEX.md.
"""

from .profile_app import ProfileApp

__all__ = ["ProfileApp"]
