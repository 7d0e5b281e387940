"""The Monitor interface, delivery accounting, and a fan-out that never raises into the caller."""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import anyio

from .errors import MonitorError
from .records import Kind, Subset

__all__ = ["START_FAILED", "DeliveryStats", "Monitor", "Monitors", "finite_metrics"]

log = logging.getLogger("monitors")

#: The reason every record given to a monitor whose ``start`` failed is lost under.
START_FAILED = "start_failed"

_M = TypeVar("_M", bound="Monitor")


@dataclass(frozen=True)
class DeliveryStats:
    """What happened to the records a monitor was given.

    ``submitted == delivered + sum(lost.values()) + pending`` at every moment; after
    ``finalize`` nothing is pending. Nothing is lost silently (docs/design.md D8).

    :param submitted: Records the monitor was given.
    :param delivered: Records that reached their destination.
    :param lost: Records lost, by reason (``queue_full``, ``encode_error``, ...).
    :param degraded: What went wrong without losing a record, by kind (``seal_failed``:
        chunks left plain because sealing them failed, a full disk say; they stay
        readable). Left out of the repr while empty.
    """

    submitted: int = 0
    delivered: int = 0
    lost: Mapping[str, int] = field(default_factory=dict)
    degraded: Mapping[str, int] = field(default_factory=dict)

    @property
    def lost_total(self) -> int:
        """Records lost, whatever the reason."""
        return sum(self.lost.values())

    @property
    def pending(self) -> int:
        """Records neither delivered nor lost yet."""
        return self.submitted - self.delivered - self.lost_total

    def __add__(self, other: DeliveryStats) -> DeliveryStats:
        lost = Counter(self.lost)
        lost.update(other.lost)
        degraded = Counter(self.degraded)
        degraded.update(other.degraded)
        return DeliveryStats(
            self.submitted + other.submitted,
            self.delivered + other.delivered,
            dict(lost),
            dict(degraded),
        )

    def __repr__(self) -> str:
        # ``degraded`` only when something was: the usual repr stays as it always read.
        text = (
            f"DeliveryStats(submitted={self.submitted!r}, delivered={self.delivered!r}, "
            f"lost={self.lost!r}"
        )
        return text + (f", degraded={self.degraded!r})" if self.degraded else ")")


class Ledger:
    """The mutable counts behind ``DeliveryStats`` (one per monitor)."""

    __slots__ = ("delivered", "lost", "submitted")

    def __init__(self) -> None:
        self.submitted = 0
        self.delivered = 0
        self.lost: Counter[str] = Counter()

    def snapshot(self, *, degraded: Mapping[str, int] | None = None) -> DeliveryStats:
        """The counts now, with ``degraded`` (which the monitor counts where it happens)."""
        return DeliveryStats(self.submitted, self.delivered, dict(self.lost), dict(degraded or {}))

    @property
    def pending(self) -> int:
        """Records neither delivered nor lost yet."""
        return self.submitted - self.delivered - sum(self.lost.values())

    def refuse(self, count: int, reason: str) -> None:
        """Count ``count`` records as submitted and lost at once, under ``reason``."""
        self.submitted += count
        self.lost[reason] += count

    def take(self, count: int, *, unless: str | None = None) -> bool:
        """Count ``count`` records as submitted; when ``unless`` names why they cannot be
        taken (``START_FAILED``, ...), they are lost under it at once and this is False."""
        if unless is not None:
            self.refuse(count, unless)
            return False
        self.submitted += count
        return True


