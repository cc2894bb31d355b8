"""Standing down: give every GPU back its baseline layout, then stop acting (``flexmig standdown``).

The baseline is the node's static layout, the one it has when flexmig is not re-laying it: a configuration of a
mig-parted file (``[baseline]``), resolved per GPU as ``mig-parted apply`` would. A stand-down is how an operator
hands the GPUs back to static operation (or to mig-parted and the GPU Operator) after flexmig re-laid them.

The rules, per GPU, checked on a fresh inventory:

* a GPU no entry of the configuration matches, a lost GPU, or one of a model flexmig has no table for is left as
  it is; flexmig never changes MIG mode, so a GPU whose MIG mode differs from the baseline's is left as it is too
  (``nvidia-mig-parted apply --mode-only`` changes it);
* a GPU that holds the baseline's MIG devices (the same profiles, as many of each, wherever they sit: mig-parted's
  own test) is at its baseline and is not touched;
* otherwise the target is the baseline layout that keeps the most of the GPU's instances where they are, and the
  GPU is re-laid only if every instance to destroy may go: one running a process flexmig cannot account for (of
  no job it registered), one whose processes NVML will not list, and a GPU instance without a compute instance
  are never destroyed, and then the whole GPU is left alone (no half re-laid GPU); an instance a job of flexmig's
  holds may go only with ``stop_jobs``, after the job's checkpoint is acknowledged (the stop of an action that
  cannot checkpoint is cancelled, and then nothing after it runs);
* the changes run as one journalled plan (stops, then destroys, then creates), in mode ``act`` only; afterwards
  the daemon's mode is ``observe``, so its planner does not re-lay the GPUs again (until a reload or restart
  brings the configured mode back).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flexmig.act.encoding import EncodedAction, StopPayload, encode, encode_action
from flexmig.act.nodeview import InstanceView, NodeView
from flexmig.act.records import JobRecord
from flexmig.act.results import PlanResult
from flexmig.errors import ConfigError
from flexmig.mig.migparted import MigPartedEntry, baseline_for, layout_for, parse_profile
from flexmig.plan.types import CreateInstance, DestroyInstance

__all__ = ["GpuVerdict", "StandDown", "plan_standdown", "standdown_document"]

REASON = "stand down to the baseline layout"


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """What a stand-down does (or did) to one GPU, and why."""

    gpu: int
    state: str
    """``at baseline``, ``restore`` (then ``restored`` or ``failed``), ``left alone`` or ``not in the baseline``."""
    why: str = ""
    target: str | None = None
    destroy: tuple[str, ...] = ()
    create: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The control API's form."""
        return {
            "gpu": self.gpu,
            "state": self.state,
            "why": self.why,
            "target": self.target,
            "destroy": list(self.destroy),
            "create": list(self.create),
            "stop": list(self.stop),
        }


