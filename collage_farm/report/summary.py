"""The story a campaign tells, one figure per plan: what `tune` prints, its JSON and the report.

A measured campaign handles up to five plans (the first search's, the Dijkstra plan after
confirmation, the refined plan, each toolchain's whole model, the written plan), and a figure
without the plan it belongs to reads as a contradiction: an estimate of the Dijkstra plan
beside the measurement of the never-worse fallback. `story` turns a campaign summary (the dict
`collage_farm.campaign.run_tune` returns) into `StoryLine`s in a fixed order of `Section`s:

1. ``PLAN``: the written plan and its measured latency;
2. ``SINGLES``: each toolchain's whole model, measured in the same interleaved run;
3. ``DECISION``: why this plan, with the per-round ratio and its 95% interval in words
   (`compare_words`; `collage_farm.postsearch.noise.paired` computes both);
4. ``ESTIMATE``: the search's estimate *of the written plan* and its additive error;
5. ``HISTORY``: the search's own plan, the confirmation, every refinement move tried.

Every line names its plan (`plan_label`: "openvino-cpu whole", "a mix of 3 partitions ...").
`story_keys` gives the summary keys the campaign adds (``story``, ``written_plan``,
``dijkstra_plan``, ``written_plan_estimated_s``, ``written_plan_vs``); the existing keys keep
their meaning. Mock and offline campaigns, which measure nothing end to end, get the plan and
its estimate only, said so.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collage_farm.core.search import SearchResult
from collage_farm.postsearch.noise import Paired, paired
from runners.base import Summary

__all__ = ["Section", "StoryLine", "compare_words", "move_verdict", "plan_label", "plural",
           "result_label", "run_story", "story", "story_keys", "story_text"]


class Section(enum.Enum):
    """The parts of a campaign's story, in the order they are told."""

    PLAN = "plan"
    SINGLES = "singles"
    DECISION = "decision"
    ESTIMATE = "estimate"
    HISTORY = "history"


@dataclass(frozen=True)
class StoryLine:
    """One sentence of the story, in its section."""

    section: Section
    text: str

    def to_json(self) -> dict[str, str]:
        return {"section": self.section.value, "text": self.text}


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds with four significant digits ("-" when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.4g} ms"


