"""The decision log (models.toml [server] decision_log): one JSON line per answered decision, appended by one writer
thread from a bounded queue, so that no request waits for the disk or fails with it (a full queue drops the line, a
failed write loses it: both counted on /metrics, each kind warned about once); rotated by size. Each line reaches the
file in one write() under the file's lock; a line a crash tore is cut off when the file is opened again, and
read_log never returns one."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import queue
import stat
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import orjson

from ...head.answer import Answer, systemone_answer
from ...head.schema import Question, render
from ..config.registry import DECISION_LOG_NAME, DecisionLogSpec
from ..service.decision import Decision
from .prometheus import Metrics

log = logging.getLogger("clef_bridge.decision_log")

QUEUE_LINES = 1024  # decisions waiting for the writer; beyond it a line is dropped and counted, never waited for
CLOSE_TIMEOUT_S = 10.0  # at shutdown, how long the lines still queued may take to reach the disk
CHUNK = 64 * 1024  # bytes read at a time, backwards from the end, looking for the last whole line


@dataclass(frozen=True)
class Entry:
    """One answered decision as decide() hands it over; its line is rendered in the writer's thread."""

    time: float  # when it was answered, seconds since the epoch
    request_id: str
    route: str
    tenant: str  # the name of the key that sent it, never the key
    decision: Decision
    shadows: tuple[Shadow, ...] = ()  # the model's shadows' scorings of the same request


@dataclass(frozen=True)
class Shadow:
    """A shadow model's scoring of an answered request: its Decision, or why there is none."""

    model: str
    outcome: str  # "answered", "dropped" (the server had requests under way) or "failed: <error type>"
    decision: Decision | None = None
    # per question, as head.answer.agreement finds it against the served model's answer: (agrees, largest |dp|)
    agreement: dict[str, tuple[bool, float]] = field(default_factory=dict)


def _question(answer: Answer, question: Question | None) -> dict[str, Any]:
    """One question's id, type, options (in the answer's order) and its answer with the probabilities."""
    body = systemone_answer(answer)
    out: dict[str, Any] = {"id": answer.id, "type": body.pop("type")}
    if question is not None:
        out["options"] = list(question.answer_keys)
    body.pop("legend", None)  # the levels' descriptions are request text, as instructions are: not logged
    return out | {"answer": body}


def _shadow(shadow: Shadow) -> dict[str, Any]:
    """A shadow's line part: its outcome and, answered, each question's answer, whether it agrees with the served
    model's and the largest |dp| between them."""
    out: dict[str, Any] = {"model": shadow.model, "outcome": shadow.outcome}
    if shadow.decision is not None:
        out["questions"] = []
        for a in shadow.decision.answers:
            agrees, dp = shadow.agreement[a.id]
            body = systemone_answer(a)
            body.pop("legend", None)
            out["questions"].append({"id": a.id, "answer": {k: v for k, v in body.items() if k != "type"},
                                     "agrees": agrees, "max_abs_dp": dp})
    return out