@dataclass(frozen=True, slots=True)
class StandDown:
    """A stand-down worked out: the actions to run, and a verdict for every GPU."""

    actions: tuple[EncodedAction, ...]
    verdicts: tuple[GpuVerdict, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def plan_standdown(
    view: NodeView,
    mig_enabled: Mapping[int, bool | None],
    entries: Sequence[MigPartedEntry],
    jobs: Iterable[JobRecord],
    alive_pids: Mapping[str, Iterable[int]],
    *,
    stop_jobs: bool,
    reconfigure_s: float,
) -> StandDown:
    """The stand-down of the node ``view`` to the configuration ``entries`` (rules in the module docstring).

    ``mig_enabled``: GPU index -> MIG mode now (None: no MIG); ``jobs``: the journal's records; ``alive_pids``: the
    running rank pids of each job (their processes are accounted for). Pure: nothing is read or changed.
    """
    running = [rec for rec in jobs if rec.state == "running"]
    rules = _Rules(
        entries,
        holder={s.key: rec.name for rec in running for s in rec.slots},
        ours=frozenset(pid for pids in alive_pids.values() for pid in pids),
        stop_jobs=stop_jobs,
        reconfigure_s=reconfigure_s,
    )
    stops: list[str] = []
    destroys: list[EncodedAction] = []
    creates: list[EncodedAction] = []
    verdicts: list[GpuVerdict] = []
    for gpu in view.gpus():
        verdict, gpu_destroys, gpu_creates = rules.gpu(view, gpu, mig_enabled.get(gpu))
        verdicts.append(verdict)
        if verdict.state == "restore":
            stops += [j for j in verdict.stop if j not in stops]
            destroys += gpu_destroys
            creates += gpu_creates
    actions = [encode(StopPayload(False, REASON), job) for job in stops] + destroys + creates
    return StandDown(tuple(actions), tuple(verdicts))


@dataclass(frozen=True, slots=True)
class _Rules:
    """The stand-down's rules, with what they need of the node's jobs."""

    entries: Sequence[MigPartedEntry]
    holder: Mapping[tuple[int, int], str]
    ours: frozenset[int]
    stop_jobs: bool
    reconfigure_s: float

    def gpu(
        self, view: NodeView, gpu: int, mig: bool | None
    ) -> tuple[GpuVerdict, list[EncodedAction], list[EncodedAction]]:
        """The verdict on GPU ``gpu``, with its destroy and create actions when it is to be restored."""
        entries, reconfigure_s = self.entries, self.reconfigure_s
        model = view.model(gpu)
        base = baseline_for(entries, gpu, model)
        if base is None:
            return GpuVerdict(gpu, "not in the baseline", "no entry of the configuration matches this GPU"), [], []
        if gpu in view.lost:
            return GpuVerdict(gpu, "left alone", "the GPU is lost (GPU_IS_LOST)"), [], []
        if model is None:
            return GpuVerdict(gpu, "left alone", "flexmig has no MIG table for this GPU model"), [], []
        if base.mig_enabled != bool(mig):
            want, now = ("enabled" if base.mig_enabled else "disabled"), ("enabled" if mig else "disabled")
            why = (
                f"the baseline has MIG {want}, the GPU has it {now}; flexmig never changes MIG mode "
                "(nvidia-mig-parted apply --mode-only does)"
            )
            return GpuVerdict(gpu, "left alone", why), [], []
        if not base.mig_enabled:
            return GpuVerdict(gpu, "at baseline", "MIG disabled"), [], []
        current = view.layout(gpu)
        instances = [i for i in view.instances if i.gpu == gpu]
        if current is None:
            return GpuVerdict(gpu, "left alone", "its layout is not one flexmig's catalogue can model"), [], []
        try:
            wanted = {parse_profile(p, model).name: n for p, n in base.counts.items()}
            target = layout_for(model, wanted, prefer=current)
        except ConfigError as exc:
            return GpuVerdict(gpu, "left alone", f"the baseline does not fit this GPU: {exc}"), [], []
        have = Counter(i.profile.name for i in current)
        if have == Counter(wanted) and all(i.uuid is not None for i in instances):
            return GpuVerdict(gpu, "at baseline", base.describe(), target=current.spec()), [], []
        keep = {(i.profile.name, i.start) for i in target}
        leave = [i for i in instances if (i.profile, i.start) not in keep]
        blockers, stop = self._blockers(leave)
        destroy = tuple(i.spec() for i in leave)
        made = [i for i in target if current.at(i.start) is None or current.at(i.start) != i]
        create = tuple(f"gpu{gpu}:{i.spec()}" for i in made)
        if blockers:
            return GpuVerdict(gpu, "left alone", "; ".join(blockers), target.spec(), destroy, create), [], []
        destroys = [
            encode_action(DestroyInstance(gpu, i.start, model.profile(i.profile), REASON, reconfigure_s)) for i in leave
        ]
        creates = [encode_action(CreateInstance(gpu, i.start, i.profile, REASON, reconfigure_s)) for i in made]
        jobs = tuple(dict.fromkeys(stop))
        verdict = GpuVerdict(gpu, "restore", base.describe(), target.spec(), destroy, create, jobs)
        return verdict, destroys, creates

    def _blockers(self, leave: Sequence[InstanceView]) -> tuple[list[str], list[str]]:
        """Why the instances ``leave`` cannot go now, and the jobs to stop first (``stop_jobs``) so they can."""
        blockers = []
        stop: list[str] = []
        for inst in leave:
            job = self.holder.get(inst.key)
            if inst.uuid is None:
                blockers.append(f"{inst.spec()} is a GPU instance without a compute instance")
            elif inst.pids is None:
                blockers.append(f"NVML does not list the processes of {inst.spec()}")
            elif inst.pids - self.ours:
                foreign = ", ".join(str(p) for p in sorted(inst.pids - self.ours))
                blockers.append(f"{inst.spec()} runs processes flexmig cannot account for ({foreign})")
            elif job is not None:
                if self.stop_jobs:
                    stop.append(job)
                else:
                    blockers.append(f"job {job} runs on {inst.spec()} (--stop-jobs checkpoints and stops it first)")
        return blockers, stop


def standdown_document(
    baseline: str,
    before: StandDown,
    after: StandDown,
    result: PlanResult | None,
    *,
    dry_run: bool,
    mode: str,
) -> dict[str, Any]:
    """The control API's answer: each GPU's verdict (after the plan ran: ``restored`` where the GPU is now at
    its baseline, ``failed`` where it is not), the plan's result, the daemon's mode, and ``ok`` (every GPU in the
    baseline is at it)."""
    done = {v.gpu: v for v in after.verdicts}
    gpus = []
    for v in before.verdicts:
        out = v.to_json()
        if not dry_run and v.state == "restore":
            now = done.get(v.gpu)
            out["state"] = "restored" if now is not None and now.state == "at baseline" else "failed"
            if out["state"] == "failed" and result is not None:
                errors = [r.error for r in result.results if r.error]
                out["why"] = errors[0] if errors else (now.why if now is not None else "not at the baseline")
        gpus.append(out)
    ok = all(g["state"] in ("at baseline", "restored", "restore", "not in the baseline") for g in gpus)
    return {
        "baseline": baseline,
        "dry_run": dry_run,
        "gpus": gpus,
        "result": result.to_json() if result is not None else None,
        "mode": mode,
        "ok": ok,
    }
