"""What a gateway or worker process works with: settings, job table, store (and, in the
gateway, the queue)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stitchsim_service.core.db import Database, get_database
from stitchsim_service.core.settings import Settings
from stitchsim_service.core.store import Store, open_store

if TYPE_CHECKING:
    from stitchsim_service.core.queue import JobQueue


@dataclass
class Context:
    settings: Settings
    db: Database
    store: Store
    queue: JobQueue | None = None

    @classmethod
    def open(cls, settings: Settings, *, with_queue: bool = False) -> Context:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        queue = None
        if with_queue:
            from stitchsim_service.core.queue import JobQueue

            queue = JobQueue(settings)
        return cls(
            settings=settings,
            db=get_database(settings.resolved_database_url),
            store=open_store(settings.resolved_store_url),
            queue=queue,
        )
