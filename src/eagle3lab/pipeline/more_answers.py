"""`python -m eagle3lab.pipeline.more_answers NAME`: one cell of issue 66's regeneration, dvc.yaml's `more_answers`
stage (one cell per entry of params.yaml's `answers.more.cells`): the target answers a slice of the prompts that grow
the mixture (`pipeline.more_mixture`) into answers_more/NAME.jsonl, committed, with its record in
metrics/answers_more/NAME.json. The cells are the `answers` stage's in every other way (`pipeline.answers`: one chunk
of `answers.chunk_size` prompts, the `regenerate` section's settings, resumed after a kill).
"""

from __future__ import annotations

import sys

from eagle3lab.io import command
from eagle3lab.pipeline import more_mixture
from eagle3lab.pipeline.answers import Family, cell_command

MORE = Family(
    "more_answers", more_mixture.SECTION, more_mixture.FOLDER, ("train",), "more_mixture", "answers_more",
    "metrics/answers_more",
)  # fmt: skip


@command("python -m eagle3lab.pipeline.more_answers")
def main(argv: list[str] | None = None) -> int:
    return cell_command(MORE, __doc__, argv, "more-000")


if __name__ == "__main__":
    sys.exit(main())