def plural(n: int, word: str) -> str:
    """``1 partition``, ``2 partitions``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def plan_label(parts: Sequence[tuple[str, int]], nodes: int) -> str:
    """A plan in words from its partitions' (target, node count): ``"ort-cpu whole"`` for one
    partition of every node, else ``"a mix of 3 partitions (ort-cpu 2, openvino-cpu 1)"``."""
    if len(parts) == 1 and parts[0][1] == nodes:
        return f"{parts[0][0]} whole"
    per: dict[str, int] = {}
    for t, _ in parts:
        per[t] = per.get(t, 0) + 1
    inner = ", ".join(f"{t} {n}" for t, n in per.items())
    return f"a mix of {plural(len(parts), 'partition')} ({inner})"


def result_label(result: SearchResult, nodes: int) -> str:
    """`plan_label` of a search result (a plan before it is written)."""
    return plan_label([(p.candidate.target.id, len(p.candidate.sub_graph))
                       for p in result.partitions], nodes)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%" if abs(x) < 0.1 else f"{x * 100:.0f}%"


def compare_words(a: str, b: str, cmp: Paired) -> str:
    """``a`` against ``b`` in words: "a is 9.6% faster than b, 95% interval 4-15%".

    ``cmp.ratio`` is a / b (time). Faster means b takes that much longer than a (1/ratio - 1),
    slower that a takes that much longer than b (ratio - 1); the interval is `Paired.low` /
    `Paired.high` in the same terms, and an interval across 1 is said as such.
    """
    r, lo, hi = cmp.ratio, cmp.low, cmp.high
    if not math.isfinite(r) or r <= 0:
        return f"{a} could not be compared with {b}"
    if abs(r - 1.0) < 5e-4:
        head = f"{a} takes the same time as {b}"
    elif r < 1:
        head = f"{a} is {_pct(1 / r - 1)} faster than {b}"
    else:
        head = f"{a} is {_pct(r - 1)} slower than {b}"
    how = f"{plural(cmp.pairs, 'paired round')}" if cmp.pairs else "unpaired medians"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{head} ({how})"
    if hi < 1:
        span = f"{_pct(1 / hi - 1)}-{_pct(1 / lo - 1)} faster"
    elif lo > 1:
        span = f"{_pct(lo - 1)}-{_pct(hi - 1)} slower"
    else:
        span = f"from {_pct(1 / lo - 1)} faster to {_pct(hi - 1)} slower"
    return f"{head}, 95% interval {span} ({how})"


def move_verdict(trial: Mapping[str, Any]) -> str:
    """A refinement trial's outcome in words (its ``status`` with the measured ratio): a move
    1.5x slower is "1.50x slower", never "not beyond noise"."""
    status, ratio, thr = trial.get("status"), trial.get("ratio"), trial.get("threshold")
    if status == "failed":
        return f"failed: {str(trial.get('error', ''))[:100]}"
    if ratio is None or thr is None or not math.isfinite(ratio):
        return str(status)
    if status == "accepted":
        return f"kept: {1 / ratio:.2f}x faster, beyond noise ({thr:.1%}) in two runs"
    if ratio > 1 + thr:
        return f"rejected: {ratio:.2f}x slower"
    if ratio < 1 - thr:
        return f"rejected: {1 / ratio:.2f}x faster in one run, not in the second"
    return f"rejected: within noise (ratio {ratio:.3f}, threshold {thr:.1%})"


# --- the plans of one measured campaign ---------------------------------------------------

@dataclass(frozen=True)
class _Plans:
    """The names of the never-worse run (``dijkstra``, ``refined``, target ids) in words."""

    written_name: str  # the written plan's name in the never-worse run
    labels: dict[str, str]  # run name -> plan label

    def label(self, name: str) -> str:
        return self.labels.get(name, name)


def _plans(s: Mapping[str, Any]) -> _Plans:
    labels = {t: f"{t} whole" for t in (s.get("singles_measured_s") or {})}
    labels["dijkstra"] = f"the Dijkstra plan ({s.get('dijkstra_plan', '?')})"
    ref = s.get("refine") or {}
    after = plural(int(ref.get("partitions_after") or 0), "partition")
    labels["refined"] = f"the refined plan ({after})"
    plan_is = str(s.get("plan_is") or "")
    written = (str(s.get("best_single_target")) if plan_is == "best_single"
               else plan_is or "dijkstra")
    if written in ("dijkstra", "refined") and s.get("written_plan"):
        labels[written] = str(s["written_plan"])
        if written == "refined":
            labels[written] = f"the refined plan, {s['written_plan']}"
    return _Plans(written, labels)


def _rounds(s: Mapping[str, Any]) -> dict[str, list[float]]:
    return {k: list(v) for k, v in (s.get("verify_round_medians_s") or {}).items() if v}


def _pair(s: Mapping[str, Any], a: str, b: str) -> Paired | None:
    """``a`` against ``b`` round by round from the never-worse run, None when either has no
    rounds there (failed, or an alias of the other)."""
    r = _rounds(s)
    ra, rb = r.get(a), r.get(b)
    if not ra or not rb:
        return None
    return paired(Summary.of(ra, ra), Summary.of(rb, rb), ra, rb, len(ra))


def _written_vs(s: Mapping[str, Any], plans: _Plans) -> dict[str, dict[str, Any]]:
    """The written plan against every other entry timed in the never-worse run."""
    out: dict[str, dict[str, Any]] = {}
    w = plans.written_name
    for name in _rounds(s):
        if name == w or _same_plan(s, name, w):
            continue
        p = _pair(s, w, name)
        if p is not None:
            out[name] = {"plan": plans.label(name), **p.to_json(),
                         "words": compare_words(plans.label(w), plans.label(name), p)}
    return out


def _same_plan(s: Mapping[str, Any], a: str, b: str) -> bool:
    """Whether two run names are one plan timed once (the run aliases identical plans)."""
    r = _rounds(s)
    return a in r and b in r and r[a] == r[b]


def _inverse(p: Paired) -> Paired:
    return Paired(1 / p.ratio if p.ratio else math.inf, p.threshold, p.pairs,
                  1 / p.high if p.high else math.nan, 1 / p.low if p.low else math.nan)


def _deciding(s: Mapping[str, Any]) -> Paired | None:
    """The comparison that decided mix against best single (the second run's when it
    overturned the first), as `Paired` (mix / best)."""
    d = s.get("mix_vs_best_single_confirm") or s.get("mix_vs_best_single")
    if not isinstance(d, Mapping) or d.get("ratio") is None:
        return None
    nan = math.nan
    return Paired(float(d["ratio"]), float(d.get("threshold") or 0.0), int(d.get("pairs") or 0),
                  float(d["low"]) if d.get("low") is not None else nan,
                  float(d["high"]) if d.get("high") is not None else nan)


def _decision(s: Mapping[str, Any], plans: _Plans) -> str:
    """Why the written plan, with the deciding comparison and its interval."""
    w, best = plans.written_name, s.get("best_single_target")
    cmp = _deciding(s)  # mix / best single
    mix = ("refined" if s.get("refined_measured_s") is not None
           and s.get("mix_measured_s") == s.get("refined_measured_s") else "dijkstra")
    if best and cmp is not None:
        thr = f"noise threshold {cmp.threshold:.1%}"
        if s.get("plan_is") == "best_single":
            return (f"decision: {plans.label(w)} is written (never worse) because "
                    f"{plans.label(mix)} is not faster beyond noise: "
                    f"{compare_words(plans.label(w), plans.label(mix), _inverse(cmp))}; {thr}")
        if s.get("within_noise_of_best_single"):
            return (f"decision: {plans.label(w)} is written: it is within noise of the "
                    f"fastest single toolchain's whole model, and a whole model gives way "
                    f"only to one faster beyond noise: "
                    f"{compare_words(plans.label(w), f'{best} whole', cmp)}; {thr}")
        if s.get("written_plan") != f"{best} whole":
            again = " and in a second interleaved run" if s.get(
                "mix_vs_best_single_confirm") else ""
            return (f"decision: {plans.label(w)} is written because it beats the best single "
                    f"toolchain beyond noise{again}: "
                    f"{compare_words(plans.label(w), f'{best} whole', cmp)}; {thr}")
    vs = [v["words"] for k, v in (s.get("written_plan_vs") or {}).items()
          if k in (s.get("singles_measured_s") or {})]
    if best and s.get("written_plan") == f"{best} whole" and vs:
        return ("decision: the search's plan is the fastest toolchain's whole model; "
                + "; ".join(vs))
    return f"decision: {s.get('never_worse') or s.get('verify') or 'not checked'}"


def _estimate(s: Mapping[str, Any], written: str, measured: bool) -> str:
    est = s.get("estimated_total_s")
    src = s.get("estimator", "?")
    what = " (MOCK COSTS: not measurements)" if src == "mock" else ""
    if s.get("baseline") == "vela_whole":  # an Ethos-U board: builds, not timings
        what = " (simulated: Vela cycles and the Cortex-M cycle model)"
    source = f"{src} costs"
    profiled = [t for t in s.get("targets") or () if t in set(
        (s.get("profile") or {}).get("profiled_targets") or ())]
    if profiled and src != "mock" and s.get("baseline") != "vela_whole":
        rest = [t for t in s.get("targets") or () if t not in profiled]
        source = (f"shares of in-network profiles ({', '.join(profiled)})"
                  + (f" and {src} costs ({', '.join(rest)})" if rest else ""))
    line = (f"the search's estimate of the written plan ({written}): {ms(est)} = "
            f"{ms(s.get('estimated_compute_s'))} partitions + "
            f"{ms(s.get('estimated_transition_s'))} transitions, from {source}{what}")
    ae = s.get("additive_error")
    if measured and ae is not None:
        line += f"; additive error {ae:+.1%} of the measured {ms(s.get('plan_measured_s'))}"
    return line


def _history(s: Mapping[str, Any]) -> list[str]:
    """The search's plan, the confirmation and every refinement move, each named."""
    d = str(s.get("dijkstra_plan", "?"))
    out: list[str] = []
    conf = s.get("confirm") or {}
    first, final = s.get("first_search_estimated_s"), s.get("dijkstra_estimated_s")
    if conf.get("remeasured"):
        if conf.get("path_changed"):
            out.append(f"search: the first search's plan was estimated {ms(first)}; after "
                       f"re-measuring {plural(int(conf['remeasured']), 'candidate')} of its "
                       f"path the search chose the Dijkstra plan, {d}, estimated {ms(final)}")
        else:
            out.append(f"search: the Dijkstra plan, {d}, estimated {ms(first)}, then "
                       f"{ms(final)} after re-measuring "
                       f"{plural(int(conf['remeasured']), 'candidate')} of its path")
    else:
        mix = s.get("mix_within_noise") or {}
        if mix:
            parts = " + ".join(f"{t} ({plural(int(n), 'node')})" for t, n in mix.get("plan", ()))
            out.append(f"search: its plan, the mix {parts}, was estimated "
                       f"{ms(mix.get('estimated_s'))}: {mix.get('why')}; it is set aside "
                       f"untimed, and the Dijkstra plan the campaign goes on with is {d}, "
                       f"estimated {ms(final)}")
        else:
            out.append(f"search: the Dijkstra plan, {d}, estimated {ms(final)}")
    chain = s.get("inchain") or {}
    if chain.get("plans"):
        timed = chain.get("log") or [{}]
        exits = ", ".join(f"{t} {ms(v)}" for t, v in sorted((chain.get("exit_s") or {}).items())
                          if v)
        out.append(f"in-chain pricing: the search's first plan was estimated "
                   f"{ms(timed[0].get('estimated_s'))} and ran {ms(timed[0].get('plan_s'))} "
                   f"in this process (measured); "
                   f"{plural(int(chain['plans']), 'mixed plan')} timed so, "
                   f"{plural(int(chain.get('priced', 0)), 'partition')} priced by it"
                   + (f", leaving a partition learned to cost {exits}" if exits else "")
                   + f" (stopped: {chain.get('stopped_by')})")
    if conf.get("stopped_by") == "decided":
        out.append(f"confirmation: not needed; campaign {conf.get('decided_by')} confirmed "
                   "this plan's costs and measured it end to end (--reconfirm measures again)")
    dm = s.get("dijkstra_measured_s")
    if s.get("plan_is") == "dijkstra":
        out.append("the Dijkstra plan is the written plan")
    elif dm is not None:
        line = f"the Dijkstra plan measured {ms(dm)} in the never-worse run"
        if s.get("dijkstra_additive_error") is not None:
            line += f" (its additive error {s['dijkstra_additive_error']:+.1%})"
        gain = s.get("estimated_gain_vs_best_single")
        if gain is not None and int(s.get("dijkstra_partitions") or 0) > 1:
            line += (f"; by its estimates the search believed this mix {gain:.3f}x as fast as "
                     "the best single toolchain's whole model")
        cae = s.get("dijkstra_calibrated_additive_error")
        if cae is not None and int(s.get("dijkstra_partitions") or 0) > 1:
            line += f"; additive error after per-target calibration {cae:+.1%}"
        out.append(line)
    ref = s.get("refine") or {}
    if ref.get("trials") or ref.get("stopped_by") not in (None, "disabled"):
        line = (f"refinement of the Dijkstra plan: {plural(int(ref.get('trials') or 0), 'move')}"
                f" tried, {ref.get('accepted', 0)} kept (stopped: {ref.get('stopped_by')})")
        later = int(ref.get("skipped_timed_later") or 0)
        if later:
            line += (f"; {plural(later, 'move')} to a toolchain's whole model left to the "
                     "never-worse run, which times every whole model against the plan")
        if s.get("refined_measured_s") is not None:
            line += (f"; the refined plan measured {ms(s['refined_measured_s'])} vs the "
                     f"Dijkstra plan {ms(dm)} in the never-worse run")
        out.append(line)
        for t in ref.get("log") or []:
            out.append(f"  move {t.get('description')}: {ms(t.get('current_s'))} -> "
                       f"{ms(t.get('candidate_s'))} in its own run, {move_verdict(t)}")
    return out


