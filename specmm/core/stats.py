"""`GenerationStats`: the one stats type of every specmm generation, whatever the modality.

Glossary:
- *target forward*: one batched call of the target model that produces tokens (a verify round, or a
  stepwise/AR step); a prompt prefill that only fills the cache is not one.
- *row forwards*: target forwards summed over the rows that took part in them.
- `mean_accepted`: tokens committed per target forward per row, bonus token included
  (1.0 for plain decoding). It is the only definition in the library.

Modality packages add their own counters as typed extras (`image`, `diffusion`, `continuous`,
`reasoning`, `caption`) instead of defining their own stats classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class ImageExtras:
    """Image AR: what a relaxed acceptance rule moved, and the image shape of each row."""

    tokens_per_row: int = 0  # image tokens of one image (all rows alike)


@dataclass
class ContinuousExtras:
    """Continuous-token AR (CSpD): drafts tested against the target and the residual sampler's work.

    `accepted` equals the parent's `accepted_drafts`; it sits beside `drafted` so the rate reads off one object.
    Plain AR (`sample_ar`) fills zeros.
    """

    drafted: int = 0  # drafted tokens that were verified (inside the image)
    accepted: int = 0  # of which accepted
    residual_proposals: int = 0  # candidates drawn by the residual sampler
    fallbacks: int = 0  # residual draws that hit max_proposals and fell back to a plain target sample

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(1, self.drafted)


@dataclass
class DiffusionExtras:
    """Diffusion LMs: a forward may run several candidate states per row, and some forwards refresh a cache.

    The parent's `target_forwards` counts every batched model call (cache refreshes and SSD's seeding
    forward included); `accepted_histogram[n]` counts row-iterations that committed n + 1 tokens.
    """

    full_forwards: int = 0  # uncached forwards (cache refreshes when a cache is on)
    forward_rows: int = 0  # sequences processed over all forwards (candidate states included)


@dataclass
class ReasoningExtras:
    """Step-level speculation: steps, who wrote them and what judging cost.

    The parent's `target_forwards` counts every target call (generation, judging, inner speculation), so
    `mean_accepted` is committed tokens per target forward per row. Its `accepted_histogram` stays empty:
    steps, not token rounds, are the unit of acceptance here.
    """

    steps: int = 0
    draft_steps: int = 0  # steps kept from the draft (checked and kept, or unchecked under draft-only)
    target_steps: int = 0  # steps the target wrote (regenerated, or target-only)
    checked_steps: int = 0  # draft steps a policy decided on (0 when nothing is checked)
    draft_tokens: int = 0  # committed tokens written by the draft
    discarded_draft_tokens: int = 0  # draft tokens of rejected steps
    judge_forwards: int = 0  # batched target forwards that judged draft steps
    judge_tokens: int = 0  # tokens those forwards ran (pending tail, draft step, judge suffix)

    @property
    def step_acceptance(self) -> float | None:
        """Kept share of checked draft steps (None when none was checked)."""
        return self.draft_steps / self.checked_steps if self.checked_steps else None


@dataclass
class CaptionExtras:
    """Captioning jobs: items handled by one call."""

    captioned: int = 0  # images captioned by this call
    skipped: int = 0  # images already in the output (resume)
    errors: int = 0  # unreadable images written as error lines by this call


EXTRAS = {"image": ImageExtras, "continuous": ContinuousExtras, "diffusion": DiffusionExtras,
          "reasoning": ReasoningExtras, "caption": CaptionExtras}


@dataclass
class GenerationStats:
    """Honest counters: forwards are batched calls; `mean_accepted` is tokens per target forward per row."""

    target_forwards: int = 0  # batched target forwards that produced tokens (prompt prefill not counted)
    draft_forwards: int = 0  # drafter forwards (batched), prefill included
    new_tokens: int = 0  # over all rows
    wall_time_s: float = 0.0  # device-synchronised, prefill included
    round_time_split: dict[str, float] = field(default_factory=dict)  # seconds per phase, when profiled
    compile_time_s: float = 0.0  # first calls of new compiled shapes inside this generation (included in wall time)
    new_tokens_per_row: list[int] = field(default_factory=list)
    target_forwards_per_row: list[int] = field(default_factory=list)  # target forwards each row took part in
    accepted_histogram: list[int] = field(default_factory=list)  # [n]: row-rounds that accepted n drafts
    moved_mass: float = 0.0  # TV mass a relaxed rule moved onto accepted drafts, summed over them (0 if exact)
    image: ImageExtras | None = None
    continuous: ContinuousExtras | None = None
    diffusion: DiffusionExtras | None = None
    reasoning: ReasoningExtras | None = None
    caption: CaptionExtras | None = None

    @property
    def row_forwards(self) -> int:
        """Target forwards summed over the rows that took part in them."""
        return sum(self.target_forwards_per_row)

    @property
    def mean_accepted(self) -> float:
        """Tokens committed per target forward and row, bonus token included (1.0 for plain decoding)."""
        return self.new_tokens / max(self.row_forwards, 1)

    @property
    def mean_accepted_per_row(self) -> list[float]:
        return [n / max(f, 1) for n, f in zip(self.new_tokens_per_row, self.target_forwards_per_row)]

    @property
    def accepted_drafts(self) -> int:
        """Draft tokens accepted over all row-rounds (bonus tokens not included)."""
        return sum(n * count for n, count in enumerate(self.accepted_histogram))

    @property
    def moved_mass_per_accepted_draft(self) -> float:
        return self.moved_mass / self.accepted_drafts if self.accepted_drafts else 0.0

    @property
    def step_compression(self) -> float:
        """Same as `mean_accepted`: tokens per target forward per row (the image papers' name)."""
        return self.mean_accepted

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def add(self, other: GenerationStats) -> GenerationStats:
        """Accumulate `other` (a later batch of the same job) into self; rows are appended."""
        self.target_forwards += other.target_forwards
        self.draft_forwards += other.draft_forwards
        self.new_tokens += other.new_tokens
        self.wall_time_s += other.wall_time_s
        self.new_tokens_per_row += other.new_tokens_per_row
        self.target_forwards_per_row += other.target_forwards_per_row
        width = max(len(self.accepted_histogram), len(other.accepted_histogram))
        self.accepted_histogram = [
            (self.accepted_histogram[i] if i < len(self.accepted_histogram) else 0)
            + (other.accepted_histogram[i] if i < len(other.accepted_histogram) else 0) for i in range(width)]
        self.moved_mass += other.moved_mass
        self.compile_time_s += other.compile_time_s
        for phase, seconds in other.round_time_split.items():
            self.round_time_split[phase] = self.round_time_split.get(phase, 0.0) + seconds
        for name in EXTRAS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is None:
                continue
            if mine is None:
                mine = EXTRAS[name]()
                setattr(self, name, mine)
            for f in fields(mine):
                value = getattr(theirs, f.name)
                setattr(mine, f.name, value if f.name == "tokens_per_row" else getattr(mine, f.name) + value)
        return self

    def summary(self) -> dict:
        """A flat JSON-ready dict of the counters and the derived figures."""
        out = {"target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
               "new_tokens": self.new_tokens, "row_forwards": self.row_forwards,
               "mean_accepted": self.mean_accepted, "wall_time_s": self.wall_time_s,
               "accepted_histogram": list(self.accepted_histogram), "moved_mass": self.moved_mass,
               "moved_mass_per_accepted_draft": self.moved_mass_per_accepted_draft,
               "compile_time_s": self.compile_time_s, "round_time_split": dict(self.round_time_split)}
        for name in EXTRAS:
            extra = getattr(self, name)
            if extra is not None:
                out[name] = _extra_summary(extra)
        return out


def _extra_summary(extra) -> dict:
    """An extra's fields, then its derived figures (its properties, e.g. `acceptance_rate`)."""
    out = {f.name: getattr(extra, f.name) for f in fields(extra)}
    for name, value in vars(type(extra)).items():
        if isinstance(value, property):
            out[name] = getattr(extra, name)
    return out
