"""The Make-it-fit tab: a budget box (bytes, a size or a GPU name), the ranked options of
`jv.plan` as predicted-peak bars against the budget line, and a Verify button per option that
reruns the cell with it and puts the measured peak beside the predicted one.

The view keeps numbers only (per-app state stays small, see holder): each verification plans
again from the app's profile (cheap, no model runs) and reruns the option of that name. A
verification runs on the kernel's main thread, as the rerun row's does (see rerun_view).
"""

from __future__ import annotations

import html
import weakref
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from .._render.fit_html import FitRow, legend_html, row_html, scale_of
from .holder import GONE, ProfileHandle
from .interrupts import interrupts_raise
from .rerun_view import main_loop

if TYPE_CHECKING:
    from .._estimator import Estimate
    from .._planning import Plan

TITLE = "Make it fit"
#: Options shown (the cheapest first); the plan holds the rest.
SHOWN = 12


class FitView(w.VBox):  # type: ignore[misc]
    """Budget box, Plan button, ranked options with Verify buttons."""

    def __init__(
        self, handle: ProfileHandle, estimate: Estimate | None = None, budget: str = ""
    ) -> None:
        self._handle = handle
        # held weakly, as the app holds it (an estimate keeps its pickled model)
        self._estimate = weakref.ref(estimate) if estimate is not None else None
        self.budget = w.Text(value=budget, placeholder="14GiB, 512MiB, bytes or a GPU: T4")
        self.budget.add_class("jv-fit-budget")
        self.plan_button = w.Button(description="Plan", button_style="primary")
        self.plan_button.add_class("jv-fit-plan")
        self.plan_button.on_click(lambda _: self.make_plan())
        self.budget.continuous_update = False  # Enter or leaving the box plans
        self.budget.observe(lambda _: self.make_plan(), "value")
        self.status = w.HTML()
        self.status.add_class("jv-fit-status")
        self.rows = w.VBox()
        self.rows.add_class("jv-fit-rows")
        self._numbers: dict[str, FitRow] = {}
        self._html: dict[str, w.HTML] = {}
        self._budget_bytes = 0
        self._scale = 1.0
        top = w.HBox([w.HTML("<b>Budget</b>"), self.budget, self.plan_button])
        super().__init__([top, self.status, self.rows])
        self.add_class("jv-fit")
        if budget:
            self.make_plan()

    def _plan(self, budget: str) -> Plan | None:
        from .._planning import plan

        profile = self._handle.get()
        estimate = self._estimate() if self._estimate is not None else None
        if profile is None or (self._estimate is not None and estimate is None):
            self.status.value = f"<p class='jv-gone'>{GONE}</p>"
            return None
        return plan(estimate if estimate is not None else profile, budget)

    def make_plan(self) -> None:
        """Plan for the budget in the box and show its options (a bad budget says why)."""
        text = self.budget.value.strip()
        try:
            plan = self._plan(text)
        except ValueError as error:
            self.status.value = f"<span class='jv-fit-error'>{html.escape(str(error))}</span>"
            return
        if plan is None:
            return
        options = plan.options[:SHOWN]
        self._budget_bytes = plan.budget_bytes
        self._numbers = {
            o.name: FitRow(o.name, o.predicted_peak_bytes, o.fits, o.time_factor, o.why)
            for o in options
        }
        self._scale = scale_of(list(self._numbers.values()), plan.budget_bytes,
                               plan.profile.peak_bytes)  # fmt: skip
        self.status.value = legend_html(plan.summary(), plan.budget_label, plan.cannot_predict)
        self.rows.children = [self._row(o.name, o.verifiable, plan) for o in options]

    def _row(self, name: str, verifiable: str | None, plan: Plan) -> w.Widget:
        shown = w.HTML(row_html(self._numbers[name], self._budget_bytes, self._scale))
        self._html[name] = shown
        button = w.Button(description="Verify", layout=w.Layout(width="70px"))
        button.add_class("jv-fit-verify")
        reason = verifiable or (
            "an estimate has no cell to rerun" if plan.estimate is not None else None
        )
        if reason is not None:
            button.disabled = True
            button.tooltip = reason
        else:
            button.tooltip = "rerun the cell with this option and measure it"
            button.on_click(lambda _: self.click_verify(name))
        row = w.HBox([shown, button])
        row.add_class("jv-fit-option")
        return row

    def click_verify(self, name: str) -> None:
        """Verify on the kernel's main thread: now when already there, else when it is free."""
        loop = main_loop()
        self.status.value = self.status.value.split("<div class='jv-fit-progress'>")[0] + (
            f"<div class='jv-fit-progress'>verifying {html.escape(name)}\u2026</div>"
        )
        if loop is None:
            self.verify(name)
        else:
            loop.add_callback(self.verify, name)

    def verify(self, name: str) -> int | None:
        """Rerun the cell with option ``name``; its row shows the measured peak (returned). On
        the main thread a kernel interrupt cancels it (see interrupts.interrupts_raise)."""
        from .._rerun import RerunError

        said = ""
        measured = None
        try:
            plan = self._plan(self.budget.value.strip())
            if plan is not None:
                option = plan.option(name)
                with interrupts_raise() as interrupts:
                    option.verify()
                if interrupts.cancelled:  # it ended before a dropped interrupt landed
                    raise KeyboardInterrupt
                measured = option.measured_peak_bytes
        except (RerunError, ValueError, KeyError) as error:
            said = html.escape(str(error))
        except KeyboardInterrupt:
            said = "cancelled; the notebook's state is as the cell left it"
        except Exception as error:  # noqa: BLE001 (the cell raised: say so)
            said = html.escape(f"the cell raised: {type(error).__name__}: {error}")
        head = self.status.value.split("<div class='jv-fit-progress'>")[0]
        self.status.value = head + (
            f"<div class='jv-fit-progress jv-fit-error'>{name}: {said}</div>" if said else ""
        )
        if measured is not None:
            row = self._numbers[name]
            self._numbers[name] = FitRow(row.name, row.predicted, row.fits, row.time_factor,
                                         row.why, measured)  # fmt: skip
            self._html[name].value = row_html(self._numbers[name], self._budget_bytes, self._scale)
        return measured


def fit_tab(handle: ProfileHandle, estimate: Any = None, budget: str = "") -> w.Widget:
    """The tab's content (built when the tab opens)."""
    return FitView(handle, estimate, budget)
