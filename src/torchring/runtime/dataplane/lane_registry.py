"""The gradient lanes of one initialisation: their process groups, the lanes themselves, their CPU time.

One ``LaneRegistry`` belongs to each ``Runtime``. ``DistributedOptimizer`` opens its lane through it
(collectively: every member opens lanes at the same point, in the same order, which the lane vote
ensures), ``join()`` asks it for the lanes to shadow, and ``shutdown()`` releases their groups. A
re-initialisation creates a new runtime and so a new registry: lanes of the old one are never used
again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...exceptions import HorovodInternalError
from ...rank_failure import caused_by_peer
from ..coordination.deadlock import DeadlockWatch
from ..observe.flight_recorder import NULL_RECORDER, Recorder
from .buckets import Bucket
from .data_groups import DataGroups
from .lane import GradientLane, LaneSettings

#: Opens the data groups of a lane: (store prefix, process set id) -> groups over the set's members.
GroupOpener = Callable[[str, int], DataGroups]


class LaneRegistry:
    """Every lane opened since ``init()``, in opening order, and the groups they reduce on."""

    def __init__(self, prefix: str, open_groups: GroupOpener, timeline: Callable[[], Any],
                 recorder: Recorder = NULL_RECORDER,
                 report_peer_failure: Callable[[str], None] | None = None,
                 deadlocks: DeadlockWatch | None = None) -> None:
        self._prefix = prefix
        #: The engine's deadlock watch, told when a lane's step waits a while.
        self._deadlocks = deadlocks
        #: Tells the launcher that a lane's reduction failed because of another rank.
        self._report_peer_failure = report_peer_failure
        #: Names the host and ranks behind the addresses in a lane's failure (set by ``init()``).
        self.name_peers: Callable[[str], str] | None = None
        self._open_groups = open_groups
        self._timeline = timeline
        #: The runtime's flight recorder, which the lanes tell about their allreduces.
        self._recorder = recorder
        self._lock = threading.Lock()
        self._opened_per_set: dict[int, int] = {}
        self._groups: list[DataGroups] = []
        self._lanes: list[GradientLane] = []
        #: CPU seconds the lanes spent: [everything, of which packing, unpacking and copies].
        self._cpu_seconds = [0.0, 0.0]

    def open_lane(self, process_set: int, buckets: Sequence[Bucket], names: Sequence[str],
                  settings: LaneSettings) -> GradientLane:
        """A new lane over ``process_set``'s members, on groups of its own. Collective."""
        with self._lock:
            serial = self._opened_per_set.get(process_set, 0)
            self._opened_per_set[process_set] = serial + 1
        try:
            groups = self._open_groups(f"{self._prefix}/lane{process_set}.{serial}", process_set)
        except RuntimeError as error:  # torch.distributed's errors are RuntimeErrors
            if not caused_by_peer(error):
                raise
            # a member lost between the lane vote and the groups' connections: recoverable like any lost
            # peer (an elastic job rolls back and re-forms)
            raise HorovodInternalError(f"the gradient lane's groups could not form, another rank probably stopped: "
                                       f"{str(error).strip()[:300]}") from error
        lane = GradientLane(buckets, names, groups, settings, self._timeline, self._add_cpu_seconds, self._recorder,
                            self._report_peer_failure, self._deadlocks)
        lane.name_peers = self.name_peers
        with self._lock:
            self._groups.append(groups)
            self._lanes.append(lane)
        return lane

    def any_open(self) -> bool:
        """Whether a lane is open (``join()`` then orders its zeros after its own join's cycle)."""
        with self._lock:
            return bool(self._lanes)

    def shadow_all(self) -> None:
        """For ``join()``: take part with zeros in every open lane until all ranks have joined. Lanes
        run concurrently, each on its own group, since training ranks step their optimizers in any order."""
        with self._lock:
            lanes = list(self._lanes)
        if len(lanes) <= 1:
            for lane in lanes:
                lane.shadow_until_all_joined()
            return
        errors: list[BaseException] = []

        def shadow(lane: GradientLane) -> None:
            try:
                lane.shadow_until_all_joined()
            except BaseException as error:  # noqa: BLE001 - re-raised in the joining thread
                errors.append(error)

        threads = [threading.Thread(target=shadow, args=(lane,), name="torchring-join-lane", daemon=True)
                   for lane in lanes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU time the lanes spent so far: bookkeeping and launching, and packing, unpacking and copies
        (the copies a DDP reducer makes too)."""
        total, copies = self._cpu_seconds
        return total - copies, copies

    def shutdown(self) -> None:
        """Release every lane's groups (``shutdown()``)."""
        with self._lock:
            groups, self._groups, self._lanes = self._groups, [], []
        for group in groups:
            group.shutdown()

    def _add_cpu_seconds(self, total: float, copies: float) -> None:
        self._cpu_seconds[0] += total
        self._cpu_seconds[1] += copies
