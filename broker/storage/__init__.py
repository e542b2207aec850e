"""The data directory on disk: disk queues by name, the metadata file, the directory lock."""

from broker.storage.datadir import DataDirectory, DataPathLocked
from broker.storage.metadata import MetadataFile
from broker.storage.queuestore import QueueStore

__all__ = ["DataDirectory", "DataPathLocked", "MetadataFile", "QueueStore"]
