"""The live policy of a running agent, swapped atomically on reload."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from gateway.errors import PolicyFileError
from policies.policy_file import Policy, load_policy

_log = logging.getLogger(__name__)


class PolicyStore:
    """Holds the current ``Policy``; ``reload()`` swaps in a new valid file.

    An invalid file never replaces the current policy: the error is logged and
    returned, and the old policy stays in force.

    Attributes:
        reloads_ok: Reloads that swapped in a new policy.
        reloads_rejected: Reloads whose file was refused (old policy kept).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._loading = threading.Lock()  # one load at a time: the watcher's thread, SIGHUP
        self._stamp = self._file_stamp()  # before reading: a change while it is read is seen
        self._policy = load_policy(path)
        self.reloads_ok = 0
        self.reloads_rejected = 0

    def has_live_grant(self, now: datetime | None = None) -> bool:
        """False when the policy in force grants something but every grant has expired.

        Such a policy refuses every inbound call (``GRANT_EXPIRED``): the agent
        has no valid policy to serve under. A policy without grants (an agent
        that only calls out) counts as live.
        """
        grants = self._policy.grants.values()
        moment = now or datetime.now(UTC)
        return not grants or any(grant.expires_at > moment for grant in grants)

    @property
    def current(self) -> Policy:
        """The policy in force."""
        return self._policy

    @property
    def path(self) -> Path:
        """The policy file."""
        return self._path

    def reload(self) -> PolicyFileError | None:
        """Re-read the file; returns the error if it was rejected, else None.

        Loads are serialised, so the last one to finish read the file last.
        """
        with self._loading:
            return self._reload()

    def _reload(self) -> PolicyFileError | None:
        self._stamp = self._file_stamp()
        try:
            policy = load_policy(self._path)
        except PolicyFileError as err:
            self.reloads_rejected += 1
            _log.error(
                "policy reload rejected, keeping the previous policy: %s",
                err.message,
                extra={"reason": err.reason},
            )
            return err
        self.reloads_ok += 1
        self._policy = policy  # one reference assignment: callers see old or new, never a mix
        _log.info("policy reloaded from %s (%d grants)", self._path, len(policy.grants))
        return None

    def reload_if_changed(self) -> PolicyFileError | None:
        """Reload when the file's identity, size or mtime changed."""
        with self._loading:
            if self._file_stamp() == self._stamp:
                return None
            return self._reload()

    async def watch(self, interval: float = 1.0) -> None:
        """Poll the file and reload a change once it has settled, until cancelled.

        A change is taken at the first poll that finds the file as the poll
        before found it: a file being rewritten in place is never read half
        written, so long as its writer pauses less than ``interval`` between
        writes. A file cut short at a grant's end is valid TOML with that
        grant's later restrictions (``max_risk``, limits) missing, and would
        allow what the whole file refuses.

        The file is read and checked on a worker thread: a large policy (tens
        of thousands of grants take seconds) must not hold the event loop, and
        calls go on under the policy in force until the new one is swapped in.
        """
        seen = self._file_stamp()
        while True:
            await asyncio.sleep(interval)
            stamp = self._file_stamp()
            if stamp != seen:  # still changing (or just changed): look again next time
                seen = stamp
                continue
            try:
                await asyncio.to_thread(self.reload_if_changed)
            except Exception:  # never let one bad file stop all future reloads
                _log.exception("policy reload failed; keeping the previous policy")

    def _file_stamp(self) -> tuple[int, int, int, int] | None:
        try:
            info = os.stat(self._path)
        except OSError:
            return None
        return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