def record(entry: Entry, states: bool) -> dict[str, Any]:
    """A decision's line: what was asked and answered, by whom, how fast, and the state's sha256 (its text only where
    states is true; media by digest and size, never themselves)."""
    d = entry.decision
    text = render(d.state)
    data = text.encode("utf-8", "surrogatepass")
    questions = {q.id: q for q, _ in d.logits}
    line: dict[str, Any] = {
        "time": datetime.fromtimestamp(entry.time, timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z",
        "request_id": entry.request_id, "route": entry.route, "tenant": entry.tenant,
        "model": d.model, "requested": d.requested,
        "questions": [_question(a, questions.get(a.id)) for a in d.answers],
        "input_tokens": d.input_tokens, "reused_tokens": d.reused_tokens, "batch_size": d.batch_size,
        "timings_ms": {stage: round(s * 1e3, 3) for stage, s in d.timings.items()},
        "state_sha256": hashlib.sha256(data).hexdigest(), "state_bytes": len(data),
        "media": [{"kind": kind, "sha256": digest, "bytes": size} for kind, digest, size in d.media]}
    if d.shared:
        line["shared"] = d.shared
    if entry.shadows:
        line["shadows"] = [_shadow(s) for s in entry.shadows]
    if states:
        line["state"] = text
    return line


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """A decision log file's records, oldest first: whole lines only (a last line without its newline, torn by a
    crash mid-write, is left out), and only lines that are JSON objects."""
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                return
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                yield value


def log_files(path: Path) -> list[Path]:
    """A decision log's files, oldest first: its rotated files (path.N ... path.1), then the file itself."""
    prefix = path.name + "."
    rotated = [p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.name[len(prefix):].isdigit()]
    rotated.sort(key=lambda p: int(p.name[len(prefix):]), reverse=True)
    return rotated + ([path] if path.exists() else [])


def cut_torn_tail(fd: int) -> int:
    """Cut a last line left without its newline off the file (a crash mid-write); the bytes cut."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end, keep = size, 0
    while end > 0:
        start = max(0, end - CHUNK)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            keep = start + at + 1
            break
        end = start
    os.ftruncate(fd, keep)
    return size - keep


def _lock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:  # a file system without locks (some FUSE ones): one writer process still writes whole lines
        if exc.errno not in (errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
            raise


def _unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass  # nothing was locked (see _lock)


class LogFile:
    """The log file as the writer thread holds it: opened on first use (a torn last line cut off), reopened where
    another process rotated or moved it, rotated before a line would take it beyond max_mb. Every step runs under an
    exclusive lock on the file, so several server processes (Ray replicas) may share one path."""

    def __init__(self, spec: DecisionLogSpec, path: Path):
        self.spec = spec
        self.path = path  # the file, or a folder whose decisions.jsonl it is
        self.max_bytes = int(spec.max_mb * 1024 * 1024)
        self.fd: int | None = None
        self._check_tail = False

    @property
    def target(self) -> Path:
        return self.path / DECISION_LOG_NAME if self.path.is_dir() else self.path

    def append(self, line: bytes) -> None:
        """line (whole, with its newline) at the end of the file in one write(); a failed one leaves no part of it."""
        fd = self._locked()
        try:
            info = os.fstat(fd)
            regular = stat.S_ISREG(info.st_mode)  # a device (/dev/stdout) is never rotated nor cut
            if regular and info.st_size and info.st_size + len(line) > self.max_bytes:
                fd = self._rotate(fd)
                info = os.fstat(fd)
            self._write(fd, line, info.st_size if regular else None)
        finally:
            if self.fd is not None:  # the file written (a new one after rotating); a closed one holds no lock
                _unlock(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _write(self, fd: int, line: bytes, size: int | None) -> None:
        done = 0
        try:
            while done < len(line):  # one write(); another only where the kernel took part of the line
                done += os.write(fd, memoryview(line)[done:])
        except OSError:
            if done and size is not None:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    self.close()  # reopened for the next line, which cuts the torn tail first
            raise

    def _open(self) -> int:
        target = self.target
        if not target.parent.exists():
            os.makedirs(target.parent, exist_ok=True)
        try:
            regular = stat.S_ISREG(os.stat(target).st_mode)
        except FileNotFoundError:
            regular = True
        # a regular file is opened for reading too, to find a torn last line; a device, for writing only
        fd = os.open(target, (os.O_RDWR if regular else os.O_WRONLY) | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                     0o600)  # the log holds what tenants asked: private to the server's user
        self._check_tail = regular
        return fd

    def _current(self, fd: int) -> bool:
        """Whether fd is still the file at the path (not rotated away or removed by another process)."""
        try:
            there = os.stat(self.target)
        except FileNotFoundError:
            return False
        here = os.fstat(fd)
        return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)

    def _locked(self) -> int:
        """The file's descriptor, locked, and still the file at the path."""
        for attempt in range(3):  # another process may rotate it between our open and our lock
            if self.fd is None:
                self.fd = self._open()
            _lock(self.fd)
            if attempt == 2 or self._current(self.fd):
                break
            self.close()  # its lock goes with it
        if self._check_tail:
            cut = cut_torn_tail(self.fd)
            self._check_tail = False
            if cut:
                log.warning("decision log: cut a torn last line (%d bytes) off %s, left by a crash mid-write", cut,
                            str(self.target))
        return self.fd

    def _rotate(self, fd: int) -> int:
        """path -> path.1 -> ... -> path.keep (the oldest dropped) under the full file's lock; the new file, locked."""
        target = self.target
        if self.spec.keep == 0:
            os.unlink(target)
        else:
            for i in range(self.spec.keep - 1, 0, -1):
                try:
                    os.replace(f"{target}.{i}", f"{target}.{i + 1}")
                except FileNotFoundError:
                    pass
            os.replace(target, f"{target}.1")
        os.close(fd)  # its lock goes with it: a process waiting on it finds the file moved and reopens
        self.fd = None
        return self._locked()


class DecisionLog:
    """The writer: a bounded queue of Entries and one thread that appends each one's line to the file."""

    def __init__(self, spec: DecisionLogSpec, path: Path, metrics: Metrics, queue_lines: int = QUEUE_LINES):
        self.spec = spec
        self.file = LogFile(spec, path)
        self._metrics = metrics
        self._queue: queue.Queue[Entry | None] = queue.Queue(queue_lines)
        self._thread = threading.Thread(target=self._run, name="clef-decision-log", daemon=True)
        self._warned: set[str] = set()  # the kinds of failure warned about: one warning each
        self._warned_lock = threading.Lock()  # drops are seen on the event loop, write errors in the thread

    def start(self) -> None:
        self._thread.start()

    def submit(self, entry: Entry) -> None:
        """Queue a decision's line; with the queue full it is dropped (counted, warned about once), never waited for."""
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            self._metrics.log_dropped.inc()
            self._warn_once("queue_full", "decision log: %d decisions already wait for %s; more are dropped while "
                            "it is behind (clef_decision_log_dropped_total counts them), serving goes on",
                            self._queue.maxsize, str(self.file.path))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Write the lines queued, then stop the thread (it closes the file); blocks, so call it off the event loop."""
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():  # a hung disk: the thread is a daemon, the process exits without it
            log.warning("decision log: %s did not take the last %d lines within %g s; they are lost",
                        str(self.file.target), self._queue.qsize(), timeout_s)

    def _run(self) -> None:
        try:
            while (entry := self._queue.get()) is not None:
                self._write(entry)
        finally:
            self.file.close()

    def _write(self, entry: Entry) -> None:
        try:
            line = orjson.dumps(record(entry, self.spec.states)) + b"\n"
        except Exception as exc:  # noqa: BLE001 - a line that cannot be rendered is lost; the writer goes on
            self._failed("unrenderable", exc)
            return
        try:
            self.file.append(line)
        except OSError as exc:
            self._failed(errno.errorcode.get(exc.errno or 0, "OSError"), exc)
            return
        self._metrics.log_lines.inc()

    def _failed(self, reason: str, exc: BaseException) -> None:
        self._metrics.log_errors.labels(reason).inc()
        self._warn_once(reason, "decision log: cannot write to %s (%s); serving goes on, the decisions it cannot "
                        "write are lost and counted in clef_decision_log_errors_total{reason=\"%s\"} (warned once)",
                        str(self.file.target), f"{type(exc).__name__}: {exc}", reason)

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        with self._warned_lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        log.warning(message, *args)
