"""Whether a malleable job should start narrow: what it gains and what it pays, under the planner's own model.

A job that starts *narrow* (below its nominal compute, at speed ``s < 1``) at ``start`` instead of waiting for its
nominal shape until ``t_n`` (when the running jobs ending first leave room for it):

* **gains** the wait it is spared, ``W = t_n - start``: waiting, it would end at ``t_n + R``;
* **pays**, in the expected case, the work it does not do while narrow and the cost of growing back: it runs at
  ``s`` until it may grow (no earlier than ``t_n``, and than the settling time after its start), then pays one
  re-split's downtime ``c`` and runs the rest at full speed, so it ends ``(1 - s)(t_grow - start) + c`` later than a
  job that started nominal at ``start`` would (if it finishes before it may grow: ``R (1/s - 1)``);
* pays **at worst**, if it never grows back (the room went to someone else), ``R (1/s - 1)``.

It starts narrow only when both hold (:meth:`NarrowCase.pays`):

1. ``W >= R (1/s - 1)``: even if it never grows back it ends no later than waiting would have ended it, so a
   narrow start cannot make the job itself (its completion time, its slowdown) worse under the model, whatever
   happens later; and growing back is itself taken only when it pays (:mod:`flexmig.plan.grow`);
2. ``W >= (1 + gain_margin) x expected cost``: the expected gain outweighs the slowdown and the re-split by the
   margin every move must clear (``PlannerSettings.gain_ratio``).

It takes only capacity no job before it in the queue can use now, and under EASY only where the head still starts
at its reservation (:mod:`flexmig.plan.queue`), so it delays none of the waiting jobs now; its work in slice-seconds
is its nominal work (``k`` slices for ``R n / k``), so it takes no more of the node than starting later would. A
head reserved narrow (:meth:`flexmig.plan.placer.BasePlacer.shadow`) is judged the same way, from the reserved time
and at its smallest narrow shape's speed.

A job whose run time is unknown (flexmigd's usual case: a spec says no run time) cannot be weighed: it starts narrow
when its nominal shape does not fit, as the operator's ``ranks.min`` allows; so does one whose nominal shape never
frees up as the running jobs end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["NarrowCase", "narrow_case"]


@dataclass(frozen=True, slots=True)
class NarrowCase:
    """The model's figures for one narrow start, in seconds of the job's completion time: the wait it is spared,
    what it pays in the expected case (slowdown while narrow and growing back) and at worst (never growing back)."""

    wait_s: float
    expected_cost_s: float
    worst_cost_s: float

    def pays(self, gain_ratio: float) -> bool:
        """Start narrow: never later than waiting even without growing back, and the wait spared at least
        ``gain_ratio`` times the expected cost."""
        if math.isinf(self.wait_s):
            return True
        return self.wait_s >= self.worst_cost_s and self.wait_s >= gain_ratio * self.expected_cost_s


def narrow_case(
    runtime_s: float | None,
    speed: float,
    *,
    start_s: float,
    nominal_s: float,
    settling_s: float,
    move_cost_s: float,
) -> NarrowCase | None:
    """The figures for starting narrow at ``start_s`` at ``speed`` (0 < speed < 1) rather than nominal at
    ``nominal_s`` (see the module docstring); None when the run time is unknown (the model cannot weigh it)."""
    if runtime_s is None:
        return None
    wait = nominal_s - start_s
    worst = runtime_s * (1.0 / speed - 1.0)
    if math.isinf(wait):
        return NarrowCase(wait, worst, worst)
    narrow_for = max(nominal_s, start_s + settling_s) - start_s
    done_first = speed * narrow_for >= runtime_s  # it is done before it may grow
    expected = worst if done_first else (1.0 - speed) * narrow_for + move_cost_s
    return NarrowCase(wait, expected, worst)
