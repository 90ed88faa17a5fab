"""One run per output directory: no silent mixing of an earlier run's files with a new run's.

A run records what it wrote in ``.trl-sandbox-run.json`` (its state, then its files). A new run
refuses a directory that holds another run's results, finished or interrupted, unless told to
replace it (``--overwrite_output_dir``, TRL's old convention): then exactly the earlier run's
files are removed first, and nothing else in the directory is touched.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from trl_sandbox.sandbox import ConfigError

MANIFEST = ".trl-sandbox-run.json"
# What a run writes besides the model (from before manifests existed, these mark a run too).
ARTEFACTS = ("metrics.jsonl", "summary.json", "rewards.png")


class RunDirectory:
    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, check: bool = True) -> None:
        """``check=False`` (every process but the first of a multi-process run): claim nothing."""
        self.path = Path(path)
        self.overwrite = overwrite
        self.active = check
        self.earlier: set[str] = set()
        self._before: set[str] = set()
        if not check:
            return
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"output_dir {str(self.path)!r} is a file; give a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".trl-sandbox-probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"output_dir {str(self.path)!r} is not writable: {exc.strerror or exc}") from None
        self.earlier = self._earlier_files()
        if self.earlier and not overwrite:
            shown = ", ".join(sorted(self.earlier)[:6]) + (" ..." if len(self.earlier) > 6 else "")
            raise ConfigError(
                f"output_dir {str(self.path)!r} holds an earlier run ({shown}); pass another --output_dir, "
                "or --overwrite_output_dir true to replace that run"
            )

    def _earlier_files(self) -> set[str]:
        manifest = self.path / MANIFEST
        files: set[str] = {name for name in ARTEFACTS if (self.path / name).exists()}
        if manifest.exists():
            files.add(MANIFEST)
            try:
                data = json.loads(manifest.read_text())
                files.update(str(f) for f in data.get("files", []) if (self.path / str(f)).exists())
            except (OSError, ValueError, AttributeError):
                pass
        return files

    def claim(self) -> None:
        """Remove the earlier run being replaced, and mark the directory as this run's."""
        if not self.active:
            return
        for name in sorted(self.earlier, key=len, reverse=True):
            target = self.path / name
            if target.is_file() or target.is_symlink():
                target.unlink()
        self._before = set(os.listdir(self.path))
        self._write({"state": "running", "started": time.time(), "pid": os.getpid(), "files": []})

    def finish(self) -> None:
        """Record every file this run wrote, so that a later run can replace exactly them."""
        if not self.active:
            return
        written = sorted(set(os.listdir(self.path)) - self._before - {MANIFEST})
        self._write({"state": "finished", "finished": time.time(), "files": written})

    def _write(self, data: dict) -> None:
        (self.path / MANIFEST).write_text(json.dumps(data, indent=1))
