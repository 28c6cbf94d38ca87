"""Checkpoint files on disk: atomic writes, sha256 manifests, verification, latest-valid lookup, rotation.

Nothing here is a collective; `ddpkit.checkpoint.api` decides which rank calls what. A checkpoint is
the pair `ckpt-{step:08d}.pt` + `ckpt-{step:08d}.json`, or for a sharded (FSDP) model the
torch.distributed.checkpoint directory `ckpt-{step:08d}.dcp/` + `ckpt-{step:08d}.json`; it is valid
when the manifest parses and every file has the size and sha256 the manifest records. The
manifest is renamed into place last, so a save that dies half-way leaves no valid-looking
checkpoint behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = [
    "FORMAT",
    "CheckpointError",
    "CheckpointWarning",
    "checkpoint_path",
    "sharded_path",
    "manifest_path",
    "file_digest",
    "list_checkpoints",
    "verify_checkpoint",
    "latest_checkpoint",
    "write_checkpoint_files",
    "write_checkpoint_dir",
    "rotate",
]

FORMAT = "ddpkit-checkpoint/1"
"""Written into every manifest and payload; a reader refuses other formats."""

_NAME = re.compile(r"^ckpt-(\d{8,})\.(pt|json|dcp)$")
_TMP_PREFIX = ".ckpt-"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, found, verified or loaded; the message names the file and the fix."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (failed verification) or removed; the run continues."""


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of optimizer step `step` lives inside `directory`."""
    return Path(directory) / f"ckpt-{step:08d}.pt"


def sharded_path(directory: str | os.PathLike, step: int) -> Path:
    """Where the torch.distributed.checkpoint directory of step `step` of a sharded model lives."""
    return Path(directory) / f"ckpt-{step:08d}.dcp"


def manifest_path(path: str | os.PathLike) -> Path:
    """The JSON manifest beside checkpoint file `path`."""
    return Path(path).with_suffix(".json")


def _step_of(path: Path) -> int:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else -1


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoints (.pt files or .dcp directories) found in `directory`, valid or not, oldest step first.

    A manifest whose checkpoint is missing is listed too (as .pt), so that verification reports it.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    steps = {_step_of(p) for p in directory.iterdir() if _NAME.match(p.name)}
    return [sharded_path(directory, s) if sharded_path(directory, s).is_dir() else checkpoint_path(directory, s)
            for s in sorted(steps)]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: str | os.PathLike) -> dict[str, Any]:
    """{"size", "sha256"} of one file, as a manifest records it."""
    path = Path(path)
    return {"size": path.stat().st_size, "sha256": _sha256_file(path)}


def _verify_file(path: Path, size: Any, sha256: Any) -> None:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing although the manifest lists it")
    found = path.stat().st_size
    if found != size:
        raise CheckpointError(f"checkpoint {path} is {found} bytes but its manifest records {size} (truncated or "
                              "overwritten)")
    try:
        digest = _sha256_file(path)
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({e.strerror or e})") from None
    if digest != sha256:
        raise CheckpointError(
            f"checkpoint {path} fails its sha256 check ({digest[:16]}... != manifest's {str(sha256)[:16]}...): "
            "the file is corrupt")


def verify_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Check `path` against its manifest (format, size, sha256); return the manifest.

    Raises CheckpointError, in one line naming the file, when the manifest is missing or
    unreadable, or the file is missing, truncated or altered. Reads the whole file once.
    """
    path = Path(path)
    mpath = manifest_path(path)
    if not mpath.is_file():
        raise CheckpointError(
            f"checkpoint {path} has no manifest {mpath.name} (its save did not finish), so it cannot be verified"
        )
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"manifest {mpath} is unreadable ({type(e).__name__}: {e}); the save did not finish") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"manifest {mpath} has format {found!r}, not {FORMAT!r}; it was not written by ddpkit")
    files = manifest.get("files")
    if isinstance(files, dict):  # a sharded checkpoint: a directory of files
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path} is missing although its manifest {mpath.name} exists")
        for name, entry in sorted(files.items()):
            _verify_file(path / name, entry.get("size"), entry.get("sha256"))
        return manifest
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is missing although its manifest {mpath.name} exists")
    _verify_file(path, manifest.get("size"), manifest.get("sha256"))
    return manifest


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest checkpoint in `directory` that passes verification; None when there is none.

    Each newer checkpoint that fails verification is skipped with a CheckpointWarning naming it.
    Not a collective (every rank may call it; `ddpkit.load_checkpoint` has rank 0 do it once).
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            warnings.warn(f"{e}; skipped it for the newest older valid checkpoint, if any", CheckpointWarning,
                          stacklevel=2)
            continue
        return path
    return None


