"""Progress of a long stage on stderr: what it is doing and how far, on a terminal and in a log.

    with stage_progress("resume"):                  # the CLI wraps overfit, pilot, resume, fit, verify, train, sweep
        head("reference run")                       # the part of the stage running now (clears what it did)
        note("update 6/12, loss 0.41", done=6, total=12)   # from anywhere in the process (the loop does)
        say("run 1/3 → 2026… completed")              # a line that stays, above the live line

On a terminal one live line (one row: its middle shortened to the terminal's width): a bar, the verb, the part, what it is doing
with its counts, the elapsed time and, where counts allow, the time left. The bar follows the part's count
when it has one (the sweep's runs, fit's probes), else the inner one (updates, phases). When stderr is not
a terminal (a log, CI, a pipe) the same text as a plain line: at the start, at once at each new part,
phase or finished count (``log=True``; a child's within the 0.25 s poll), and at least every
``PILOTRUN_HEARTBEAT_S`` seconds (default 30). When the block ends, on a terminal and in a log alike, one
line says how it ended and how long it took: ``pilotrun all 4/9 overfit: ended fail (12 s)`` (the caller
sets ``cur["outcome"]`` on the object the block yields; an exception ends it ``stopped`` or ``interrupted``,
said in words: ``stopped_by``).

A process the stage starts (the resume and verify workers, the pilot's ranks) reports into it: the stage
sets ``PILOTRUN_PROGRESS_FILE`` for its children, whose ``note``/``head`` (no stage of their own) write
their latest state there as one JSON object (atomically, rank 0 only, at most every 0.2 s but always for a
``log`` note); the stage polls the file and shows the child's state after its own part.

Where the time went: a ``note``/``head`` may say what its part of the stage spends time on (``spent``: one of
``SPENT``: start-up, campaign load, data read and encode, model build and weights read, the work itself), and
``spend(kind)`` switches it without a new text. The times of those switches (a child's too: its state carries
them, on the same monotonic clock) divide the block's wall into ``SPENT``'s accounts: ``cur["spent"]`` when
the block ends (``all`` keeps it per stage: ``StageResult.spent``). A block starts on ``work``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager

from pilotrun.console.units import fmt_duration
from pilotrun.scratch import owned_name, remove_dead

_CURRENT: dict = {}  # the running stage (see stage_progress)
_CHILD: dict = {"last": 0.0, "seq": 0}  # this process's reports to a parent stage
DEFAULT_HEARTBEAT_S = 30.0
FILE_ENV = "PILOTRUN_PROGRESS_FILE"
PROGRESS_PREFIX = "pilotrun-progress-"  # the stage's file in TMPDIR, named for its owner (pilotrun.scratch)
CHILD_EVERY_S = 0.2
POLL_S = 0.25
BAR_WIDTH = 24
SPENT = ("startup", "campaign", "data", "model", "work")  # what a stage's wall time went on (see the docstring)


def _count(text: str, done, total, at_most: bool, eta_s=None, spent: str | None = None) -> dict:
    if spent is not None and spent not in SPENT:
        raise ValueError(f"spent={spent!r}: one of {', '.join(SPENT)}")
    return {"text": text, "done": done, "total": total, "at_most": at_most, "eta_s": eta_s, "t": time.monotonic(),
            "spent": spent}


def note(doing: str, *, done: int | None = None, total: int | None = None, at_most: bool = False,
         log: bool = False, spent: str | None = None) -> None:
    """Say what the running stage is doing now (``done`` of ``total`` when counted; ``at_most``: the total is a
    bound; ``spent``: what the time from here goes on, else what it went on before). A no-op when no stage is
    shown here or in a parent process."""
    _say("doing", _count(doing, done, total, at_most, spent=spent), log)


def head(part: str, *, done: int | None = None, total: int | None = None, at_most: bool = False,
         eta_s: float | None = None, spent: str = "work") -> None:
    """Start a part of the stage (``eta_s``: a time left known from elsewhere, e.g. the sweep's time plan;
    ``spent``: what the part's time goes on)."""
    _say("head", _count(part, done, total, at_most, eta_s, spent), True)


def spend(kind: str) -> None:
    """From now, the running stage's time goes on ``kind`` (one of ``SPENT``), with no new text on its line."""
    _say("spend", _count("", None, None, False, spent=kind), False)


@contextmanager
def spending(kind: str):
    """The block's time goes on ``kind``; after it, on what it went on before (data read inside a stage's work)."""
    cur = _CURRENT.get("stage")
    events = cur["events"] if cur is not None else _CHILD.get("events")
    before = events[-1][1] if events else "work"
    spend(kind)
    try:
        yield
    finally:
        spend(before)


def _switch(events: list, item: dict) -> bool:
    """Record a change of account (``[t, kind]``); True when the account changed."""
    kind = item.get("spent")
    if kind is None or (events and events[-1][1] == kind):
        return False
    events.append([item["t"], kind])
    return True


def spent_of(cur: dict, end: float | None = None) -> dict[str, float]:
    """The block's wall from its start to ``end`` (now) divided into ``SPENT``'s accounts: each interval between
    two switches (this process's and its children's, in time order) goes to the account switched to at its start."""
    end = time.monotonic() if end is None else end
    with cur["lock"]:
        events = [[cur["t0"], "work"]] + list(cur["events"])
        events += [e for evs in cur["child_events"].values() for e in evs]
    events.sort(key=lambda e: e[0])
    out = dict.fromkeys(SPENT, 0.0)
    for (t, kind), (t_next, _) in zip(events, events[1:] + [[end, None]]):
        lo, hi = max(t, cur["t0"]), min(t_next, end)
        if hi > lo and kind in out:
            out[kind] += hi - lo
    return out


def say(line: str) -> None:
    """A line that stays, on the stage's stream: above the live line on a terminal (click's own stderr would
    write past rich's and leave the line's text glued to it), between the heartbeats in a log."""
    cur = _CURRENT.get("stage")
    live = cur.get("live") if cur is not None else None
    if live is not None:
        live.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
    else:
        _line(cur["stream"] if cur is not None and cur.get("stream") is not None else sys.stderr, line)


def detach() -> None:
    """This process reports nothing more (a forked worker: probe/workers.py): no stage is shown here and no parent's
    file is written, so a lock or a file of the process it was forked from is never touched."""
    _CURRENT.clear()
    _CHILD.clear()
    _CHILD.update(last=0.0, seq=0)
    os.environ.pop(FILE_ENV, None)


def _say(level: str, item: dict, log: bool) -> None:
    log = log or (item["total"] is not None and item["done"] == item["total"])  # a finished count is a milestone
    cur = _CURRENT.get("stage")
    if cur is not None:
        if level == "head":
            _poll(cur)  # a child's last switches, before its file is forgotten
        with cur["lock"]:
            _switch(cur["events"], item)
            if level == "spend":
                return
            cur[level] = item
            if level == "head":
                cur["doing"], cur["child"] = None, None
                _forget_child(cur)
            _track(cur, level, item)
        if log:  # shown at once, however short the part: a milestone is never coalesced with the next
            if cur.get("live") is not None:
                cur["live"].refresh()
            elif cur.get("stream") is not None:
                _line(cur["stream"], text(cur))
        return
    path = os.environ.get(FILE_ENV)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    now = time.monotonic()
    switched = _switch(_CHILD.setdefault("events", []), item)  # the parent needs every switch: written at once
    if log:
        _CHILD["seq"] += 1
    elif now - _CHILD["last"] < CHILD_EVERY_S and not switched:
        return
    _CHILD["last"] = now
    if level != "spend":
        _CHILD[level] = item
    if level == "head":
        _CHILD.pop("doing", None)
    state = {k: _CHILD.get(k) for k in ("head", "doing")} | {"seq": _CHILD["seq"], "pid": os.getpid(),
                                                             "events": _CHILD["events"]}
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)
    except OSError:  # progress is not worth failing the stage for
        pass