def _singles(s: Mapping[str, Any]) -> str:
    singles = s.get("singles_measured_s") or {}
    inel = s.get("singles_ineligible") or {}
    parts = [f"{t} {ms(v)}" + (" (pins keep it from being the plan)" if t in inel else "")
             for t, v in sorted(singles.items(), key=lambda kv: kv[1] or math.inf)]
    for name, err in (s.get("verify_errors") or {}).items():
        if name not in ("dijkstra", "refined"):
            parts.append(f"{name} failed ({str(err)[:80]})")
    rounds = s.get("verify_rounds")
    return ("each toolchain's whole model, measured in the same interleaved run"
            + (f" ({rounds} rounds)" if rounds else "") + ": " + ", ".join(parts))


def story(s: Mapping[str, Any]) -> list[StoryLine]:
    """The campaign summary ``s`` as its story (see module doc); ``s`` must hold
    ``written_plan`` and ``dijkstra_plan`` (`story_keys` adds them)."""
    written = str(s.get("written_plan", "?"))
    lines: list[StoryLine] = []
    if s.get("plan_measured_s") is not None:
        why = {"best_single": " (never-worse fallback: the best single toolchain)",
               "refined": " (the Dijkstra plan after refinement)",
               "dijkstra": " (the search's Dijkstra plan)"}.get(str(s.get("plan_is")), "")
        lines.append(StoryLine(Section.PLAN, f"written plan: {written}{why}; measured "
                                             f"{ms(s['plan_measured_s'])} end to end"))
        if s.get("singles_measured_s") or s.get("verify_errors"):
            lines.append(StoryLine(Section.SINGLES, _singles(s)))
        plans = _plans(s)
        lines.append(StoryLine(Section.DECISION, _decision(s, plans)))
        lines.append(StoryLine(Section.ESTIMATE, _estimate(s, written, True)))
    else:
        dec = s.get("decision")
        if isinstance(dec, Mapping) and dec.get("plan_measured_s") is not None:
            lines.append(StoryLine(Section.PLAN, (
                f"written plan: {written}, the plan campaign {dec.get('campaign_id')} wrote "
                f"for this search plan ({dec.get('plan_is')}); it measured "
                f"{ms(dec.get('plan_measured_s'))} end to end there (not measured now)")))
            lines.append(StoryLine(Section.DECISION,
                                   f"decision (recorded): {dec.get('never_worse')}"))
        else:
            lines.append(StoryLine(Section.PLAN, f"written plan: {written}; not measured end "
                                                 f"to end: {s.get('verify', 'not checked')}"))
        lines.append(StoryLine(Section.ESTIMATE, _estimate(s, written, False)))
    if s.get("vela_whole_source"):  # an Ethos-U board: where the baseline's split comes from
        lines.append(StoryLine(Section.DECISION,
                               f"Vela whole's split: {s['vela_whole_source']}"))
    if s.get("plan_measured_s") is not None or s.get("dijkstra_plan") != written:
        lines += [StoryLine(Section.HISTORY, t) for t in _history(s)]
    return lines