def _fsync_dir(directory: Path) -> None:
    """Make the renames inside `directory` durable (a crash right after still finds the new names)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # platforms without directory handles (Windows)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename itself is still atomic
    finally:
        os.close(fd)


def _write_tmp(directory: Path, name: str, write: Callable[[IO[bytes]], None]) -> Path:
    """Write a hidden temporary file in `directory` (same filesystem, so rename is atomic), fsynced."""
    tmp = directory / f"{_TMP_PREFIX}{name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def write_checkpoint_files(directory: str | os.PathLike, step: int, write: Callable[[IO[bytes]], None],
                           manifest: dict[str, Any]) -> Path:
    """Atomically write checkpoint `step`: payload via `write(file)`, then its manifest.

    Order: payload to a temporary file, fsync, sha256; manifest to a temporary file, fsync; rename
    payload, rename manifest, fsync the directory. Any failure before the renames removes the
    temporary files and leaves every existing checkpoint as it was.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, step)
    tmp = _write_tmp(directory, path.name, write)
    tmp_manifest = None
    try:
        full = {"format": FORMAT, "file": path.name, "sha256": _sha256_file(tmp), "size": tmp.stat().st_size,
                **manifest}
        text = json.dumps(full, indent=1, sort_keys=True).encode()
        tmp_manifest = _write_tmp(directory, manifest_path(path).name, lambda f: f.write(text))
        os.replace(tmp, path)
        os.replace(tmp_manifest, manifest_path(path))
    except BaseException:
        for leftover in (tmp, tmp_manifest):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    leftover.unlink()
        raise
    _fsync_dir(directory)
    return path


def write_checkpoint_dir(directory: str | os.PathLike, step: int, tmp: Path, files: dict[str, dict[str, Any]],
                         manifest: dict[str, Any]) -> Path:
    """Atomically publish the sharded checkpoint `step` that every rank wrote into `tmp`.

    `files` maps each file inside `tmp` to its file_digest. Order: manifest to a temporary file,
    fsync; rename the directory, rename the manifest, fsync the directory. On failure before the
    renames, `tmp` is left for `rotate` to clean and every existing checkpoint stays as it was.
    """
    directory = Path(directory)
    path = sharded_path(directory, step)
    full = {"format": FORMAT, "file": path.name, "files": files, **manifest}
    text = json.dumps(full, indent=1, sort_keys=True).encode()
    _fsync_dir(tmp)
    tmp_manifest = _write_tmp(directory, manifest_path(path).name, lambda f: f.write(text))
    try:
        _remove(path)  # a same-step directory left by an earlier attempt (os.replace cannot replace a directory)
        os.replace(tmp, path)
        os.replace(tmp_manifest, manifest_path(path))
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_manifest.unlink()
        raise
    _fsync_dir(directory)
    return path


def _remove(path: Path) -> None:
    import shutil

    # Manifest first: a checkpoint removed half-way reads as unverifiable, never as valid.
    for p in (manifest_path(path), path, path.with_suffix(".dcp"), path.with_suffix(".pt")):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def rotate(directory: str | os.PathLike, current: Path, keep_last: int | None) -> list[Path]:
    """Remove old checkpoints after `current` was written; return the removed .pt paths.

    Keeps `current` and the `keep_last - 1` newest checkpoints before it (all when keep_last is
    None). A directory holds one run's timeline, so checkpoints with a step after `current` (left
    by a run that was rolled back to an older checkpoint) are removed with a warning: otherwise a
    later restart would resume from the abandoned future. Also removes temporary files of saves
    that were killed mid-write.
    """
    directory = Path(directory)
    step = _step_of(current)
    paths = list_checkpoints(directory)
    newer = [p for p in paths if _step_of(p) > step]
    older = [p for p in paths if _step_of(p) < step]
    doomed = list(newer)
    if keep_last is not None:
        doomed += older[: max(0, len(older) - (keep_last - 1))]
    if newer:
        warnings.warn(
            f"removed checkpoints {[p.name for p in newer]} in {directory}: they are past step {step} "
            "that was just saved, i.e. from a run that was rolled back (use a new directory to keep them)",
            CheckpointWarning, stacklevel=3,
        )
    for p in doomed:
        _remove(p)
    for stale in directory.glob(f"{_TMP_PREFIX}*.tmp-*"):
        if stale.is_dir():
            import shutil

            shutil.rmtree(stale, ignore_errors=True)
        with contextlib.suppress(OSError):
            stale.unlink()
    _fsync_dir(directory)
    return doomed