def _forget_child(cur: dict) -> None:
    try:
        os.unlink(cur["file"])
    except (OSError, KeyError, TypeError):
        pass


def _track(cur: dict, key: str, item: dict) -> None:
    """Remember when a count series started (same text kind and total), for the time left."""
    if item["done"] is None or not item["total"]:
        return
    kind = (key, item["text"].split(" ")[0], item["total"])
    first = cur["series"].get(kind)
    if first is None or item["done"] < first[1]:
        cur["series"] = {k: v for k, v in cur["series"].items() if k[0] != key} | {kind: (item["t"], item["done"])}


def _poll(cur: dict) -> None:
    path = cur.get("file")
    if not path:
        return
    try:
        st = os.stat(path)
        if st.st_mtime_ns == cur["child_mtime"]:
            return
        state = json.loads(open(path).read())
    except (OSError, ValueError):
        return
    with cur["lock"]:
        cur["child_mtime"] = st.st_mtime_ns
        cur["child"] = state
        if state.get("events"):
            cur["child_events"][state.get("pid")] = [list(e) for e in state["events"]]
        for level in ("head", "doing"):
            if state.get(level):
                _track(cur, "child_" + level, state[level])
        if state.get("seq", 0) != cur["child_seq"]:
            cur["child_seq"] = state.get("seq", 0)
            cur["seq"] += 1