def story_keys(s: Mapping[str, Any], written: SearchResult, dijkstra: SearchResult,
               nodes: int) -> dict[str, Any]:
    """The summary keys the story adds to a campaign summary ``s``: ``written_plan`` and
    ``dijkstra_plan`` (`plan_label`), ``written_plan_estimated_s`` (the search's estimate of
    the written plan: `estimated_total_s` under a name that says so), ``written_plan_vs``
    (measured campaigns: the written plan against every other plan of the never-worse run,
    round by round with a 95% interval) and ``story`` (`StoryLine.to_json` each)."""
    keys: dict[str, Any] = {"written_plan": result_label(written, nodes),
                            "dijkstra_plan": result_label(dijkstra, nodes),
                            "written_plan_estimated_s": written.total_s}
    full = {**s, **keys}
    if s.get("plan_measured_s") is not None:
        keys["written_plan_vs"] = _written_vs(full, _plans(full))
        full["written_plan_vs"] = keys["written_plan_vs"]
    keys["story"] = [ln.to_json() for ln in story(full)]
    return keys


def story_text(s: Mapping[str, Any]) -> list[str]:
    """The story lines of a summary that carries ``story`` (what `story_keys` added)."""
    return [str(d.get("text", "")) for d in s.get("story") or [] if isinstance(d, Mapping)]


