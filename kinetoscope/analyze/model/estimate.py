"""What fixing a finding is worth: the ``Estimate`` record (made by ``whatif``, carried by ``Finding.estimate``).

A typed record first, JSON second: ``to_dict`` writes the report's ``estimate`` object, keys in the order the report
has always had them. It also reads as a read-only mapping of that object (``est["saving_us_per_step"]``), so code
written against the JSON keeps working; new code uses the fields.

Nothing here is clamped: a replay whose step ends later than the unchanged one gives a negative saving, which the
report lists as an invariant violation (``violations``), never a zero that hides the model's error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: what ``saving_fraction`` is a fraction of
FRACTION_OF = "the rank's mean step time (replayed)"


@dataclass(frozen=True, eq=False)
class Estimate(Mapping[str, Any]):
    #: the rank's mean step after the fix (us)
    step_us_after: float
    #: the mean step before less after (us); negative where the replay ends later (an invariant violation)
    saving_us_per_step: float
    #: ``saving_us_per_step`` over the mean step before; None where that is zero
    saving_fraction: float | None
    #: how it was estimated ("replay: ...", "measured: ...", "one-off", "none")
    method: str
    #: what the estimate takes for granted
    assumptions: tuple[str, ...]
    fraction_of: str = FRACTION_OF
    #: the plan's own figures (the parameters it used, what it read of the host), JSON-ready, in its order
    details: dict[str, Any] = field(default_factory=dict)
    #: "upper" where an assumption the trace cannot check can only make the estimate optimistic
    bound: str | None = None
    #: a fix that keeps the job alive: steps until out of memory without it
    steps_to_out_of_memory: int | None = None
    #: a one-off cost: its total (us) and the steps it is spread over
    one_off_total_us: float | None = None
    amortised_over_steps: int | None = None
    #: the saving in each window step (us; sums to ``saving_us_per_step`` times the steps): where in the window it
    #: lies, so the policy can weigh steps unlike the others (an epoch's end) by how often the run has them. Not
    #: written to the report's JSON (``to_dict``); None where the estimate does not say
    saving_by_step_us: tuple[float, ...] | None = None

    @classmethod
    def of(cls, before_ns: float, after_ns: float, method: str, assumptions: tuple[str, ...] | list[str],
           **more: Any) -> Estimate:
        """From the mean step before and after (ns), rounded as the report writes them; never clamped."""
        saving = before_ns - after_ns
        return cls(step_us_after=round(after_ns / 1000, 3), saving_us_per_step=round(saving / 1000, 3),
                   saving_fraction=round(saving / before_ns, 4) if before_ns > 0 else None, method=method,
                   assumptions=tuple(assumptions), **more)

    def violations(self) -> list[str]:
        """What breaks an invariant: a fix modelled here only removes work or waiting, so a step that ends later
        than before (a negative saving) or before it begins is the model's error, said, not clamped."""
        out = []
        if self.saving_us_per_step < 0:
            out.append(f"estimate: the step ends {-self.saving_us_per_step:,.3f} us later after the fix "
                       f"({self.method}): a fix here only removes work")
        if self.step_us_after < 0:
            out.append(f"estimate: step_us_after {self.step_us_after:,.3f} us is below zero ({self.method})")
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step_us_after": self.step_us_after, "saving_us_per_step": self.saving_us_per_step,
                               "saving_fraction": self.saving_fraction, "fraction_of": self.fraction_of,
                               "method": self.method, "assumptions": list(self.assumptions)}
        if self.steps_to_out_of_memory is not None:
            out["steps_to_out_of_memory"] = self.steps_to_out_of_memory
        if self.one_off_total_us is not None:
            out["one_off_total_us"] = self.one_off_total_us
        if self.amortised_over_steps is not None:
            out["amortised_over_steps"] = self.amortised_over_steps
        out.update(self.details)
        if self.bound is not None:
            out["bound"] = self.bound
        return out

    # a read-only mapping of the JSON object
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking (a mapping), compared by value