def _fmt(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else fmt_duration(seconds)  # no milliseconds on a progress line


def _counted(cur: dict) -> tuple[list[dict], dict | None]:
    """The texts shown, outer first, and the count the bar and the time left follow."""
    child = cur.get("child") or {}
    items = [cur.get("head"), cur.get("doing"), child.get("head"), child.get("doing")]
    keys = ["head", "doing", "child_head", "child_doing"]
    shown = [(k, i) for k, i in zip(keys, items) if i and i.get("text")]
    counted = [(k, i) for k, i in shown if i.get("total")]
    return [i for _, i in shown], (counted[0] if counted else None)


def _left(cur: dict, key: str, item: dict, now: float) -> str:
    if item.get("eta_s") is not None:
        left = max(item["eta_s"] - (now - item["t"]), 0.0)
    else:
        kind = (key, item["text"].split(" ")[0], item["total"])
        first = cur["series"].get(kind)
        if first is None or item["done"] is None or item["done"] <= first[1]:
            return ""
        left = (now - first[0]) / (item["done"] - first[1]) * max(item["total"] - item["done"], 0)
    return f", {'at most' if item.get('at_most') else 'about'} {_fmt(left)} left"


def text(cur: dict) -> str:
    """The progress line: ``pilotrun resume: reference run — update 6/12, loss 0.41 (12 s, about 10 s left)``."""
    now = time.monotonic()
    with cur["lock"]:
        shown, counted = _counted(cur)
        what = " — ".join(i["text"] for i in shown)
        left = _left(cur, *counted, now) if counted else ""
    # before its first head a stage is starting (opening the journal, importing torch): never a bare beat
    return f"pilotrun {cur['label']}: {what or 'starting'} ({_fmt(now - cur['t0'])}{left})"


def stopped_by(exc: BaseException) -> str:
    """How an exception ended a stage, in the user's words (never the class name: issue 43 saw
    ``ended stopped (Preempted)`` after a Ctrl-C): ``interrupted (Ctrl-C)``, ``interrupted (SIGTERM)``,
    ``stopped (bad input)``, ``stopped (disk full)``, ``stopped (internal error)``. The errors a user can see
    say their own word (``said``: errors.BadInput's kinds); a signal's stop names its signal (``signals.Preempted``)."""
    if isinstance(exc, KeyboardInterrupt):
        name = getattr(exc, "name", None)  # signals.Preempted: the signal's
        if name == "SIGINT" or type(exc) is KeyboardInterrupt:
            return "interrupted (Ctrl-C)"
        return f"interrupted ({name})" if name else "interrupted"
    if isinstance(exc, SystemExit):
        return "stopped"
    return f"stopped ({getattr(exc, 'said', None) or 'internal error'})"


def ended(cur: dict) -> str:
    """The stage's last line: how it ended and how long it took."""
    outcome = cur.get("outcome")
    return f"pilotrun {cur['label']}: ended{' ' + outcome if outcome else ''} ({_fmt(time.monotonic() - cur['t0'])})"


def fit(line: str, width: int, keep: int = 14) -> str:
    """``line`` in at most ``width`` columns on one row — a live line that wraps leaves its fragments on the screen
    when it shrinks or another process writes (issue 43, at 80 columns). Shortened with "…" from the outside in:
    the outer parts (``run 1/2: control seed 0``) to ``keep`` columns first, so the innermost counts (the update,
    the loss) and the time in brackets stay; the whole line goes to a log."""
    if len(line) <= width:
        return line
    cut = line.rfind(" (")
    tail = line[cut:] if cut > 0 else ""
    body = line[:cut] if tail else line
    label, sep, rest = body.partition(": ")
    parts = rest.split(" — ") if sep else [body]
    head = label + sep if sep else ""
    for i in range(len(parts) - 1):  # the outer parts, outermost first
        over = len(head) + len(" — ".join(parts)) + len(tail) - width
        if over <= 0:
            break
        if len(parts[i]) > keep:
            parts[i] = parts[i][:max(keep - 1, len(parts[i]) - over - 1)].rstrip() + "…"
    text = head + " — ".join(parts)
    room = width - len(tail)
    if len(text) > room:
        if room < len(head) + keep:  # too narrow to keep the time: the text first
            tail, room = "", width
        text = text[:max(room - 1, 0)].rstrip() + "…"
    return text + tail


class _Line:
    """The live renderable: a bar (pulsing without a count) and the text, on one row of the terminal's width:
    the bar only where the whole text fits beside it, else the text alone, shortened to fit (``fit``), never
    wrapped."""

    def __init__(self, cur: dict):
        self.cur = cur

    def __rich_console__(self, console, options):
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        _poll(self.cur)
        with self.cur["lock"]:
            _, counted = _counted(self.cur)
        width = options.max_width
        line = text(self.cur)
        if width < 60 or len(line) > width - BAR_WIDTH - 1:  # the text before the bar when both do not fit
            yield Text(fit(line, width), no_wrap=True, overflow="ellipsis")
            return
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=BAR_WIDTH, no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        item = counted[1] if counted else {}
        bar = ProgressBar(total=item.get("total"), completed=item.get("done") or 0, width=BAR_WIDTH)
        grid.add_row(bar, Text(line, no_wrap=True, overflow="ellipsis"))
        yield grid


def heartbeat_s() -> float:
    try:
        return max(float(os.environ.get("PILOTRUN_HEARTBEAT_S", DEFAULT_HEARTBEAT_S)), 0.05)
    except ValueError:
        return DEFAULT_HEARTBEAT_S


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def stage_progress(label: str, *, stream=None):
    """Show the stage ``label`` until the block ends (see the module docstring)."""
    import tempfile

    stream = stream or sys.stderr
    outer = _CURRENT.get("stage")
    if outer is not None:  # a stage inside a stage: the outer one shows it
        yield outer
        return
    remove_dead(PROGRESS_PREFIX)  # what killed stages left in TMPDIR
    path = os.path.join(tempfile.gettempdir(), owned_name(PROGRESS_PREFIX))
    cur = {"label": label, "t0": time.monotonic(), "head": None, "doing": None, "child": None, "seq": 0,
           "child_seq": 0, "child_mtime": None, "series": {}, "file": path, "lock": threading.Lock(),
           "events": [], "child_events": {}, "spent": None}
    before = os.environ.get(FILE_ENV)
    os.environ[FILE_ENV] = path
    _CURRENT["stage"] = cur
    stop = threading.Event()
    thread = live = None
    try:
        if _is_tty(stream):
            from rich.console import Console
            from rich.live import Live

            live = Live(_Line(cur), console=Console(file=stream), refresh_per_second=4, transient=True,
                        redirect_stdout=False, redirect_stderr=True)
            live.start()
            cur["live"] = live
        else:
            _line(stream, f"pilotrun {label}: started")
            cur["stream"] = stream
            thread = threading.Thread(target=_beat, args=(cur, stream, stop), name="pilotrun-progress", daemon=True)
            thread.start()
        try:
            yield cur
        except BaseException as e:
            cur.setdefault("outcome", stopped_by(e))
            raise
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=1.0)
        _poll(cur)
        cur["spent"] = spent_of(cur)
        cur["live"] = cur["stream"] = None
        if live is not None:
            live.stop()
        _line(stream, ended(cur))
        _CURRENT.pop("stage", None)
        if before is None:
            os.environ.pop(FILE_ENV, None)
        else:
            os.environ[FILE_ENV] = before
        _forget_child(cur)


