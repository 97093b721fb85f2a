"""The interactive profile app (ipywidgets + bokeh). The only place that holds UI state."""

from .profile_app import ProfileApp

__all__ = ["ProfileApp"]
