"""The progress line's clock: time elapsed in this process's training and an estimate of the time left."""
from __future__ import annotations


def progress_text(trainer, round_idx: int, now: float) -> str:
    """`` | 2m05s elapsed, ~4m10s left`` for the progress line: time since this process started training, and the
    rounds left at this session's mean pace (within what ``run.max_wall_s`` leaves); '' before that is known.
    ``trainer``: a NodeTrainer (its ``config`` and ``progress_origin``)."""
    origin = trainer.progress_origin
    if origin is None:
        return ""
    started, first_round = origin
    elapsed_s, done = now - started, round_idx + 1 - first_round
    rounds_left = trainer.config.diloco.rounds - (round_idx + 1)
    if done <= 0 or elapsed_s <= 0:
        return ""
    left_s = elapsed_s / done * rounds_left
    if trainer.config.run.max_wall_s is not None:
        left_s = min(left_s, max(0.0, trainer.config.run.max_wall_s - elapsed_s))
    return f" | {duration_text(elapsed_s)} elapsed, ~{duration_text(left_s)} left" if rounds_left else \
        f" | {duration_text(elapsed_s)} elapsed"


def duration_text(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: a duration at the precision a progress line needs."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