def _beat(cur: dict, stream, stop: threading.Event) -> None:
    """A plain line at each new part or phase (own or a child's), and every heartbeat in between."""
    every = heartbeat_s()
    last_t, last_seq = time.monotonic(), cur["seq"]
    while True:
        stopped = stop.wait(min(POLL_S, every))
        _poll(cur)
        now = time.monotonic()
        if cur["seq"] != last_seq or (now - last_t >= every and not stopped):
            last_t, last_seq = now, cur["seq"]
            _line(stream, text(cur))
        if stopped:
            return


_WRITE = threading.Lock()


def log_width(stream) -> int | None:
    """The width a log's lines are wrapped at: ``PILOTRUN_WIDTH``, else ``COLUMNS`` — as the verbs' own output
    (cli/common.output_width) — and None (never wrapped) with neither set or on a terminal."""
    if _is_tty(stream):
        return None
    for key in ("PILOTRUN_WIDTH", "COLUMNS"):
        value = os.environ.get(key, "").strip()
        if value.isdigit() and int(value) >= 40:
            return int(value)
    return None


def wrapped(line: str, width: int | None) -> str:
    """A log line at ``width``: its words under a 4-column hanging indent, so each progress line still starts
    with ``pilotrun VERB`` (issue 43: 179 of `all`'s 280 lines were wider than the 80 columns the log was read at)."""
    if width is None or len(line) <= width:
        return line
    import textwrap

    return "\n".join(textwrap.wrap(line, width, subsequent_indent="    ", break_long_words=False,
                                    break_on_hyphens=False))


def _line(stream, line: str) -> None:
    line = wrapped(line, log_width(stream))
    try:
        with _WRITE:
            stream.write(line + "\n")
            stream.flush()
    except (OSError, ValueError):  # the log went away: progress is not worth failing the stage for
        pass
