"""An operation-count curriculum: the config's training problems first, more operations from a later step on.

``--curriculum 31:2,3`` trains steps 1 to 30 on the ``--operations`` problems (the config's:
two operations) and steps 31 on on the training problems of two and three operations. The
run hands the trainer its tasks in the order the steps take them (``shuffle: false``): each
stage's problems in seeded shuffles, epoch after epoch, as many as its steps take.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .problems import load_split, of_operations


@dataclass(frozen=True)
class Curriculum:
    """From step ``from_step`` on, the training problems are those of ``operations``."""

    from_step: int
    operations: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Curriculum:
        """``STEP:OPS``, as ``31:2,3``; ``argparse.ArgumentTypeError`` saying what is wrong otherwise."""
        step, sep, operations = text.partition(":")
        try:
            if not sep:
                raise ValueError
            curriculum = cls(int(step), tuple(sorted({int(n) for n in operations.split(",")})))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected STEP:OPERATIONS, the first step of the second stage and its numbers of "
                "operations, such as 31:2,3"
            ) from None
        if curriculum.from_step < 2:
            raise argparse.ArgumentTypeError(f"{text!r}: the second stage starts at step 2 or later")
        return curriculum

    @property
    def name(self) -> str:
        """How the arm names it: ``ops2-3from31``."""
        return "ops" + "-".join(map(str, self.operations)) + f"from{self.from_step}"

    def check(self, steps: int) -> None:
        """``ValueError`` where the second stage would start after the run's last step."""
        if self.from_step > steps:
            raise ValueError(f"curriculum: its second stage starts at step {self.from_step}, after the last ({steps})")

    def order(self, first: list[dict], *, steps: int, batch_size: int, seed: int) -> list[dict]:
        """The training tasks of ``steps`` steps in the order they take them: ``first`` until ``from_step``."""
        self.check(steps)
        later = of_operations(load_split("train"), self.operations)
        first_stage = cycled(first, (self.from_step - 1) * batch_size, seed)
        return first_stage + cycled(later, (steps - self.from_step + 1) * batch_size, seed + 1)


def cycled(tasks: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` tasks: seeded shuffles of ``tasks``, one epoch after another, as the trainer shuffles."""
    if not tasks and n:
        raise ValueError("curriculum: a stage has no training problems")
    from agl_trainer.trainer import epoch_order

    out: list[dict] = []
    epoch = 0
    while len(out) < n:
        out += [tasks[i] for i in epoch_order(len(tasks), seed, epoch)][: n - len(out)]
        epoch += 1
    return out