def run_story(label: str, estimated_s: float | None, estimator: str,
              measured: Mapping[str, Any] | None) -> list[StoryLine]:
    """The story of a plan run on its own (``collage-farm run --report``'s figures in
    ``measured``: ``plan_measured_s``, ``singles_s``, ``additive_error``): the plan measured
    now, each toolchain it uses measured whole in the same run, the search's estimate of it."""
    m = measured or {}
    lines = []
    if m.get("plan_measured_s") is not None:
        lines.append(StoryLine(Section.PLAN, f"plan: {label}; measured "
                                             f"{ms(m['plan_measured_s'])} end to end now"))
    else:
        lines.append(StoryLine(Section.PLAN, f"plan: {label}; not measured end to end"))
    singles = m.get("singles_s") or {}
    if singles:
        lines.append(StoryLine(Section.SINGLES, (
            "each toolchain the plan uses, whole model, measured in the same interleaved run: "
            + ", ".join(f"{t} {ms(v)}" for t, v in sorted(
                singles.items(), key=lambda kv: kv[1] if kv[1] is not None else math.inf)))))
    line = (f"the search's estimate of this plan ({label}): {ms(estimated_s)}, from "
            f"{estimator} costs")
    if m.get("additive_error") is not None:
        line += f"; additive error {m['additive_error']:+.1%}"
    lines.append(StoryLine(Section.ESTIMATE, line))
    return lines
