"""The embedded broker: kombu's file-system transport, with each message made whole before
it can be seen.

kombu's ``filesystem`` transport creates a message's file in the folder the consumer scans
and then writes into it. A consumer that lists the folder in between takes the file while it
is still empty (a rename is not stopped by the writer's lock) and fails to decode it; the
worker stops with "Unrecoverable error: JSONDecodeError" (seen in the demo, with beat in the
worker sending while the worker reads; kombu issue 1551 reports the error). Here a message is
written under a staging folder beside the queue's and renamed into the queue's folder once
complete: a rename within one file system is atomic, so a consumer sees the whole message or
nothing. Selected by ``CELERY_BROKER_TRANSPORT`` when the broker URL is ``filesystem://``.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic_ns

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    @property
    def staging_folder(self) -> str:
        return self.transport_options.get("staging_folder") or os.path.join(
            os.path.dirname(os.path.abspath(self.data_folder_out)), "staging"
        )

    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` on ``queue``: written in full under the staging folder, then moved
        into the queue's folder in one rename. The consumer takes files in name order, so a
        name starts with the machine's monotonic clock in nanoseconds (kombu's, in
        milliseconds, leaves messages of the same millisecond in random order)."""
        name = f"{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        staged = os.path.join(self.staging_folder, name)
        try:
            os.makedirs(self.staging_folder, exist_ok=True)
            with open(staged, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(staged, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
