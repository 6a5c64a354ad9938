"""Progress of a run: a tqdm bar plus the OUT-stem.progress.json sidecar that `eagle3lab monitor` reads."""

from __future__ import annotations

import os
import time

from eagle3lab.io import write_json
from eagle3lab.regen.files import RunFiles


class Progress:
    """tqdm bar plus the sidecar file `eagle3lab monitor` reads from another process."""

    def __init__(self, files: RunFiles, total: int, done: int, settings: dict, enabled: bool = True):
        from tqdm import tqdm

        self.files, self.settings = files, settings
        self.total, self.done_at_start = total, done
        self.started = time.time()
        self.tokens = self.records = self.errors = self.skipped = 0
        self._last_write = self._last_sample = 0.0
        self.timeline: list[list[float]] = []  # [seconds since start, tokens, records], every few seconds
        self.bar = tqdm(total=total, initial=done, unit="rec", desc="regen", disable=not enabled, dynamic_ncols=True)
        self.write("running", force=True)

    def add_tokens(self, n: int) -> None:
        self.tokens += n
        self.write("running")

    def record(self, kind: str) -> None:
        self.records += 1
        if kind == "error":
            self.errors += 1
        elif kind == "skipped":
            self.skipped += 1
        self.bar.update(1)
        self.write("running")

    def rate(self) -> float:
        return self.tokens / max(time.time() - self.started, 1e-9)

    def write(self, status: str, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_write < 1.0:
            return
        self._last_write = now
        if now - self._last_sample >= 5.0 or status != "running":
            self._last_sample = now
            self.timeline.append([round(now - self.started, 2), self.tokens, self.records])
        self.bar.set_postfix_str(f"{self.rate():.1f} tok/s, err {self.errors}, skip {self.skipped}", refresh=False)
        write_json(
            self.files.progress,
            {
                "status": status,
                "pid": os.getpid(),
                "input_total": self.total,
                "done_at_start": self.done_at_start,
                "records_this_run": self.records,
                "errors_this_run": self.errors,
                "skipped_this_run": self.skipped,
                "tokens_this_run": self.tokens,
                "started_at": self.started,
                "updated_at": now,
                **self.settings,
                "timeline": self.timeline,
            },
        )

    def close(self, status: str) -> None:
        self.write(status, force=True)
        self.bar.close()