class Monitor(ABC):
    """Where a training run's metrics and episodes go. Use as ``async with``: entering
    starts it, leaving finalizes it.

    A monitor whose ``start`` raised keeps the error in ``start_error``, and from then on
    counts every episode and metrics record it is given as lost under ``start_failed``
    (``Monitors`` goes on logging to it), and says how many at ``finalize`` (docs/design.md
    D8).
    """

    #: Why ``start`` failed, or None.
    start_error: BaseException | None = None

    async def start(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Open files, sessions and background work."""

    def metrics_stats(self) -> DeliveryStats:
        """Metrics records (one per ``log_metrics`` call): submitted, delivered, lost."""
        return DeliveryStats()

    def annotation_stats(self) -> DeliveryStats:
        """Updates given to ``log_annotations``: submitted, delivered, lost (none counted by
        a monitor that keeps no trace files: it ignores them)."""
        return DeliveryStats()

    @contextmanager
    def _keeping_start_error(self) -> Iterator[None]:
        """Around ``start``'s work: what it raises is kept in ``start_error``, and raised."""
        try:
            yield
        except BaseException as exc:
            self.start_error = exc
            raise

    def _report_start_failure(self, **lost: int) -> None:
        """At ``finalize`` of a monitor whose start failed: one warning naming the cause and
        what was lost because of it (``lost``: a count by what was lost)."""
        counts = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in lost.items())
        log.warning(
            "%s never started (%s): %s lost as '%s'",
            type(self).__name__,
            describe(self.start_error),
            counts,
            START_FAILED,
        )

    @abstractmethod
    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Record one step's scalar metrics.

        :param metrics: Metric names and their values.
        :param step: The training step they belong to.
        """

    @abstractmethod
    async def log_episodes(
        self,
        episodes: Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        """Record episodes: verifiers episodes, pydantic models, objects with ``to_record()``,
        or Mappings (``monitors.records.Records``), each turned into its record only when it
        is encoded.

        :param episodes: The episodes, in the order they are to be stored.
        :param step: The training step they belong to.
        :param kind: ``"train"`` or ``"eval"``.
        :param subset: ``"all"``, every episode; or ``"effective"``, the cohort a step ships
            (a trace file records it as annotations on the episodes, not a second copy).
        """

    async def log_annotations(  # noqa: B027 - optional: monitors without traces ignore them
        self, updates: Iterable[Mapping[str, Any]], *, step: int | None = None
    ) -> None:
        """Record trace updates, facts learnt about logged traces later (prime-rl's
        ``make_update``: ``{"version", "trace_id", "info", "branches"}``). Monitors that keep
        no trace files ignore them.

        :param updates: The updates, in order.
        :param step: The training step, if any.
        """

    async def log(
        self,
        data: Mapping[str, Any] | Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        """``log_metrics`` for a Mapping, ``log_episodes`` for anything else.

        :param data: A step's metrics, or its episodes.
        :param step: The training step they belong to.
        :param kind: For episodes: ``"train"`` or ``"eval"``.
        :param subset: For episodes: ``"all"`` or ``"effective"``.
        """
        if isinstance(data, Mapping):
            await self.log_metrics(data, step=step)
        else:
            await self.log_episodes(data, step=step, kind=kind, subset=subset)

    @abstractmethod
    async def finalize(self) -> None:
        """Deliver what is pending, close everything; calling it again does nothing."""

    @abstractmethod
    def stats(self) -> DeliveryStats:
        """Records submitted, delivered, and lost by reason, so far."""

    async def __aenter__(self: _M) -> _M:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.finalize()


def describe(error: BaseException | None) -> str:
    """An error in one line: its type and message."""
    if error is None:
        return "no error"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class Monitors(Monitor):
    """Logs to every monitor at once; a monitor that fails is logged (with its traceback)
    and counted in ``failures``, never raised into the caller. A monitor's ``MonitorError``
    (a start that failed: a missing key, a path that cannot be written, a missing package)
    is logged as one line, without a traceback: it says all there is to say.

    ``start`` and ``finalize`` call the monitors one after the other in the caller's task,
    ``finalize`` in reverse order, as the task groups some monitors open in ``start`` require.

    :param monitors: The monitors to log to, started in this order.
    """

    def __init__(self, *monitors: Monitor) -> None:
        self.monitors = list(monitors)
        self.failures: Counter[str] = Counter()
        self._finalized = False

    async def _each(
        self, what: str, call: str, *args: Any, in_turn: bool = False, **kwargs: Any
    ) -> None:
        """``call`` on every monitor: concurrently, or ``in_turn`` in this task (in reverse
        order for ``finalize``)."""

        async def one(monitor: Monitor) -> None:
            try:
                await getattr(monitor, call)(*args, **kwargs)
            except Exception as exc:
                name = type(monitor).__name__
                self.failures[name] += 1
                happened = (
                    f"{name} did not start ({describe(exc)}); what it is given is counted "
                    f"lost as '{START_FAILED}'"
                    if call == "start"
                    else f"{name}.{call} failed during {what} ({describe(exc)})"
                )
                log.warning("%s", happened, exc_info=not isinstance(exc, MonitorError))

        if in_turn:
            order = reversed(self.monitors) if call == "finalize" else self.monitors
            for monitor in order:
                await one(monitor)
            return
        async with anyio.create_task_group() as group:
            for monitor in self.monitors:
                group.start_soon(one, monitor)

    async def start(self) -> None:
        await self._each("start", "start", in_turn=True)

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        await self._each(f"step {step}", "log_metrics", metrics, step=step)

    async def log_episodes(
        self,
        episodes: Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        batch = list(episodes)  # every monitor sees the same episodes
        await self._each(f"step {step}", "log_episodes", batch, step=step, kind=kind, subset=subset)

    async def log_annotations(
        self, updates: Iterable[Mapping[str, Any]], *, step: int | None = None
    ) -> None:
        batch = list(updates)  # every monitor sees the same updates
        await self._each("annotations", "log_annotations", batch, step=step)

    async def finalize(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        await self._each("finalize", "finalize", in_turn=True)

    def stats(self) -> DeliveryStats:
        total = DeliveryStats()
        for monitor in self.monitors:
            total = total + monitor.stats()
        return total

    def metrics_stats(self) -> DeliveryStats:
        total = DeliveryStats()
        for monitor in self.monitors:
            total = total + monitor.metrics_stats()
        return total

    def annotation_stats(self) -> DeliveryStats:
        total = DeliveryStats()
        for monitor in self.monitors:
            total = total + monitor.annotation_stats()
        return total

    def stats_by_monitor(self) -> dict[str, DeliveryStats]:
        """Each monitor's own ``stats()``, by class name."""
        return {type(m).__name__: m.stats() for m in self.monitors}

    def metrics_stats_by_monitor(self) -> dict[str, DeliveryStats]:
        """Each monitor's own ``metrics_stats()``, by class name."""
        return {type(m).__name__: m.metrics_stats() for m in self.monitors}


def finite_metrics(metrics: Mapping[str, Any], *, step: int) -> dict[str, Any]:
    """The metrics without NaN and infinities; a warning names every key dropped.

    :param metrics: Metric names and their values.
    :param step: The step, named in the warning.
    :returns: The finite metrics, keys as ``str``.
    """
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in metrics.items():
        try:
            finite = isinstance(value, bool) or math.isfinite(value)
        except (TypeError, ValueError, OverflowError):
            finite = True  # not a number (or an int beyond float): the encoder decides
        if finite:
            kept[str(key)] = value
        else:
            dropped.append(str(key))
    if dropped:
        log.warning("step %d: dropped non-finite metrics: %s", step, ", ".join(dropped))
    return kept
