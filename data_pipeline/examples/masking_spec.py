"""What masked-LM masking does, as a validated spec: no TensorFlow.

The one place a masking setting is understood: the pipeline applies it
(data_pipeline.examples.masking, data_pipeline.examples.selection), the ablation's planner asks it for
the predictions a run makes (expected_predictions) and its report for what the
setting is (columns, describe, from_record, mean_ratio).

MaskingSpec (ratio, count strategy, mask/random/keep split, whole-word and span
units, the ratio schedule, corruption apart from prediction) and bert_masking,
the paper's. data_pipeline/examples/masking.py holds the tf.data ops that apply a spec and
documents what each field does; the spec is apart so that a config, the ablation's
planning and its report judge masking settings without importing TensorFlow.
"""

import dataclasses
import math
import numbers

import numpy as np

_STRATEGIES = ("fixed", "bernoulli")
SCHEDULES = ("constant", "linear", "cosine", "polynomial", "warmup_decay", "piecewise")
# An explicit max_predictions_per_seq with the bernoulli strategy may be smaller
# than max_seq_length only if a sequence needs more predictions with at most
# this probability: < 1 expected overflow over BERT's 256 x 1M training sequences.
_BERNOULLI_OVERFLOW_PROB = 1e-9


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
  """What to mask; validated on construction (ValueError naming the field).

  Attributes:
    ratio: fraction of maskable tokens to predict, in (0, 1).
    mask_prob: probability that a prediction is replaced by [MASK].
    random_prob: probability that it is replaced by a random non-special id.
    keep_prob: probability that it is left unchanged (the three sum to 1).
    strategy: "fixed": exactly max(1, round(ratio * num_maskable)) predicted
      tokens per sequence (whole-word / span masking may fall short when no
      remaining word fits the budget); "bernoulli": every unit independently
      with probability `ratio`.
    whole_word: all pieces of a word are predicted together and share one
      mask/random/keep decision.
    span: SpanBERT span masking: spans of whole words with lengths from a
      geometric distribution truncated to [1, max_span_length] (renormalised,
      as SpanBERT does), one mask/random/keep decision per span.
    span_geometric_p: success probability of the span-length geometric.
    max_span_length: longest span, in words.
    max_predictions_per_seq: static size P of masked_lm_*; 0 derives it
      (see `max_predictions`).
    schedule: "constant" (always `ratio`), or "linear" / "cosine" from `ratio`
      at step 0 to `final_ratio` at the last step (see `ratio_at`).
    final_ratio: the ratio a schedule ends at, in (0, 1); must be 0 for
      "constant" (it would mean nothing there).
    schedule_power: the exponent of "polynomial" (1 is "linear"; must be 1 for
      every other schedule).
    schedule_warmup: the fraction of the run over which "warmup_decay" rises
      from final_ratio to ratio before decaying linearly back (0 otherwise).
    piecewise: "piecewise"'s later pieces, "START:RATIO,START:RATIO,..." with starts
      the fractions of the run, increasing in (0, 1): `ratio` until the first start,
      then each piece's ratio (mmBERT's 30% -> 15% -> 5% by phase: ratio 0.3,
      "0.767:0.15,0.967:0.05"); "" for every other schedule.
    predict_ratio: 0 (predict exactly the corrupted tokens, BERT), or the
      fraction of maskable tokens predicted (Wettig et al. 2023 section 5,
      prediction rate apart from the corruption rate `ratio`): above `ratio`
      the corrupted ones plus uncorrupted ones, below it a random subset of
      the corrupted ones. Token-level, constant-ratio masking only.
  """
  # No defaults: a run's values come from its config (experiments/configs/data.py);
  # bert_masking() below is the paper's masking, spelled out.
  ratio: float
  mask_prob: float
  random_prob: float
  keep_prob: float
  strategy: str
  whole_word: bool
  span: bool
  span_geometric_p: float
  max_span_length: int
  max_predictions_per_seq: int
  schedule: str
  final_ratio: float
  schedule_power: float
  schedule_warmup: float
  predict_ratio: float
  piecewise: str = ""  # (a default: records and configs from before it had none)

  def __post_init__(self):
    def number(name, low, high, low_open, high_open):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"masking.{name} must be a number, got {value!r}")
      too_low = value <= low if low_open else value < low
      too_high = value >= high if high_open else value > high
      if too_low or too_high or math.isnan(value):
        raise ValueError(
            f"masking.{name} must be in {'(' if low_open else '['}{low}, "
            f"{high}{')' if high_open else ']'}, got {value!r}")

    number("ratio", 0.0, 1.0, True, True)
    for name in ("mask_prob", "random_prob", "keep_prob"):
      number(name, 0.0, 1.0, False, False)
    total = self.mask_prob + self.random_prob + self.keep_prob
    if abs(total - 1.0) > 1e-6:
      raise ValueError(
          "masking.mask_prob + masking.random_prob + masking.keep_prob must "
          f"sum to 1, got {self.mask_prob} + {self.random_prob} + "
          f"{self.keep_prob} = {total}")
    if self.strategy not in _STRATEGIES:
      raise ValueError(
          f"masking.strategy must be one of {_STRATEGIES}, got {self.strategy!r}")
    for name in ("whole_word", "span"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(
            f"masking.{name} must be a bool, got {getattr(self, name)!r}")
    number("span_geometric_p", 0.0, 1.0, True, False)
    if self.schedule not in SCHEDULES:
      raise ValueError(f"masking.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
    if self.schedule == "constant":
      if self.final_ratio != 0.0:
        raise ValueError(
            f"masking.final_ratio={self.final_ratio!r} is used only by a 'linear' or 'cosine' "
            "masking.schedule; with 'constant' leave it 0")
    elif self.schedule != "piecewise":  # (piecewise: checked below)
      number("final_ratio", 0.0, 1.0, True, True)
    number("schedule_power", 0.0, 100.0, True, False)
    if self.schedule != "polynomial" and self.schedule_power != 1.0:
      raise ValueError(f"masking.schedule_power={self.schedule_power!r} is used only by "
                       "masking.schedule 'polynomial'; leave it 1")
    if self.schedule == "warmup_decay":
      number("schedule_warmup", 0.0, 1.0, True, True)
    elif self.schedule_warmup != 0.0:
      raise ValueError(f"masking.schedule_warmup={self.schedule_warmup!r} is used only by "
                       "masking.schedule 'warmup_decay'; leave it 0")
    if self.schedule == "piecewise":
      if self.final_ratio != 0.0:
        raise ValueError("masking.final_ratio is not read by schedule 'piecewise' (its "
                         "pieces end it); leave it 0")
      pieces = self.pieces()  # parsed and validated
      if not pieces:
        raise ValueError("masking.schedule 'piecewise' needs masking.piecewise, e.g. "
                         "'0.767:0.15,0.967:0.05'")
    elif self.piecewise:
      raise ValueError(f"masking.piecewise={self.piecewise!r} is used only by "
                       "masking.schedule 'piecewise'; leave it ''")
    if self.predict_ratio != 0.0:
      number("predict_ratio", 0.0, 1.0, True, True)
      if self.whole_word or self.span or self.schedule != "constant":
        raise ValueError("masking.predict_ratio applies to token-level masking at a constant "
                         "ratio; set whole_word/span False and schedule 'constant', or "
                         "predict_ratio 0")
    for name, low in (("max_span_length", 1), ("max_predictions_per_seq", 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            f"masking.{name} must be an int >= {low}, got {value!r}")

  @classmethod
  def from_config(cls, masking_config, max_seq_length: int) -> "MaskingSpec":
    """Builds a spec from `config.data.masking` and validates it for `max_seq_length`.

    Every field must be present in the config (defaults live in the config,
    not here), but `piecewise`, which configs from before it lack (read as "");
    an explicit max_predictions_per_seq too small for the ratio is rejected now,
    before any data is read.
    """
    kwargs = {}
    for field in dataclasses.fields(cls):
      try:
        kwargs[field.name] = masking_config[field.name]
      except (KeyError, AttributeError):
        if field.default is not dataclasses.MISSING:
          continue
        raise ValueError(
            f"masking config is missing the field {field.name!r}") from None
    spec = cls(**kwargs)
    spec.max_predictions(max_seq_length)
    return spec

  def pieces(self) -> list[tuple[float, float]]:
    """masking.piecewise as [(start fraction, ratio)] (ValueError naming a bad piece)."""
    out = []
    for piece in filter(None, self.piecewise.replace(" ", "").split(",")):
      try:
        start, ratio = (float(x) for x in piece.split(":"))
      except ValueError:
        raise ValueError(f"masking.piecewise piece {piece!r}: want START:RATIO") from None
      previous = out[-1][0] if out else 0.0
      if not previous < start < 1.0 or not 0.0 < ratio < 1.0:
        raise ValueError(f"masking.piecewise piece {piece!r}: starts must increase in (0, 1) "
                         "and each ratio lie in (0, 1)")
      out.append((start, ratio))
    return out

  @property
  def max_ratio(self) -> float:
    """The largest fraction predicted at any step (static shapes are sized for it; with
    predict_ratio that is the prediction rate, whatever the corruption rate)."""
    if self.predict_ratio:
      return self.predict_ratio
    if self.schedule == "piecewise":
      return max([self.ratio] + [r for _, r in self.pieces()])
    return self.ratio if self.schedule == "constant" else max(self.ratio, self.final_ratio)

  def uncorrupted_fraction(self) -> float:
    """Expected fraction of predictions whose input token is left unchanged.

    Predictions beyond the corrupted ones ((predict_ratio - ratio) / predict_ratio)
    plus the corrupted ones kept by keep_prob; BERT's 80/10/10 gives 0.1. With
    predict_ratio below ratio every prediction is corrupted: keep_prob.
    """
    predicted = self.predict_ratio or self.ratio
    corrupted = min(self.ratio, predicted)  # of the predictions
    return (predicted - corrupted) / predicted + corrupted / predicted * self.keep_prob

  @property
  def end_ratio(self) -> float:
    """The ratio in force at the end of training."""
    if self.schedule == "piecewise":
      return self.pieces()[-1][1]
    return self.ratio if self.schedule == "constant" else self.final_ratio

  def ratio_at(self, step: int, total_steps: int) -> float:
    """The masking ratio of the batch of training step `step` (0-based) of `total_steps`.

    progress = min(step / total_steps, 1); "linear": ratio + (final - ratio) *
    progress; "cosine": final + (ratio - final) * (1 + cos(pi * progress)) / 2
    (Yang et al. 2023's linear and cosine decay); "polynomial": weight
    (1 - progress) ** schedule_power; "warmup_decay": up from final to ratio
    over schedule_warmup of the run, then linearly down. A pure function of the step,
    so a resumed run masks exactly as the uninterrupted one.
    """
    if self.schedule == "constant":
      return self.ratio
    if isinstance(total_steps, bool) or not isinstance(total_steps, numbers.Integral) \
        or total_steps < 1:
      raise ValueError(f"masking.schedule={self.schedule!r} needs the run's total_steps "
                       f"(a positive int), got {total_steps!r}")
    progress = min(max(step, 0) / total_steps, 1.0)
    if self.schedule == "piecewise":
      return next((r for start, r in reversed(self.pieces()) if progress >= start), self.ratio)
    if self.schedule == "linear":
      weight = 1.0 - progress
    elif self.schedule == "polynomial":
      weight = (1.0 - progress) ** self.schedule_power
    elif self.schedule == "warmup_decay":
      # Up from final_ratio to ratio over the warm-up, then linearly back down.
      w = self.schedule_warmup
      weight = progress / w if progress < w else (1.0 - progress) / (1.0 - w)
    else:
      weight = 0.5 * (1.0 + math.cos(math.pi * progress))
    # A weighted sum, so both ends are exactly `ratio` and `final_ratio`.
    return weight * self.ratio + (1.0 - weight) * self.final_ratio

  def at_ratio(self, ratio: float) -> "MaskingSpec":
    """This spec with a constant `ratio` (the other knobs and P kept)."""
    return dataclasses.replace(self, ratio=ratio, schedule="constant", final_ratio=0.0,
                               schedule_power=1.0, schedule_warmup=0.0, piecewise="")

  def max_predictions(self, max_seq_length: int) -> int:
    """The static number P of masked_lm_* slots for sequences of this length.

    Sized for `max_ratio`, the largest ratio a schedule reaches.

    Derived (max_predictions_per_seq == 0): "fixed" -> ceil(ratio * L), which
    no sequence can exceed because at most L tokens are maskable (BERT's 20 at
    L=128, ratio 0.15); "bernoulli" -> L, so a draw is never truncated.
    An explicit value must hold every possible "fixed" count,
    max(1, round(ratio * L)), and for "bernoulli" the chance that a sequence
    draws more than P tokens (binomial tail over L tokens) must be
    <= 1e-9; anything smaller is a ValueError naming max_predictions_per_seq.
    That tail is exact for token-level and span Bernoulli masking; whole-word
    Bernoulli counts vary more (words are drawn, not tokens), so keep P
    derived there: with an explicit P, a draw over P would keep only the
    lowest-scoring whole words that fit.
    """
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) \
        or max_seq_length < 1:
      raise ValueError(
          f"max_seq_length must be a positive int, got {max_seq_length!r}")
    explicit = self.max_predictions_per_seq
    if self.strategy == "fixed":
      if not explicit:
        # The epsilon keeps float noise (0.1 * 30 = 3.0000000000000004) from adding a slot.
        return max(1, math.ceil(self.max_ratio * max_seq_length - 1e-9))
      needed = max(1, round(self.max_ratio * max_seq_length))
      if explicit < needed:
        raise ValueError(
            f"masking.max_predictions_per_seq={explicit} is too small: "
            f"ratio {self.max_ratio} at max_seq_length {max_seq_length} needs up to "
            f"{needed} predictions (set 0 to derive it)")
      return explicit
    if not explicit:
      return max_seq_length
    tail = _binomial_tail(max_seq_length, self.max_ratio, explicit)
    if tail > _BERNOULLI_OVERFLOW_PROB:
      raise ValueError(
          f"masking.max_predictions_per_seq={explicit} is too small for "
          f"strategy 'bernoulli' with ratio {self.max_ratio} at max_seq_length "
          f"{max_seq_length}: P(more than {explicit} masked) = {tail:.2e} > "
          f"{_BERNOULLI_OVERFLOW_PROB} (set 0 to derive it)")
    return explicit


  # --- what a setting means, for the ablation's planner and its report ---

  @classmethod
  def from_record(cls, masking_config: dict) -> "MaskingSpec":
    """The spec a run recorded (config.data.masking as a dict); fields the record
    predates keep BERT's values (no schedule, no prediction rate)."""
    return dataclasses.replace(bert_masking(), **{
        f.name: masking_config[f.name] for f in dataclasses.fields(cls)
        if f.name in masking_config})

  def mean_ratio(self, total_steps: int) -> float:
    """The ratio averaged over every step of a run (where a schedule sits on a ratio axis)."""
    return float(np.mean([self.ratio_at(s, total_steps) for s in range(total_steps)]))

  def expected_predictions(self, max_seq_length: int, total_steps: int,
                           special_tokens: int = 3) -> float:
    """Predictions per sequence of `max_seq_length` tokens, `special_tokens` of them never
    predicted ([CLS] A [SEP] B [SEP]), averaged over a run's schedule (sampled at 1,000
    steps at most): at predict_ratio where it sets the predictions apart from the
    corruption, within the static slots."""
    stride = max(1, total_steps // 1000)
    ratios = [self.ratio_at(s, total_steps) for s in range(0, total_steps, stride)]
    predicted = self.predict_ratio or float(np.mean(ratios))
    slots = self.max_predictions(max_seq_length)
    return float(min(slots, max(1, round(predicted * (max_seq_length - special_tokens)))))

  def columns(self) -> dict[str, str]:
    """What the setting is, as the report's columns: ratio, schedule, mix, unit, and the
    expected share of predictions whose input token is unchanged."""
    mix = "/".join(f"{round(100 * p)}" for p in (self.mask_prob, self.random_prob,
                                                  self.keep_prob))
    schedule = (self.schedule if self.schedule == "constant"
                else f"{self.schedule} {self.ratio:.2f}->{self.final_ratio:.2f}")
    if self.schedule == "piecewise":
      schedule = "piecewise " + "->".join(
          [f"{self.ratio:.2f}"] + [f"{r:.2f}@{start:g}" for start, r in self.pieces()])
    unit = "span" if self.span else "whole word" if self.whole_word else "token"
    if self.predict_ratio:
      mix += f", predict {self.predict_ratio:.2f}"  # Wettig et al.'s prediction rate
    return {"ratio": f"{self.ratio:.2f}", "schedule": schedule, "mix": mix, "unit": unit,
            "uncorrupted_fraction": round(self.uncorrupted_fraction(), 4)}

  def describe(self) -> str:
    """One line: 'ratio 0.15 constant, 80/10/10 mask/random/keep, token units, strategy fixed'."""
    c = self.columns()
    return (f"ratio {c['ratio']} {c['schedule']}, {c['mix']} mask/random/keep, {c['unit']} "
            f"units, strategy {self.strategy}")


def bert_masking(ratio: float = 0.15, **changes) -> MaskingSpec:
  """BERT's masking (Devlin et al. 2019) at `ratio`: 80% [MASK], 10% random, 10% kept,
  a fixed number of token-level predictions per sequence, no schedule; `changes`
  replace fields. The held-out set is always masked this way, whatever a run trains with."""
  spec = MaskingSpec(ratio=ratio, mask_prob=0.8, random_prob=0.1, keep_prob=0.1,
                     strategy="fixed", whole_word=False, span=False, span_geometric_p=0.2,
                     max_span_length=10, max_predictions_per_seq=0, schedule="constant",
                     final_ratio=0.0, schedule_power=1.0, schedule_warmup=0.0, predict_ratio=0.0)
  return dataclasses.replace(spec, **changes)


def _binomial_tail(n: int, p: float, k: int) -> float:
  """P(Binomial(n, p) > k), summed in log space so large n does not underflow."""
  log_p, log_q = math.log(p), math.log1p(-p)
  total = 0.0
  for i in range(k + 1, n + 1):
    log_term = (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * log_p + (n - i) * log_q)
    total += math.exp(log_term)
  return total
